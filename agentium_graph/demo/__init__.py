"""The provider-free demo: an order pipeline, crashed with SIGKILL and recovered."""

from agentium_graph.demo.pipeline import build_catalog, build_program

__all__ = ["build_catalog", "build_program"]
