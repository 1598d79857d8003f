"""Found by review 22's outside check, written as an SDK consumer reading SPEC.md would.
Each test failed before its fix, but the MongoDB URI option one: it pins that the check
moved out of the core (which must not import pymongo) still refuses what it refused."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from agentium_graph import (
    ActionOutcome,
    AdmissionEvent,
    AgentBinding,
    ConfigurationError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    GraphBinding,
    HostCatalog,
    InMemoryDurableTaskStore,
    ResolutionConflictError,
    ToolBinding,
)
from tests.conftest import INT_OUT, Calls, chain_plan, make_catalog, program
from tests.test_effects import PLAN, CountingStore, Destination, FakeConnector, runtime

ROOT = Path(__file__).resolve().parent.parent / "agentium_graph"


# --- SPEC 3: cancel(key, reason="...") -------------------------------------------------------

async def test_cancel_without_a_reason_records_the_default_one() -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=InMemoryDurableTaskStore())
    await rt.create("k", program(chain_plan(2)))
    view = await rt.cancel("k")  # a TypeError before
    assert view.status == "canceled" and view.cancel is not None
    assert view.cancel.reason == "canceled by the host"
    with pytest.raises(ConfigurationError):
        await rt.cancel("k", reason="  ")  # an explicit blank reason is still refused


def test_cancel_sync_without_a_reason() -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=InMemoryDurableTaskStore())
    rt.create_sync("k", program(chain_plan(2)))
    assert rt.cancel_sync("k").status == "canceled"


# --- SPEC 2: the core never imports pymongo --------------------------------------------------

def test_no_module_of_the_core_imports_pymongo() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n == "pymongo" or n.startswith("pymongo.")]
    assert found == []


def test_a_bad_mongodb_uri_option_is_still_refused_with_a_database_given() -> None:
    pytest.importorskip("agentium_graph_mongodb")
    from agentium_graph._store_uri import parse_store_uri

    for option in ("bogusOption=1", "serverSelectionTimeoutMS=abc"):
        with pytest.raises(ConfigurationError) as info:
            parse_store_uri(f"mongodb://127.0.0.1:1/?{option}", database="x")
        assert option.partition("=")[0] in str(info.value)


# --- SPEC 7: MongoDBDurableTaskStore(client or uri, database=...) ------------------------------

def test_the_mongodb_store_takes_uri_and_client_keywords() -> None:
    mongodb = pytest.importorskip("agentium_graph_mongodb")
    from pymongo import AsyncMongoClient

    store = mongodb.MongoDBDurableTaskStore(uri="mongodb://127.0.0.1:1/orders")
    assert store.database_name == "orders"
    client: Any = AsyncMongoClient("mongodb://127.0.0.1:1/", connect=False)
    assert mongodb.MongoDBDurableTaskStore(client=client, database="d").database_name == "d"
    for kwargs in ({}, {"uri": "mongodb://h/", "client": client}, {"uri": 3},
                   {"client": "mongodb://h/"}):
        with pytest.raises(ConfigurationError):
            mongodb.MongoDBDurableTaskStore(**kwargs)
    with pytest.raises(ConfigurationError):
        mongodb.MongoDBDurableTaskStore("mongodb://h/", uri="mongodb://h/")


# --- positional arguments are a typed error naming the public class -------------------------

@pytest.mark.parametrize("build", [
    lambda: ToolBinding("t", "1", execute=len, recovery="pure"),
    lambda: ExecutionGraphProgram("p", "1", plan=chain_plan(1)),
    lambda: AgentBinding("a"),
], ids=["ToolBinding", "ExecutionGraphProgram", "AgentBinding"])
def test_positional_arguments_name_the_class_and_its_keywords(build: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        build()
    assert "keyword arguments only" in str(info.value) and "_Binding" not in str(info.value)


# --- SPEC 6: a program is immutable, also its plan dict ------------------------------------

def _inner() -> ExecutionGraphProgram:
    return ExecutionGraphProgram(id="inner", version="1", plan=chain_plan(1))


async def test_a_nested_plan_changed_in_place_is_refused_not_run() -> None:
    calls = Calls()
    inner = _inner()
    rt = ExecutionGraphRuntime(catalog=_catalog_with(inner, calls),
                               store=InMemoryDurableTaskStore())
    outer = program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "g", "binding": "sub", "version": "1", "args": {}}]})
    await rt.create("k", outer)
    inner.plan["nodes"][0]["args"]["x"] = 41  # type: ignore[index]
    with pytest.raises(ConfigurationError) as info:
        await rt.run("k")
    assert "changed in place" in str(info.value) and "'inner'" in str(info.value)
    assert calls.order == []  # nothing the pinned descriptor does not describe ran


def _catalog_with(inner: ExecutionGraphProgram, calls: Calls) -> HostCatalog:
    async def inc(args: dict[str, Any]) -> dict[str, Any]:
        calls.hit()
        return {"value": args["x"] + 1}

    return HostCatalog([
        ToolBinding(id="inc", version="1", execute=inc, recovery="pure",
                    input_schema={"type": "object", "properties": {"x": {"type": "integer"}},
                                  "required": ["x"]}, output_schema=INT_OUT),
        GraphBinding(id="sub", version="1", program=inner)])


async def test_a_root_plan_changed_in_place_is_refused_at_create() -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=InMemoryDurableTaskStore())
    root = program(chain_plan(2))
    root.plan["nodes"][0]["args"]["x"] = 5  # type: ignore[index]
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", root)
    assert "changed in place" in str(info.value)
    assert await rt.store.get_header("k") is None


# --- SPEC 10: admission events carry the admission id they are charged under ----------------

async def test_admission_events_carry_the_charged_admission_id() -> None:
    events: list[AdmissionEvent] = []
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=InMemoryDurableTaskStore(),
                               on_admission=events.append)
    await rt.create("k", program(chain_plan(3)))
    await rt.run("k")
    page = await rt.timeline("k", limit=1000)
    charged = {e.node_id: e.data["admission_id"] for e in page.events
               if e.kind == "admission_charged"}
    assert len(charged) == 3
    for event in events:
        if event.kind in ("admitted", "released"):
            assert event.admission_id == charged[event.node_id], event


async def test_effect_admission_events_carry_the_dispatch_admission_id() -> None:
    events: list[AdmissionEvent] = []
    conn = FakeConnector(Destination())
    rt = runtime(conn, CountingStore(), on_admission=events.append)
    await rt.create("p", program(PLAN))
    await rt.run("p")
    (action,) = (await rt.inspect("p")).actions
    admitted = [e for e in events if e.kind == "admitted"]
    assert [e.admission_id for e in admitted] == [action.admission_id]


# --- grants and resolutions ------------------------------------------------------------------

async def test_a_grant_naming_no_binding_is_refused() -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=InMemoryDurableTaskStore())
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(2)), grants=["inc", "ghost"])
    assert "'ghost'" in str(info.value) and "'inc'" not in str(info.value).split(":")[-1]
    assert await rt.store.get_header("k") is None
    assert (await rt.create("k", program(chain_plan(2)), grants=["inc"])).status == "pending"


async def test_a_second_resolution_with_another_result_ref_is_a_conflict() -> None:
    dest = Destination()
    conn = FakeConnector(dest, dispatch_mode="raise_after_accept", lookups=["unknown"] * 9)
    rt = runtime(conn, CountingStore(), lookup_attempts=1)
    await rt.create("p", program(PLAN))
    with pytest.raises(DurableRecoveryRequiredError):
        await rt.run("p")
    (action,) = (await rt.inspect("p")).actions
    output = dest.accepted[action.action_id]
    first = ActionOutcome(output=output, result_ref="ch-1")
    await rt.resolve_action("p", action.action_id, first, actor="oncall")
    await rt.resolve_action("p", action.action_id, first, actor="oncall")  # a repeat: no-op
    with pytest.raises(ResolutionConflictError):
        await rt.resolve_action("p", action.action_id,
                                ActionOutcome(output=output, result_ref="ch-2"), actor="oncall")
    (after,) = (await rt.inspect("p")).actions
    assert after.state == "confirmed" and after.result_ref_returned == "ch-1"
