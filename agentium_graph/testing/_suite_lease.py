"""Conformance: fenced leases (acquire, renew, release, expiry, takeover) and cancel."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from agentium_graph.errors import (
    BudgetExhaustedError,
    InvalidTransitionError,
    LeaseHeldError,
    StaleFenceError,
)
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    Charge,
    ClaimNode,
    CommitRequest,
    LeaseGrant,
    RecordAction,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    SetStatus,
    StartAttempt,
)
from agentium_graph.testing._base import KEY, W1, W2, SuiteBase, rejected
from agentium_graph.testing._fixtures import (
    T0,
    acquire,
    action_record,
    capture,
    commit,
    read_timeline,
)

TICK = timedelta(microseconds=1)


class LeaseTests(SuiteBase):
    """Every fenced call of a stale lease holder raises StaleFenceError and changes nothing."""

    async def test_acquire_issues_strictly_increasing_fences(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        grants: list[LeaseGrant] = []
        for worker, at in ((W1, T0), (W1, T0 + timedelta(seconds=1)),
                           (W2, T0 + timedelta(seconds=31)), (W2, T0 + timedelta(seconds=32))):
            grant = await store.acquire_lease(AcquireLeaseRequest(
                key=KEY, worker_id=worker, ttl_seconds=30, now=at))
            assert grant.expires_at == at + timedelta(seconds=30)
            assert grant.header == await store.get_header(KEY)
            assert grant.header.lease is not None
            assert (grant.header.lease.owner, grant.header.lease.fence) == (worker, grant.fence)
            grants.append(grant)
        assert [g.fence for g in grants] == [1, 2, 3, 4]
        header = await store.get_header(KEY)
        assert header is not None and header.fence == 4

    async def test_acquire_with_snapshot_returns_the_task_as_of_the_grant(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        plain = await store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W1, ttl_seconds=30, now=T0))
        assert plain.snapshot is None  # only on request: other callers pay nothing for it
        await commit(store, KEY, W1, plain.fence,
                     StartAttempt(node_id="n0", attempt_id="att-1"),
                     RecordAction(action=action_record("act-1", "n0", fence=plain.fence)))
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W1, ttl_seconds=30, now=T0 + TICK, snapshot=True))
        assert grant.snapshot is not None
        assert grant.snapshot.header == grant.header
        assert grant.snapshot == await store.get_task(KEY)  # the same records, same fence
        assert grant.snapshot.nodes["n0"].state == "running"
        assert set(grant.snapshot.actions) == {"act-1"}
        # The snapshot is the caller's copy: changing it changes nothing stored.
        before = await capture(store, KEY)
        grant.snapshot.nodes.clear()
        grant.snapshot.header.counters.clear()
        assert await capture(store, KEY) == before
        # A refused acquire returns nothing at all (no partial snapshot).
        await rejected(store, KEY, LeaseHeldError, store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W2, ttl_seconds=30, now=T0 + TICK, snapshot=True)))

    async def test_acquire_with_steps_commits_them_under_the_new_fence_atomically(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        digest_, text = '"sha"', '{"out":1}'
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W1, ttl_seconds=30, now=T0, snapshot=True, steps=(
                StartAttempt(node_id="n0", attempt_id="att-1", admission_id="adm-1",
                             charges={"work_attempts": 1}),
                Charge(admission_id="adm-2", charges={"tool_calls": 1})),
            blobs={digest_: text}))
        assert grant.fence == 1 and grant.commit is not None
        assert grant.header == await store.get_header(KEY)
        assert grant.commit.header == grant.header
        assert grant.header.counters["work_attempts"] == 1
        assert grant.header.counters["tool_calls"] == 1
        assert set(grant.commit.charged) == {"adm-1", "adm-2"}
        node = grant.commit.nodes["n0"]
        assert node.state == "running" and node.attempts[-1].fence == grant.fence
        assert grant.snapshot is not None and grant.snapshot == await store.get_task(KEY)
        assert await store.get_blobs([digest_]) == {digest_: text}
        timeline = await read_timeline(store, KEY)
        kinds = [e.kind for e in timeline]
        assert kinds[1] == "lease_acquired"  # the grant first, then the steps, in order
        assert kinds[2:] == ["admission_charged", "attempt_started", "admission_charged"]
        assert all(e.fence == grant.fence for e in timeline[1:])
        # The holder carries on with ordinary commits under that fence.
        await commit(store, KEY, W1, grant.fence, ClaimNode(node_id="n1"))

    async def test_acquire_with_steps_that_end_the_task_releases_the_lease(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W1, ttl_seconds=30, now=T0,
            steps=(SetStatus(status="canceled", release_lease=True),)))
        assert grant.fence == 1 and grant.expires_at == T0 + timedelta(seconds=30)
        assert grant.header.status == "canceled" and grant.header.lease is None
        assert grant.header == await store.get_header(KEY)

    async def test_acquire_with_steps_is_refused_while_a_cancel_is_pending(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        await store.request_cancel(CancelTaskRequest(key=KEY, reason="stop", now=T0))
        # Steps computed without seeing the cancel must not run: all refused, no lease.
        await rejected(store, KEY, InvalidTransitionError, store.acquire_lease(
            AcquireLeaseRequest(key=KEY, worker_id=W1, ttl_seconds=30, now=T0, steps=(
                StartAttempt(node_id="n0", attempt_id="att-1"),))))
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W1, ttl_seconds=30, now=T0))  # a plain acquire still works
        assert grant.fence == 1 and grant.header.cancel is not None

    async def test_acquire_with_a_refused_step_takes_no_lease_and_writes_nothing(
            self, store: DurableTaskStore) -> None:
        await self.create(store, limits={"tool_calls": 5})
        await rejected(store, KEY, InvalidTransitionError, store.acquire_lease(
            AcquireLeaseRequest(key=KEY, worker_id=W1, ttl_seconds=30, now=T0, steps=(
                Charge(admission_id="adm-1", charges={"tool_calls": 1}),
                ClaimNode(node_id="no-such-node")), blobs={'"d"': "1"})))
        assert await store.get_blobs(['"d"']) in ({}, {'"d"': "1"})  # blobs are harmless
        header = await store.get_header(KEY)
        assert header is not None and header.lease is None and header.fence == 0
        await rejected(store, KEY, BudgetExhaustedError, store.acquire_lease(
            AcquireLeaseRequest(key=KEY, worker_id=W1, ttl_seconds=30, now=T0, steps=(
                Charge(admission_id="adm-1", charges={"tool_calls": 6}),))))
        # Nothing was taken: the next plain acquire still gets fence 1.
        assert await acquire(store, KEY, W1) == 1

    async def test_same_worker_reacquires_at_once_with_a_newer_fence(
            self, store: DurableTaskStore) -> None:
        old = await self.leased(store)
        new = await acquire(store, KEY, W1, now=T0 + timedelta(seconds=1))
        assert new > old
        # The restarted worker's old incarnation is fenced out.
        await rejected(store, KEY, StaleFenceError,
                       commit(store, KEY, W1, old, ClaimNode(node_id="n0")))
        await commit(store, KEY, W1, new, ClaimNode(node_id="n0"))

    async def test_other_worker_gets_lease_held_until_expiry_then_takes_over(
            self, store: DurableTaskStore) -> None:
        first = await self.leased(store, ttl=10)
        expires = T0 + timedelta(seconds=10)
        for at in (T0, T0 + timedelta(seconds=5), expires - TICK):
            error = await rejected(store, KEY, LeaseHeldError, acquire(
                store, KEY, W2, now=at, ttl=10))
            assert error.holder == W1
            assert error.expires_at == expires
            assert error.key == KEY
        second = await acquire(store, KEY, W2, now=expires, ttl=10)
        assert second > first
        header = await store.get_header(KEY)
        assert header is not None and header.lease is not None
        assert (header.lease.owner, header.lease.fence, header.fence) == (W2, second, second)
        await rejected(store, KEY, StaleFenceError,
                       commit(store, KEY, W1, first, ClaimNode(node_id="n0"),
                                      now=expires))

    async def test_renew_extends_the_lease(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, ttl=10)
        status = await store.renew_lease(RenewLeaseRequest(
            key=KEY, worker_id=W1, fence=fence, ttl_seconds=10,
            now=T0 + timedelta(seconds=5)))
        assert status.fence == fence
        assert status.expires_at == T0 + timedelta(seconds=15)
        assert status.cancel is None
        header = await store.get_header(KEY)
        assert header is not None and header.lease is not None
        assert header.lease.expires_at == T0 + timedelta(seconds=15)
        error = await rejected(store, KEY, LeaseHeldError, acquire(
            store, KEY, W2, now=T0 + timedelta(seconds=12)))
        assert error.expires_at == T0 + timedelta(seconds=15)

    async def test_a_renewal_racing_commits_is_not_lost(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, ttl=30)
        renewal = store.renew_lease(RenewLeaseRequest(
            key=KEY, worker_id=W1, fence=fence, ttl_seconds=30, now=T0 + timedelta(seconds=10)))
        commits = [commit(store, KEY, W1, fence,
                          Charge(admission_id=f"adm-{i}", charges={"tool_calls": 1}))
                   for i in range(10)]
        await asyncio.gather(*commits[:5], renewal, *commits[5:])
        header = await store.get_header(KEY)
        assert header is not None and header.lease is not None
        # A commit must never write back the expiry it read before the renewal.
        assert header.lease.expires_at == T0 + timedelta(seconds=40)
        assert header.counters["tool_calls"] == 10

    async def test_stale_fence_on_renew_release_and_commit_changes_nothing(
            self, store: DurableTaskStore) -> None:
        old = await self.leased(store, ttl=10)
        later = T0 + timedelta(seconds=20)
        current = await acquire(store, KEY, W2, now=later)
        cases = [
            (W1, old),          # the previous holder
            (W2, old),          # the current holder with an old fence
            (W2, current + 1),  # a fence from the future
            (W1, current),      # the current fence under another worker's name
        ]
        for worker, fence in cases:
            for operation in (
                    store.renew_lease(RenewLeaseRequest(
                        key=KEY, worker_id=worker, fence=fence, ttl_seconds=10, now=later)),
                    store.release_lease(ReleaseLeaseRequest(
                        key=KEY, worker_id=worker, fence=fence, now=later)),
                    store.commit(CommitRequest(
                        key=KEY, worker_id=worker, fence=fence, now=later, steps=(
                            Charge(admission_id="stale", charges={"tool_calls": 1}),
                            ClaimNode(node_id="n0"))))):
                error = await rejected(store, KEY, StaleFenceError, operation)
                assert error.fence == fence
                assert error.current == current
        header = await store.get_header(KEY)
        assert header is not None and header.lease is not None
        assert (header.lease.owner, header.fence) == (W2, current)

    async def test_release_lets_another_worker_acquire_at_once(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, ttl=30)
        header = await store.release_lease(ReleaseLeaseRequest(
            key=KEY, worker_id=W1, fence=fence, now=T0 + timedelta(seconds=1)))
        assert header.lease is None
        assert header.fence == fence
        assert header == await store.get_header(KEY)
        await rejected(store, KEY, StaleFenceError,
                       commit(store, KEY, W1, fence, ClaimNode(node_id="n0")))
        await rejected(store, KEY, StaleFenceError, store.release_lease(
            ReleaseLeaseRequest(key=KEY, worker_id=W1, fence=fence, now=T0)))
        taken = await acquire(store, KEY, W2, now=T0 + timedelta(seconds=2))
        assert taken == fence + 1

    async def test_terminal_task_cannot_be_leased(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await commit(store, KEY, W1, fence, SetStatus(status="completed", release_lease=True))
        header = await store.get_header(KEY)
        assert header is not None and header.lease is None and header.status == "completed"
        for worker in (W1, W2):
            await rejected(store, KEY, InvalidTransitionError,
                           acquire(store, KEY, worker))

    async def test_lease_acquisitions_are_journaled(self, store: DurableTaskStore) -> None:
        await self.create(store)
        f1 = await acquire(store, KEY, W1, ttl=1)
        f2 = await acquire(store, KEY, W2, now=T0 + timedelta(seconds=1), ttl=1)
        leases = [e for e in await read_timeline(store, KEY) if e.kind == "lease_acquired"]
        assert [(e.fence, e.data.get("worker_id")) for e in leases] == [(f1, W1), (f2, W2)]
        assert leases[1].data.get("previous_owner") == W1
        assert leases[1].at == T0 + timedelta(seconds=1)

    async def test_concurrent_acquires_grant_exactly_one_lease(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        workers = [f"racer-{i}" for i in range(10)]
        results = await asyncio.gather(
            *(acquire(store, KEY, w) for w in workers), return_exceptions=True)
        winners = [w for w, r in zip(workers, results, strict=True) if isinstance(r, int)]
        assert len(winners) == 1, results
        losers = [r for r in results if not isinstance(r, int)]
        assert all(isinstance(r, LeaseHeldError) and r.holder == winners[0] for r in losers)
        header = await store.get_header(KEY)
        assert header is not None and header.lease is not None
        assert (header.lease.owner, header.fence) == (winners[0], 1)

    async def test_concurrent_acquires_of_one_worker_get_distinct_fences(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        fences = await asyncio.gather(*(acquire(store, KEY, W1) for _ in range(10)))
        assert sorted(fences) == list(range(1, 11))
        header = await store.get_header(KEY)
        assert header is not None and header.fence == 10


class CancelTests(SuiteBase):
    """request_cancel touches only the cancel request and never conflicts with the owner."""

    async def test_cancel_is_recorded_once_and_the_first_reason_wins(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        header = await store.request_cancel(CancelTaskRequest(key=KEY, reason="first", now=T0))
        assert header.cancel is not None
        assert (header.cancel.reason, header.cancel.requested_at) == ("first", T0)
        assert header == await store.get_header(KEY)
        before = await capture(store, KEY)
        again = await store.request_cancel(CancelTaskRequest(
            key=KEY, reason="second", now=T0 + timedelta(seconds=1)))
        assert again.cancel is not None and again.cancel.reason == "first"
        assert await capture(store, KEY) == before

    async def test_cancel_does_not_conflict_with_the_owner_and_shows_in_renew(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await store.request_cancel(CancelTaskRequest(key=KEY, reason="stop", now=T0))
        header = await store.get_header(KEY)
        assert header is not None and header.fence == fence
        assert header.lease is not None and header.lease.owner == W1
        # The owner's fence is still current: it commits, then learns of the cancel.
        result = await commit(store, KEY, W1, fence, ClaimNode(node_id="n0"))
        assert result.header.cancel is not None and result.header.cancel.reason == "stop"
        status = await store.renew_lease(RenewLeaseRequest(
            key=KEY, worker_id=W1, fence=fence, ttl_seconds=30, now=T0))
        assert status.cancel is not None
        assert (status.cancel.reason, status.cancel.requested_at) == ("stop", T0)
        await commit(store, KEY, W1, fence, SetStatus(status="canceled", release_lease=True))
        final = await store.get_header(KEY)
        assert final is not None and final.status == "canceled"

    async def test_cancel_before_the_lease_is_visible_to_the_next_holder(
            self, store: DurableTaskStore) -> None:
        await self.create(store)
        await store.request_cancel(CancelTaskRequest(key=KEY, reason="early", now=T0))
        grant = await store.acquire_lease(AcquireLeaseRequest(
            key=KEY, worker_id=W1, ttl_seconds=30, now=T0))
        assert grant.header.cancel is not None and grant.header.cancel.reason == "early"

    async def test_cancel_of_a_terminal_task_changes_nothing(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await commit(store, KEY, W1, fence, SetStatus(status="completed"))
        before = await capture(store, KEY)
        header = await store.request_cancel(CancelTaskRequest(key=KEY, reason="late", now=T0))
        assert header.cancel is None and header.status == "completed"
        assert await capture(store, KEY) == before

    async def test_cancel_racing_owner_commits_loses_nothing(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        commits = [commit(store, KEY, W1, fence,
                          Charge(admission_id=f"adm-{i}", charges={"tool_calls": 1}))
                   for i in range(10)]
        cancel = store.request_cancel(CancelTaskRequest(key=KEY, reason="race", now=T0))
        await asyncio.gather(*commits[:5], cancel, *commits[5:])
        header = await store.get_header(KEY)
        assert header is not None
        assert header.counters["tool_calls"] == 10
        assert header.cancel is not None and header.cancel.reason == "race"
        assert header.fence == fence
