"""The SDK consumer's view: create, run, inspect, re-run, conflicts, errors."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph import (
    ConfigurationError,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
    NodeFailedError,
    NodeInputError,
    NodeOutputError,
    PlanValidationError,
    StoreNotDurableError,
    TaskConflictError,
    TaskNotFoundError,
    ToolBinding,
    tool_context,
)
from agentium_graph._canonical import digest, incarnation_id
from tests.conftest import INT_OUT, Calls, CountingStore, chain_plan, make_catalog, program


def ten_node_dag() -> dict[str, Any]:
    ref = lambda n: {"$ref": {"node": n, "path": ["value"]}}  # noqa: E731
    nodes: list[dict[str, Any]] = [{"id": "src", "binding": "inc", "version": "1",
                                    "args": {"x": 1}}]
    for i in range(8):
        nodes.append({"id": f"w{i}", "binding": "inc", "version": "1",
                      "args": {"x": ref("src")}})
    nodes.append({"id": "join", "binding": "add", "version": "1",
                  "args": {"values": [ref(f"w{i}") for i in range(8)]}})
    return {"schemaVersion": 1, "revision": 1, "nodes": nodes}


async def test_ten_node_dag_create_run_inspect(calls: Calls, store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    view = await rt.create("t1", program(ten_node_dag()))
    assert view.status == "pending"
    assert set(view.nodes) == {"src", "join", *(f"w{i}" for i in range(8))}
    assert all(n.state == "pending" for n in view.nodes.values())

    result = await rt.run("t1", worker_id="w1")
    assert result.status == "completed"
    assert result.output["src"] == {"value": 2}
    assert all(result.output[f"w{i}"] == {"value": 3} for i in range(8))
    assert result.output["join"] == {"value": 24}

    view = await rt.inspect("t1")
    assert view.status == "completed" and view.verified and not view.problems
    assert view.counters["work_attempts"] == 10 and view.counters["expanded_nodes"] == 10
    assert view.counters["tool_calls"] == 10 and view.counters["plan_revisions"] == 1
    for node in view.nodes.values():
        assert node.state == "completed"
        assert [a.fence for a in node.attempts] == [1]
        assert node.output_digest and node.output_digest.startswith("sha256:")
    assert view.lease is None
    assert calls.by_node == {n: 1 for n in view.nodes}


async def test_run_on_completed_task_returns_retained_output_without_dispatch(
        calls: Calls, store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("t", program(chain_plan(3)))
    first = await rt.run("t", "w1")
    commits = len(store.commits)
    again = await rt.run("t", "w2")
    assert again.output == first.output == {"n0": {"value": 1}, "n1": {"value": 2},
                                            "n2": {"value": 3}}
    assert len(store.commits) == commits
    assert sum(calls.by_node.values()) == 3


async def test_chain_costs_one_commit_per_node(calls: Calls, store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("chain", program(chain_plan(20), limits=_wide_limits()))
    await rt.run("chain", "w1")
    # start n0; then (settle k + start k+1) x 19; then settle n19 + task completed.
    assert len(store.commits) == 21


async def test_a_task_created_here_starts_with_no_reads_and_one_write(
        calls: Calls, store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("chain", program(chain_plan(3)))
    store.reads.clear()
    result = await rt.run("chain", "w1")
    assert result.output["n2"] == {"value": 3}
    # The lease rides on the first commit (start n0): 4 durable writes in all (start n0,
    # two settle + start, settle + completed), not 5 with a lease write of its own.
    assert len(store.acquires) == 1 and store.acquires[0].steps
    assert len(store.commits) == 4
    assert store.reads == []
    timeline = await rt.timeline("chain")
    kinds = [e.kind for e in timeline.events]
    assert kinds[:3] == ["task_created", "lease_acquired", "admission_charged"]
    # A second runtime (another process, say) knows nothing: it reads, then acquires.
    other = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("again", program(chain_plan(2)))
    store.acquires.clear()
    await other.run("again", "w2")
    assert [bool(a.steps) for a in store.acquires] == [False]
    assert "get_header" in store.reads


async def test_a_fresh_start_refused_by_the_store_falls_back_to_the_ordinary_start(
        calls: Calls, store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("chain", program(chain_plan(2)))
    # Another worker ran the task's first node meanwhile: the remembered state is stale.
    other = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await other.run("chain", "w2")
    assert calls.by_node == {"n0": 1, "n1": 1}
    result = await rt.run("chain", "w1")  # completed: the retained result, nothing re-run
    assert result.output["n1"] == {"value": 2}
    assert calls.by_node == {"n0": 1, "n1": 1}


async def test_a_fresh_start_loses_the_race_to_a_live_lease(
        calls: Calls, store: CountingStore) -> None:
    from agentium_graph import LeaseHeldError
    from agentium_graph.store import AcquireLeaseRequest as Acquire

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("chain", program(chain_plan(2)))
    await store.acquire_lease(Acquire(key="chain", worker_id="other", ttl_seconds=60,
                                      now=rt.clock()))
    journal = len((await rt.timeline("chain")).events)
    with pytest.raises(LeaseHeldError):
        await rt.run("chain", "w1")
    assert len((await rt.timeline("chain")).events) == journal  # nothing written
    assert calls.by_node == {}


async def test_fan_out_wave_starts_in_one_commit(calls: Calls, store: CountingStore) -> None:
    from agentium_graph import PlanLimits, RootLimits
    from agentium_graph.store import StartAttempt

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store,
                               limits=RootLimits(max_concurrent_work=8))
    await rt.create("fan", program(ten_node_dag(), limits=PlanLimits(max_concurrency=8)))
    await rt.run("fan", "w1")
    starts = [sum(isinstance(s, StartAttempt) for s in c.steps) for c in store.commits]
    assert 8 in starts  # the 8 workers became ready together and started in one commit


def _wide_limits() -> Any:
    from agentium_graph import PlanLimits

    return PlanLimits(max_depth=200, max_nodes=200)


async def test_create_is_idempotent_and_conflicts_name_fields(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    a = await rt.create("k", program(chain_plan(2)), input={"q": 1})
    b = await rt.create("k", program(chain_plan(2)), input={"q": 1})
    assert a.identity_digest == b.identity_digest
    with pytest.raises(TaskConflictError) as info:
        await rt.create("k", program(chain_plan(2)), input={"q": 2})
    assert "input" in info.value.differing and "input_digest" in info.value.differing
    with pytest.raises(TaskConflictError) as info:
        await rt.create("k", program(chain_plan(3)), input={"q": 1})
    assert "plan" in info.value.differing


async def test_create_deep_copies_plan_and_input(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    plan = chain_plan(2)
    data = {"items": [1, 2]}
    prog = program(plan)
    plan["nodes"][0]["args"]["x"] = 100
    await rt.create("k", prog, input=data)
    data["items"].append(3)
    result = await rt.run("k")
    assert result.output["n0"] == {"value": 1}
    identity = await rt.store.get_identity("k")
    assert identity is not None and identity.input == {"items": [1, 2]}


async def test_an_input_schema_changed_in_place_is_refused(calls: Calls) -> None:
    # (review 44) The task pinned the schema as changed while its input was checked against
    # the one the program was built with: a task whose pinned schema its input breaks.
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    prog = program(chain_plan(1), input_schema={"type": "object", "required": ["a"]})
    assert prog.input_schema is not None
    prog.input_schema["required"] = ["zzz"]  # reaching into the frozen program
    with pytest.raises(ConfigurationError, match="input_schema was changed in place"):
        await rt.create("k", prog, input={"a": 1})
    assert await rt.store.get_header("k") is None


async def test_identity_pins_the_plan_its_digest_and_args_digests(calls: Calls) -> None:
    # create encodes the plan once for both its digest and the identity's copy, and takes
    # each node's args digest from the compiled plan: both must equal the plain
    # computation. A plan changed in place after the program was built is refused (stop
    # 23: a program is immutable), and the task created before keeps what it pinned.
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    prog = program(chain_plan(2))
    await rt.create("k1", prog)
    assert prog.plan is not None
    prog.plan["nodes"][0]["args"]["x"] = 41  # reaching into the frozen program
    with pytest.raises(ConfigurationError, match="changed in place"):
        await rt.create("k2", prog)
    assert await rt.store.get_header("k2") is None
    changed = chain_plan(2)
    changed["nodes"][0]["args"]["x"] = 41
    await rt.create("k2", program(changed))  # a new program with the changed plan
    for key, x in (("k1", 0), ("k2", 41)):
        identity = await rt.store.get_identity(key)
        snapshot = await rt.store.get_task(key)
        assert identity is not None and snapshot is not None and identity.plan is not None
        assert identity.plan["nodes"][0]["args"] == {"x": x}
        assert identity.program["plan_digest"] == digest(identity.plan)
        for node in identity.plan["nodes"]:
            rec = snapshot.nodes[node["id"]]
            assert rec.incarnation_id == incarnation_id(
                key, node["id"], 1, node["binding"], node["version"],
                digest(node.get("args", {})))
    assert (await rt.run("k2")).output["n1"] == {"value": 43}


async def test_invalid_plan_is_rejected_before_anything_is_stored(calls: Calls,
                                                                   store: CountingStore) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    bad = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "nope", "version": "1"},
        {"id": "b", "binding": "inc", "version": "1", "args": {"x": "str"}}]}
    with pytest.raises(PlanValidationError) as info:
        await rt.create("bad", program(bad))
    codes = {d.code for d in info.value.diagnostics}
    assert codes == {"unknown_binding", "args_invalid"}
    with pytest.raises(TaskNotFoundError):
        await rt.inspect("bad")


async def test_require_durable_rejects_memory_store(calls: Calls) -> None:
    with pytest.raises(StoreNotDurableError):
        ExecutionGraphRuntime(catalog=make_catalog(calls), store=InMemoryDurableTaskStore(),
                              require_durable=True)
    with pytest.raises(StoreNotDurableError):
        ExecutionGraphRuntime(catalog=make_catalog(calls), require_durable=True)


async def test_unknown_keys_raise_task_not_found(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    for call in (rt.inspect("missing"), rt.run("missing"), rt.cancel("missing", reason="x"),
                 rt.timeline("missing"), rt.admission_snapshot("missing")):
        with pytest.raises(TaskNotFoundError) as info:
            await call
        assert "missing" in str(info.value)


def _tool(id_: str, fn: Any, **kw: Any) -> ToolBinding:
    return ToolBinding(id=id_, version="1", execute=fn, recovery="pure", **kw)


async def test_tool_exception_fails_node_and_task(calls: Calls) -> None:
    def boom(args: dict[str, Any]) -> Any:
        raise RuntimeError("disk on fire")

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [_tool("boom", boom)]))
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": 1}},
        {"id": "b", "binding": "boom", "version": "1", "dependsOn": ["a"]},
        {"id": "c", "binding": "inc", "version": "1", "args": {"x": 1}, "dependsOn": ["b"]}]}
    await rt.create("f", program(plan))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("f")
    assert info.value.node_id == "b" and "disk on fire" in str(info.value)
    # The run that saw the tool raise chains the original exception (a later run only has
    # what was stored: the error's code and message).
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value.__cause__) == "disk on fire"
    view = await rt.inspect("f")
    assert view.status == "failed"
    assert [view.nodes[n].state for n in ("a", "b", "c")] == ["completed", "failed", "canceled"]
    err = view.nodes["b"].error
    assert err is not None and err.code == "tool_error" and "RuntimeError" in err.message
    with pytest.raises(NodeFailedError):  # a failed task stays failed
        await rt.run("f", "w2")
    assert calls.by_node == {"a": 1}


@pytest.mark.parametrize("value, where", [
    ({"value": {1, 2}}, "$.value"),
    ({"value": float("nan")}, "$.value"),
    ({1: "x"}, "$"),
])
async def test_non_json_output_fails_with_node_output_error(calls: Calls, value: Any,
                                                            where: str) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(
        calls, [_tool("odd", lambda a: value, run_in_thread=False)]))
    await rt.create("o", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "odd", "binding": "odd", "version": "1"}]}))
    with pytest.raises(NodeOutputError) as info:
        await rt.run("o")
    assert info.value.node_id == "odd" and where in str(info.value)
    assert (await rt.inspect("o")).nodes["odd"].error.code == "node_output_invalid"  # type: ignore[union-attr]


async def test_output_schema_violation_names_node_and_schema_path(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(
        calls, [_tool("liar", lambda a: {"value": "three"}, output_schema=INT_OUT)]))
    await rt.create("o", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "liar", "binding": "liar", "version": "1"}]}))
    with pytest.raises(NodeOutputError) as info:
        await rt.run("o")
    assert info.value.node_id == "liar"
    assert info.value.details["path"] == "$.value"
    assert info.value.details["schema_path"] == "#/properties/value/type"


async def test_resolved_args_are_validated_before_dispatch(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(
        calls, [_tool("text", lambda a: {"value": "abc"})]))
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "t", "binding": "text", "version": "1"},
        {"id": "i", "binding": "inc", "version": "1",
         "args": {"x": {"$ref": {"node": "t", "path": ["value"]}}}}]}
    await rt.create("r", program(plan))
    with pytest.raises(NodeInputError) as info:
        await rt.run("r")
    assert info.value.node_id == "i" and info.value.details["path"] == "$.x"
    view = await rt.inspect("r")
    assert view.nodes["i"].attempts == []  # never dispatched, never charged
    assert view.counters["work_attempts"] == 1


async def test_missing_reference_path_at_runtime_is_a_node_input_error(calls: Calls) -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [_tool("free", lambda a: {})]))
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "f", "binding": "free", "version": "1"},
        {"id": "i", "binding": "inc", "version": "1",
         "args": {"x": {"$ref": {"node": "f", "path": ["nothing"]}}}}]}
    await rt.create("r", program(plan))
    with pytest.raises(NodeInputError) as info:
        await rt.run("r")
    assert "nothing" in str(info.value)


async def test_tool_context_inside_and_outside(calls: Calls) -> None:
    seen: list[tuple[str, str, int, int, str]] = []

    def probe(args: dict[str, Any]) -> dict[str, Any]:
        ctx = tool_context()
        seen.append((ctx.key, ctx.node_id, ctx.attempt, ctx.fence, ctx.worker_id))
        return {}

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [_tool("probe", probe)]))
    await rt.create("c", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "p", "binding": "probe", "version": "1"}]}))
    await rt.run("c", "worker-7")
    assert seen == [("c", "p", 1, 1, "worker-7")]
    with pytest.raises(Exception, match="only available inside a tool"):
        tool_context()


async def test_nested_dispatch_from_a_leaf_is_rejected(calls: Calls) -> None:
    holder: dict[str, ExecutionGraphRuntime] = {}

    async def sneaky(args: dict[str, Any]) -> dict[str, Any]:
        await holder["rt"].run("other")
        return {}

    rt = ExecutionGraphRuntime(catalog=make_catalog(calls, [_tool("sneaky", sneaky)]))
    holder["rt"] = rt
    await rt.create("other", program(chain_plan(1)))
    await rt.create("n", program({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "s", "binding": "sneaky", "version": "1"}]}))
    with pytest.raises(NodeFailedError) as info:
        await rt.run("n")
    assert info.value.cause is not None and info.value.cause.code == "nested_dispatch"
    assert (await rt.inspect("other")).status == "pending"


def test_sync_wrappers() -> None:
    calls = Calls()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    rt.create_sync("s", program(chain_plan(2)))
    assert rt.run_sync("s").output["n1"] == {"value": 2}
    assert rt.inspect_sync("s").status == "completed"

    async def inside_a_loop() -> None:
        rt.inspect_sync("s")

    import asyncio

    with pytest.raises(ConfigurationError, match="inside an event loop"):
        asyncio.run(inside_a_loop())


@pytest.mark.parametrize("kwargs", [{"lease_ttl": 0}, {"lease_ttl": 31},
                                    {"poll_interval": 20.0}])
def test_runtime_config_errors(calls: Calls, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        ExecutionGraphRuntime(catalog=make_catalog(calls), **kwargs)


async def test_a_tool_receives_literal_data_that_contains_ref_keys(calls: Calls) -> None:
    from agentium_graph import HostCatalog, ToolBinding

    seen: list[dict[str, Any]] = []

    async def keep(args: dict[str, Any]) -> dict[str, Any]:
        seen.append(args)
        return {"value": len(seen)}

    catalog = HostCatalog([*make_catalog(calls), ToolBinding(
        id="keep", version="1", execute=keep, recovery="pure", output_schema=INT_OUT)])
    schema = {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": 1}},
        {"id": "b", "binding": "keep", "version": "1", "args": {
            "schema": {"$literal": schema},
            "dbref": {"$literal": {"$ref": "orders", "$id": 7}},
            "from_a": {"$ref": {"node": "a", "path": ["value"]}}}},
        {"id": "c", "binding": "keep", "version": "1",
         "args": {"only": {"$literal": {"$ref": {"node": "a"}}}}}]}
    rt = ExecutionGraphRuntime(catalog=catalog)
    await rt.create("lit", program(plan))
    await rt.run("lit", "w1")
    by_keys = {tuple(sorted(a)): a for a in seen}
    assert by_keys[("dbref", "from_a", "schema")] == {
        "schema": schema, "dbref": {"$ref": "orders", "$id": 7}, "from_a": 2}
    assert by_keys[("only",)] == {"only": {"$ref": {"node": "a"}}}  # no reference, no dep


async def test_a_copy_given_another_input_schema_checks_inputs_against_it(
        calls: Calls) -> None:
    # (review 47) model_copy kept the original's validator and digest: the copy's
    # descriptor said its schema was changed in place, and it checked inputs against the
    # original schema.
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls))
    prog = program(chain_plan(1), input_schema={"type": "object", "required": ["a"]})
    copy = prog.model_copy(update={"input_schema": {"type": "object", "required": ["b"]}})
    with pytest.raises(PlanValidationError, match="'b' is a required property"):
        await rt.create("k", copy, input={"a": 1})
    await rt.create("k", copy, input={"b": 1})
    assert (await rt.inspect("k")).status == "pending"
