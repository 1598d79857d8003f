"""Conformance: admission charges (idempotent per admission id, never above a limit)."""

from __future__ import annotations

import asyncio
from collections import Counter

from agentium_graph.errors import BudgetExhaustedError, InvalidTransitionError
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._requests import Charge, CommitResult
from agentium_graph.testing._base import KEY, W1, SuiteBase, rejected
from agentium_graph.testing._fixtures import acquire, commit, read_timeline
from agentium_graph.testing._harness import StoreHarness


def _charge(admission: str, amount: int = 1, counter: str = "tool_calls") -> Charge:
    return Charge(admission_id=admission, charges={counter: amount})


class AdmissionTests(SuiteBase):
    """Counters persist with the commit, are charged once per admission id, never refunded."""

    async def counters(self, store: DurableTaskStore) -> dict[str, int]:
        header = await store.get_header(KEY)
        assert header is not None
        return header.counters

    async def test_an_admission_id_is_charged_once(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        first = await commit(store, KEY, W1, fence, _charge("adm-1", 3))
        assert (first.charged, first.already_charged) == (("adm-1",), ())
        again = await commit(store, KEY, W1, fence, _charge("adm-1", 3))
        assert (again.charged, again.already_charged) == ((), ("adm-1",))
        same_commit = await commit(store, KEY, W1, fence, _charge("adm-2"), _charge("adm-2"))
        assert same_commit.charged == ("adm-2",)
        assert (await self.counters(store))["tool_calls"] == 4
        charged = [e.data.get("admission_id") for e in await read_timeline(store, KEY)
                   if e.kind == "admission_charged"]
        assert charged == ["adm-1", "adm-2"]

    async def test_an_unlimited_counter_stops_at_the_largest_int64(
            self, store: DurableTaskStore) -> None:
        """Every store can hold a counter up to 2**63-1 (MongoDB's integers are int64): a
        charge past it is refused like one past a limit, and changes nothing."""
        fence = await self.leased(store)
        top = 2**63 - 1
        await commit(store, KEY, W1, fence, _charge("a", top - 1, "input_tokens"))
        error = await rejected(store, KEY, BudgetExhaustedError, commit(
            store, KEY, W1, fence, _charge("b", 2, "input_tokens")))
        assert (error.counter, error.limit) == ("input_tokens", top)
        await commit(store, KEY, W1, fence, _charge("c", 1, "input_tokens"))
        assert (await self.counters(store))["input_tokens"] == top

    async def test_admission_ids_survive_a_new_lease(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await commit(store, KEY, W1, fence, _charge("adm-1"))
        newer = await acquire(store, KEY, W1)
        result = await commit(store, KEY, W1, newer, _charge("adm-1"))
        assert result.already_charged == ("adm-1",)
        assert (await self.counters(store))["tool_calls"] == 1

    async def test_a_charge_may_reach_but_never_exceed_the_limit(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, limits={"tool_calls": 3})
        await commit(store, KEY, W1, fence, _charge("a", 2))
        error = await rejected(store, KEY, BudgetExhaustedError,
                               commit(store, KEY, W1, fence, _charge("b", 2)))
        assert (error.counter, error.limit) == ("tool_calls", 3)
        await commit(store, KEY, W1, fence, _charge("c", 1))
        assert (await self.counters(store))["tool_calls"] == 3
        await rejected(store, KEY, BudgetExhaustedError,
                       commit(store, KEY, W1, fence, _charge("d", 1)))
        # An already-charged id is not a new charge, even at the limit.
        result = await commit(store, KEY, W1, fence, _charge("a", 2))
        assert result.already_charged == ("a",)

    async def test_a_charge_over_one_limit_charges_no_counter(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, limits={"model_calls": 1, "output_tokens": 100})
        both = Charge(admission_id="m", charges={"model_calls": 1, "output_tokens": 101})
        error = await rejected(store, KEY, BudgetExhaustedError,
                               commit(store, KEY, W1, fence, both))
        assert error.counter == "output_tokens"
        counters = await self.counters(store)
        assert (counters["model_calls"], counters["output_tokens"]) == (0, 0)

    async def test_negative_charges_are_rejected(self, store: DurableTaskStore) -> None:
        fence = await self.leased(store)
        await commit(store, KEY, W1, fence, _charge("a", 2))
        await rejected(store, KEY, InvalidTransitionError,
                       commit(store, KEY, W1, fence, _charge("refund", -1)))

    async def test_concurrent_charges_never_exceed_the_limit(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, limits={"tool_calls": 20})
        results = await asyncio.gather(
            *(commit(store, KEY, W1, fence, _charge(f"adm-{i}")) for i in range(50)),
            return_exceptions=True)
        self.check_race(results, await self.counters(store), limit=20, attempts=50)
        charged = [e for e in await read_timeline(store, KEY) if e.kind == "admission_charged"]
        assert len(charged) == 20

    async def test_concurrent_charges_through_two_handles_never_exceed_the_limit(
            self, store: DurableTaskStore, harness: StoreHarness) -> None:
        fence = await self.leased(store, limits={"tool_calls": 20})
        other = await harness.open()
        results = await asyncio.gather(*(
            commit(store if i % 2 else other, KEY, W1, fence, _charge(f"adm-{i}"))
            for i in range(50)), return_exceptions=True)
        self.check_race(results, await self.counters(other), limit=20, attempts=50)

    def check_race(self, results: list[CommitResult | BaseException],
                   counters: dict[str, int], *, limit: int, attempts: int) -> None:
        kinds = Counter(type(r).__name__ for r in results)
        assert kinds == {"CommitResult": limit, "BudgetExhaustedError": attempts - limit}, kinds
        assert counters["tool_calls"] == limit

    async def test_concurrent_charges_of_one_admission_id_count_once(
            self, store: DurableTaskStore) -> None:
        fence = await self.leased(store, limits={"tool_calls": 5})
        results = await asyncio.gather(
            *(commit(store, KEY, W1, fence, _charge("same", 2)) for _ in range(20)))
        assert sum(len(r.charged) for r in results) == 1
        assert sum(len(r.already_charged) for r in results) == 19
        assert (await self.counters(store))["tool_calls"] == 2
