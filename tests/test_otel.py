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
        self.attributes = dict(attributes)
        sink.append((name, self.attributes))

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_status(self, status: Any) -> None:
        self.status = status

    def record_exception(self, exception: BaseException) -> None:
        self.exception = exception

    def __enter__(self) -> _Span:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Started:
    """A span started by start_span: its attributes are recorded when it ends."""

    def __init__(self, sink: list[tuple[str, dict[str, Any]]], name: str,
                 attributes: dict[str, Any]) -> None:
        self.sink, self.name, self.attributes = sink, name, dict(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def end(self) -> None:
        self.sink.append((self.name, self.attributes))


class _Tracer:
    def __init__(self, sink: list[tuple[str, dict[str, Any]]]) -> None:
        self.sink = sink

    def start_as_current_span(self, name: str, attributes: dict[str, Any]) -> _Span:
        return _Span(self.sink, name, attributes)

    def start_span(self, name: str, attributes: dict[str, Any]) -> _Started:
        return _Started(self.sink, name, attributes)


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


async def test_store_operations_run_in_spans(
        recorded: list[tuple[str, dict[str, Any]]], calls: Calls, tmp_path: Any) -> None:
    from agentium_graph_sqlite import SQLiteDurableTaskStore

    async with SQLiteDurableTaskStore(tmp_path / "t.db") as store:
        rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
        await rt.create("s", program(chain_plan(2)))
        await rt.run("s", "w1")
        await rt.inspect("s")
    ops = [(n, a) for n, a in recorded if n.startswith("agentium_graph.store.")]
    names = {n for n, _ in ops}
    assert {"agentium_graph.store.create_task", "agentium_graph.store.commit",
            "agentium_graph.store.get_task"} <= names
    assert all(a["agentium.store"] == "sqlite" and a.get("agentium.task.key") == "s"
               for n, a in ops if n != "agentium_graph.store.get_blobs")


async def test_a_queued_node_records_its_admission_wait(
        recorded: list[tuple[str, dict[str, Any]]], calls: Calls) -> None:
    from agentium_graph import RootLimits

    wide = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": f"n{i}", "binding": "inc", "version": "1", "args": {"x": i}} for i in range(3)]}
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls),
                               limits=RootLimits(max_concurrent_work=1))
    await rt.create("q", program(wide))
    await rt.run("q", "w1")
    waits = [a for n, a in recorded if n == "agentium_graph.admission.wait"]
    assert len(waits) == 2  # one permit: two of the three nodes waited for it
    assert all(a["agentium.task.key"] == "q" and a["agentium.admission.outcome"] == "admitted"
               for a in waits)
    assert sorted(a["agentium.node.id"] for a in waits) == ["n1", "n2"]
