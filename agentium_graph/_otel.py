"""OpenTelemetry spans through the API only: a no-op until the host configures an SDK."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

_tracer = trace.get_tracer("agentium_graph")

AttrValue = str | int | float | bool


_UNKNOWN = object()
# With this variable set, the first get_tracer_provider() call loads that provider.
_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _configured() -> bool:
    """Whether a host has set a tracer provider. ``get_tracer_provider()`` reads the
    environment on every call until one is set (about 2 us, paid per node), so the API's
    module global is read first; the public call decides when that global is absent."""
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _FROM_ENVIRONMENT:
        return False
    if provider is None or provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider)


def span(name: str, attributes: Mapping[str, AttrValue]) -> AbstractContextManager[Any]:
    """A span named ``name``; skipped entirely while no tracer provider is configured, so
    the per-node path pays nothing for observability nobody collects."""
    if not _configured():
        return nullcontext()
    return _tracer.start_as_current_span(name, attributes=dict(attributes))
