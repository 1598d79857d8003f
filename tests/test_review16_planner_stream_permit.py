"""A streamed planner abandoned while its provider still runs keeps its root slot.

The planner's provider call holds one root permit (SPEC: one slot covers one provider
request or stream). When the provider swallows the cancel of a stop (here: the planner's
``max_latency_ms``), the runtime abandons the stream after a grace and ends the run; the
permit used to be released right then, while the provider went on running. It is now
released when the abandoned stream really ends, as an agent's abandoned call's is.
"""

from __future__ import annotations

import asyncio

import pytest

from agentium_graph import AdmissionEvent, ExecutionGraphRuntime, PlannerFailedError, StreamLimits
from agentium_graph.runtime import _abandon
from tests.test_review15_provider_ignores_cancel import HANG_LIMIT, HeldStream, catalog, streamed


@pytest.mark.parametrize("behavior", ["honors", "hangs"])
async def test_an_abandoned_planner_stream_keeps_its_slot_until_it_ends(
        behavior: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_abandon, "GRACE", 0.2)
    events: list[AdmissionEvent] = []
    provider = HeldStream(behavior)
    program = streamed(provider, stream=StreamLimits(max_latency_ms=300))
    rt = ExecutionGraphRuntime(catalog=catalog([]), poll_interval=0.05,
                               on_admission=events.append)
    await rt.create("k", program)
    try:
        with pytest.raises(PlannerFailedError):
            await asyncio.wait_for(rt.run("k"), HANG_LIMIT)

        def planner(kind: str) -> int:
            return sum(1 for e in events if e.kind == kind and e.node_id is None)

        assert planner("admitted") == 1
        # A provider that honored the cancel has ended: its slot is free. One that swallowed
        # it is still running: its slot is still taken.
        assert planner("released") == (1 if behavior == "honors" else 0)
        provider.release.set()
        await asyncio.wait_for(provider.finished.wait(), HANG_LIMIT)
        for _ in range(100):  # the stream's task ends a few loop turns after the provider
            if planner("released"):
                break
            await asyncio.sleep(0.01)
        assert planner("released") == 1
    finally:
        provider.release.set()
