"""Stored outputs are read back verified against their digests: a damaged or missing blob is
named, never silently used."""

from __future__ import annotations

import pytest

from agentium_graph import DataIntegrityError, ExecutionGraphRuntime, InMemoryDurableTaskStore
from agentium_graph.store import CommitRequest, CommitResult, SettleNode
from tests.conftest import Calls, chain_plan, make_catalog, program


class _Crash(BaseException):
    """A worker dying mid-run: nothing after it runs, nothing is settled."""


class _DiesSettlingN1(InMemoryDurableTaskStore):
    """Dies on the commit that would settle n1 (n0 completed, n1 left running)."""

    armed = True

    async def commit(self, request: CommitRequest) -> CommitResult:
        if self.armed and any(isinstance(s, SettleNode) and s.node_id == "n1"
                              for s in request.steps):
            self.armed = False
            raise _Crash
        return await super().commit(request)


async def _interrupted(store: InMemoryDurableTaskStore, calls: Calls) -> str:
    """A 3-node chain whose worker died after n1 ran: n0 completed, n1 running."""
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("t", program(chain_plan(3)))
    with pytest.raises(_Crash):
        await rt.run("t", "w1")
    snapshot = await store.get_task("t")
    assert snapshot is not None and snapshot.nodes["n0"].state == "completed"
    assert snapshot.nodes["n1"].state == "running"
    digest_ = snapshot.nodes["n0"].output_digest
    assert digest_ is not None
    return digest_


@pytest.mark.parametrize("damage", ["damaged", "missing"])
async def test_recovery_refuses_to_build_on_a_damaged_output(damage: str, calls: Calls) -> None:
    store = _DiesSettlingN1()
    blob = await _interrupted(store, calls)
    if damage == "damaged":
        store._blobs[blob] = '{"value":1000}'  # what n1 would consume instead of 1
    else:
        del store._blobs[blob]
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    with pytest.raises(DataIntegrityError) as info:
        await rt.run("t", "w1")
    assert info.value.node_id == "n0"
    assert damage in str(info.value) and "restore it from a backup" in str(info.value)
    assert info.value.details == {"blob": blob, "problem": damage}
    assert calls.by_node == {"n0": 1, "n1": 1}  # nothing ran again on top of the bad value


async def test_inspect_lists_every_damaged_and_missing_output(calls: Calls) -> None:
    store = InMemoryDurableTaskStore()
    rt = ExecutionGraphRuntime(catalog=make_catalog(calls), store=store)
    await rt.create("t", program(chain_plan(3)))
    await rt.run("t", "w1")
    snapshot = await store.get_task("t")
    assert snapshot is not None
    d0, d1 = snapshot.nodes["n0"].output_digest, snapshot.nodes["n1"].output_digest
    assert d0 and d1
    store._blobs[d0] = '{"value":7}'
    del store._blobs[d1]
    view = await rt.inspect("t")
    assert not view.verified
    assert view.problems == ("node 'n0': output does not match its digest",
                             "node 'n1': output blob is missing")
    assert view.nodes["n0"].output is None and view.nodes["n1"].output is None
    assert view.nodes["n2"].output == {"value": 3}  # the intact one is still shown
