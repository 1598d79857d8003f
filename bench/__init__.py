"""Benchmarks of agentium-graph: ``python bench/run.py --help``. Not part of the SDK."""
