"""Spans are emitted through the OpenTelemetry API once a provider is configured."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace

from agentium_graph import ExecutionGraphRuntime
from agentium_graph._otel import span
from tests.conftest import Calls, chain_plan, make_catalog, program


class _Span:
    def __init__(self, sink: list[tuple[str, dict[str, Any]]], name: str,
                 attributes: dict[str, Any]) -> None:
        sink.append((name, dict(attributes)))

    def __enter__(self) -> _Span:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Tracer:
    def __init__(self, sink: list[tuple[str, dict[str, Any]]]) -> None:
        self.sink = sink

    def start_as_current_span(self, name: str, attributes: dict[str, Any]) -> _Span:
        return _Span(self.sink, name, attributes)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    sink: list[tuple[str, dict[str, Any]]] = []
    provider = object()  # any configured (non-proxy) provider
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr("agentium_graph._otel._tracer", _Tracer(sink))
    yield sink


def test_span_is_a_no_op_without_a_provider() -> None:
    with span("x", {"a": 1}) as value:
        assert value is None


def test_a_provider_named_in_the_environment_is_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # OTEL_PYTHON_TRACER_PROVIDER makes get_tracer_provider() load a provider on first use,
    # so the shortcut on the unset global must not skip that call.
    sink: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr("agentium_graph._otel._FROM_ENVIRONMENT", True)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: object())
    monkeypatch.setattr("agentium_graph._otel._tracer", _Tracer(sink))
    with span("x", {"a": 1}):
        pass
    assert sink == [("x", {"a": 1})]


async def test_run_and_node_attempt_spans_carry_stable_attributes(
        recorded: list[tuple[str, dict[str, Any]]], calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    await rt.create("o", program(chain_plan(2)))
    await rt.run("o", "w1")
    names = [n for n, _ in recorded]
    assert names.count("agentium_graph.task.run") == 1
    assert names.count("agentium_graph.node.attempt") == 2
    run_attrs = dict(recorded)["agentium_graph.task.run"]
    assert run_attrs == {"agentium.task.key": "o", "agentium.worker.id": "w1",
                         "agentium.fence": 1}
