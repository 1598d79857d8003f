"""OpenTelemetry spans through the API only: a no-op until the host configures an SDK."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace

_tracer = trace.get_tracer("agentium_graph")

AttrValue = str | int | float | bool


@contextmanager
def span(name: str, attributes: Mapping[str, AttrValue]) -> Iterator[None]:
    with _tracer.start_as_current_span(name, attributes=dict(attributes)):
        yield
