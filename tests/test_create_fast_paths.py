"""``create``'s unvalidated builders and the identity digest kept per identity object.

``new_node`` (every node a plan materializes) and the NodeViews of ``build_view`` skip
pydantic's validation; each must build exactly what the validating constructor builds.
``identity_digest_of`` hashes a task identity once per object; the digest must be the one
``record_digest`` gives, follow the object and not outlive it.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from agentium_graph import ExecutionGraphRuntime, InMemoryDurableTaskStore
from agentium_graph._canonical import record_digest
from agentium_graph.errors import ErrorInfo, InvalidTransitionError
from agentium_graph.runtime._views import NodeView
from agentium_graph.store import _records
from agentium_graph.store._records import (
    AttemptRecord,
    NodeRecord,
    TaskIdentity,
    identity_digest_of,
    new_node,
)
from agentium_graph.store._transitions import creation_entry
from agentium_graph.testing._fixtures import T0, make_create_request
from tests.test_trusted_records import _same


@pytest.mark.parametrize("parent,deps", [(None, ()), ("g", ("g/a", "g/b"))])
def test_new_node_is_the_validated_record(parent: str | None, deps: tuple[str, ...]) -> None:
    args: dict[str, Any] = {"node_id": "g/n", "incarnation_id": "inc_1", "kind": "tool",
                            "binding": "step", "version": "1.0", "revision": 2,
                            "parent": parent, "deps": deps}
    _same(new_node(**args), NodeRecord(**args))


def test_node_views_of_create_and_inspect_are_the_validated_views() -> None:
    # build_view makes its NodeViews without validation; a validating twin of each, built
    # from the stored record, must be indistinguishable (field order, fields set, values).
    from bench._graphs import ROOT_LIMITS, catalog, chain

    async def main() -> None:
        store = InMemoryDurableTaskStore()
        runtime = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS)
        created = await runtime.create("k", chain(3))
        await runtime.run("k")
        done = await runtime.inspect("k")
        for view in (*created.nodes.values(), *done.nodes.values()):
            validated = NodeView(**{name: getattr(view, name) for name in NodeView.model_fields})
            _same(view, validated)
            assert type(view.attempts) is list
        assert [v.state for v in done.nodes.values()] == ["completed"] * 3
        assert all(v.output is not None for v in done.nodes.values())

    import asyncio
    asyncio.run(main())


def test_a_node_view_of_a_failed_attempt_keeps_its_error() -> None:
    error = ErrorInfo(code="tool_error", message="boom", node_id="n", details={"a": [1]})
    attempt = AttemptRecord(number=1, attempt_id="a1", fence=1, worker_id="w",
                            started_at=T0, ended_at=T0, outcome="failed")
    rec = NodeRecord(node_id="n", incarnation_id="i", kind="tool", binding="b",
                     version="1", revision=1, state="failed", attempts=(attempt,),
                     error=error)
    fields = {name: None if name == "output" else getattr(rec, name)
              for name in NodeView.model_fields}
    fields["attempts"] = list(rec.attempts)
    _same(_records.trusted(NodeView, fields, NodeView.model_fields), NodeView(**fields))


def test_identity_digest_is_record_digest_kept_per_object() -> None:
    identity = make_create_request("k").identity
    expected = record_digest(identity.model_dump(mode="json"))
    assert identity_digest_of(identity) == expected
    assert identity_digest_of(identity) == expected  # kept
    # An equal identity that is another object gets its own entry, with the same digest;
    # one that differs gets its own digest.
    twin = TaskIdentity.model_validate_json(identity.model_dump_json())
    assert twin is not identity and identity_digest_of(twin) == expected
    other = identity.model_copy(update={"key": "other"})
    assert identity_digest_of(other) != expected


def test_a_kept_identity_digest_dies_with_its_identity() -> None:
    gc.collect()  # identities of earlier tests that are already garbage
    before = len(_records._IDENTITY_DIGESTS)
    identities = [make_create_request(f"k{i}").identity for i in range(20)]
    digests = {identity_digest_of(i) for i in identities}
    assert len(digests) == 20
    assert len(_records._IDENTITY_DIGESTS) == before + 20
    del identities
    gc.collect()
    assert len(_records._IDENTITY_DIGESTS) == before
    # An object that reuses a dead one's id() is hashed afresh, never given its digest.
    for i in range(50):
        fresh = make_create_request(f"fresh{i}").identity
        assert identity_digest_of(fresh) == record_digest(fresh.model_dump(mode="json"))


def test_a_store_still_refuses_an_identity_that_is_not_the_headers() -> None:
    request = make_create_request("k")
    identity_digest_of(request.identity)  # kept before the request is changed
    wrong = request.model_copy(update={"identity": request.identity.model_copy(
        update={"input_digest": "sha256:" + "0" * 64})})
    with pytest.raises(InvalidTransitionError, match="does not match the identity"):
        creation_entry(wrong)
    assert creation_entry(request).kind == "task_created"


def test_each_task_runs_under_its_own_pinned_limits() -> None:
    # Runs take their RootLimits/PlanLimits from a cache keyed by the pinned values: tasks
    # that pin different limits must never share them, tasks that pin the same share one.
    from bench._graphs import ROOT_LIMITS, catalog, chain

    async def main() -> None:
        runtime = ExecutionGraphRuntime(catalog=catalog(), store=InMemoryDurableTaskStore(),
                                        limits=ROOT_LIMITS)
        for key, width in (("a", 2), ("b", 3), ("c", 2)):
            await runtime.create(key, chain(2), limits={"max_concurrent_work": width})
        seen = {}
        for key in ("a", "b", "c"):
            await runtime.run(key)
            identity = await runtime.store.get_identity(key)
            assert identity is not None
            seen[key] = runtime.limits_for(identity)
        assert seen["a"].max_concurrent_work == 2 and seen["b"].max_concurrent_work == 3
        assert seen["a"] is seen["c"] and seen["a"] is not seen["b"]

    import asyncio
    asyncio.run(main())


def test_a_changed_descriptor_is_still_refused_at_run() -> None:
    # The catalog compares a task's pinned descriptors with dumps it made once.
    from agentium_graph import DescriptorMismatchError, HostCatalog, ToolBinding
    from bench._graphs import ROOT_LIMITS, catalog, chain

    async def main() -> None:
        store = InMemoryDurableTaskStore()
        first = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS)
        await first.create("k", chain(2))
        changed = [b if b.id != "step" else ToolBinding.model_validate(
            {**dict(b), "description": b.description,
             "output_schema": {"type": "object", "required": ["value", "extra"]}})
            for b in catalog()]
        second = ExecutionGraphRuntime(catalog=HostCatalog(changed), store=store,
                                       limits=ROOT_LIMITS)
        with pytest.raises(DescriptorMismatchError, match="step"):
            await second.run("k")
        assert (await first.run("k")).status == "completed"

    import asyncio
    asyncio.run(main())
