"""OpenTelemetry spans through the API only: a no-op until the host configures an SDK."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

_tracer = trace.get_tracer("agentium_graph")

AttrValue = str | int | float | bool


def span(name: str, attributes: Mapping[str, AttrValue]) -> AbstractContextManager[Any]:
    """A span named ``name``; skipped entirely while no tracer provider is configured, so
    the per-node path pays nothing for observability nobody collects."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return nullcontext()
    return _tracer.start_as_current_span(name, attributes=dict(attributes))
