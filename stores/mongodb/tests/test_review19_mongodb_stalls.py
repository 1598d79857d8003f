"""A driver call that never ends, or fails inside the driver, must not hang the worker
(found by review 19).

With eight runs sharing one client and the server SIGKILLed under them, pymongo 4.20's
async pool (Python 3.11) was seen to deadlock on its own lock: calls waited for ever and
ignored cancellation, so `run` never returned and its lease keeper never stopped. Each
driver call now runs in a task of its own, bounded as a whole; a stalled one is abandoned,
reported as StoreUnavailableError, and a client the store made itself is replaced."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from mongodb_helpers import create_request
from pymongo import AsyncMongoClient
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import AutoReconnect
from pymongo.errors import ConfigurationError as DriverConfigurationError

from agentium_graph.errors import StoreSchemaError, StoreUnavailableError
from agentium_graph_mongodb import MongoDBDurableTaskStore, _client, _loops, _store
from agentium_graph_mongodb._errors import TransientStoreError, is_transient, map_mongo_error
from agentium_graph_mongodb.testing import open_store

STALL_S = 0.5


class Stubborn:
    """Replaces AsyncCollection.find_one: the next ``stalls`` calls never answer and
    swallow every cancellation (as a call deadlocked on the driver's pool lock does), until
    the test ends; later calls go to the real method."""

    def __init__(self, stalls: int = 1) -> None:
        self.stalls = stalls
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancels = 0
        self.calls = 0  # calls it stalled
        self.real: Callable[..., Any] = AsyncCollection.find_one

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        stubborn = self

        async def find_one(collection: AsyncCollection[Any], *args: Any,
                           **kwargs: Any) -> Any:
            if stubborn.stalls <= 0:
                return await stubborn.real(collection, *args, **kwargs)
            stubborn.stalls -= 1
            stubborn.calls += 1
            stubborn.started.set()
            while not stubborn.release.is_set():
                try:
                    await stubborn.release.wait()
                except asyncio.CancelledError:
                    stubborn.cancels += 1  # ignored, like a task stuck reacquiring a lock
            return None

        monkeypatch.setattr(AsyncCollection, "find_one", find_one)


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole-call bound of STALL_S instead of the clients' (five seconds or more)."""
    monkeypatch.setattr(_store, "call_deadline", lambda client: STALL_S)


@pytest.fixture
async def stubborn(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stubborn]:
    stuck = Stubborn()
    yield stuck
    stuck.release.set()  # the abandoned calls end with the test
    await asyncio.sleep(0)


async def _created(store: MongoDBDurableTaskStore, key: str) -> None:
    await store.create_task(create_request(key))


# --- the bound of one call ------------------------------------------------------------------

async def test_call_deadline_is_the_clients_timeouts_together() -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        "mongodb://127.0.0.1:1/?directConnection=true", serverSelectionTimeoutMS=2000,
        connectTimeoutMS=3000, socketTimeoutMS=4000, connect=False)
    unbounded: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        "mongodb://127.0.0.1:1/?directConnection=true", socketTimeoutMS=0, connect=False)
    # selection + connect + two replies + 5 s
    assert _client.call_deadline(client) == pytest.approx(2 + 3 + 2 * 4 + 5)
    assert _client.call_deadline(unbounded) is None  # the client waits for ever: so do we
    store = MongoDBDurableTaskStore("mongodb://127.0.0.1:1/?directConnection=true")
    made = _client._client_from_uri("mongodb://127.0.0.1:1/?directConnection=true",
                                   *store._client_options)
    try:
        assert _client.call_deadline(made) == pytest.approx(5 + 5 + 2 * 20 + 5)
    finally:
        for opened in (client, unbounded, made):
            await opened.close()
        await store.close()


async def test_a_stalled_call_ends_typed_and_the_store_replaces_its_client(
        mongodb_uri: str, mongodb_database: str, short_deadline: None,
        stubborn: Stubborn, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(mongodb_uri, mongodb_database, retries=3) as store:
        await _created(store, "stall")
        old = store._state().client
        store._state().cache.clear()
        stubborn.install(monkeypatch)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            await store.get_header("stall")
        elapsed = time.monotonic() - started
        # Abandoned after its bound, once: not retried on the stuck client, and not waited
        # for after the cancel it ignored (a loaded machine may add seconds, not a stall).
        assert STALL_S <= elapsed < 10.0
        assert stubborn.calls == 1
        assert not isinstance(info.value, TransientStoreError)
        assert info.value.details["driver_error"] == "stalled"
        assert info.value.details["client_replaced"] is True
        assert "get_header gave no answer" in str(info.value)
        assert "run the task again" in str(info.value)
        await asyncio.sleep(0.05)
        assert stubborn.cancels >= 1  # it was cancelled, and ignored that
        assert store._state().client is not old
        header = await store.get_header("stall")  # through the new client
        assert header is not None and header.key == "stall"


async def test_a_stalled_call_on_a_given_client_says_to_replace_it(
        mongodb_uri: str, mongodb_database: str, short_deadline: None,
        stubborn: Stubborn, monkeypatch: pytest.MonkeyPatch) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongodb_uri)
    try:
        store = MongoDBDurableTaskStore(client, database=mongodb_database)
        await _created(store, "given")
        store._state().cache.clear()
        stubborn.install(monkeypatch)
        with pytest.raises(StoreUnavailableError) as info:
            await store.get_header("given")
        assert info.value.details["client_replaced"] is False
        assert "close the AsyncMongoClient you passed" in str(info.value)
        assert store._state().client is client  # the caller's client is never swapped
    finally:
        await client.close()


async def test_a_cancelled_caller_is_not_held_by_a_call_that_ignores_cancellation(
        mongodb_uri: str, mongodb_database: str, stubborn: Stubborn,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(mongodb_uri, mongodb_database) as store:
        await _created(store, "cancel")
        store._state().cache.clear()
        stubborn.install(monkeypatch)
        reader = asyncio.ensure_future(store.get_header("cancel"))
        await asyncio.wait_for(stubborn.started.wait(), 10)
        reader.cancel()
        done, _ = await asyncio.wait((reader,), timeout=2)
        assert reader in done and reader.cancelled()


# --- failures inside the driver -------------------------------------------------------------

def _raiser_from(filename: str) -> Callable[..., Any]:
    """A find_one replacement whose RuntimeError is raised by code in ``filename``."""
    namespace: dict[str, Any] = {}
    exec(compile("async def find_one(*args, **kwargs):\n"
                 "    raise RuntimeError('cannot wait on un-acquired lock')\n",
                 filename, "exec"), namespace)
    found: Callable[..., Any] = namespace["find_one"]
    return found


async def test_a_runtime_error_inside_the_driver_is_transient_and_retried(
        mongodb_uri: str, mongodb_database: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(mongodb_uri, mongodb_database, retries=2,
                          retry_max_wait_s=0.01) as store:
        await _created(store, "driver")
        store._state().cache.clear()
        monkeypatch.setattr(AsyncCollection, "find_one",
                            _raiser_from("/venv/site-packages/pymongo/asynchronous/pool.py"))
        before = store.stats.transient_retries
        with pytest.raises(StoreUnavailableError) as info:
            await store.get_header("driver")
        assert "3 attempt(s)" in str(info.value)
        assert "inside the MongoDB driver" in str(info.value)
        assert info.value.details["driver_error"] == "RuntimeError"
        assert store.stats.transient_retries - before == 2


async def test_a_runtime_error_outside_the_driver_is_not_disguised(
        mongodb_uri: str, mongodb_database: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(mongodb_uri, mongodb_database) as store:
        await _created(store, "ours")
        store._state().cache.clear()
        monkeypatch.setattr(AsyncCollection, "find_one", _raiser_from("/app/host_code.py"))
        with pytest.raises(RuntimeError, match="un-acquired lock"):
            await store.get_header("ours")


# --- mongodb+srv:// names that do not resolve -----------------------------------------------

@pytest.mark.parametrize("text", [
    "The DNS query name does not exist: _mongodb._tcp.cluster0.nosuch.example.",
    "The resolution lifetime expired after 20.0 seconds",
    "The DNS operation timed out.",
])
def test_an_srv_name_that_does_not_resolve_is_transient_with_a_hint(text: str) -> None:
    error = DriverConfigurationError(text)
    assert is_transient(error)
    mapped = map_mongo_error(error, "get_header", "mongodb+srv://cluster0.nosuch.example/")
    assert isinstance(mapped, TransientStoreError)
    assert "did not resolve" in str(mapped) and "DNS" in str(mapped)


def test_other_driver_configuration_errors_stay_permanent() -> None:
    error = DriverConfigurationError("Unknown option fooBar")
    assert not is_transient(error)
    assert not isinstance(map_mongo_error(error, "get_header", "x"), TransientStoreError)


# --- a database that holds someone else's collections ---------------------------------------

@pytest.mark.parametrize("collection", ["tasks", "journal", "blobs", "meta"])
async def test_a_database_with_foreign_documents_is_not_stamped(
        mongodb_uri: str, mongodb_database: str, raw_db: Any, collection: str) -> None:
    await raw_db[collection].insert_one({"_id": "someone-else", "order": 7})
    async with open_store(mongodb_uri, mongodb_database) as store:
        with pytest.raises(StoreSchemaError) as info:
            await store.create_task(create_request("k"))
    assert info.value.details["collection"] == collection
    assert info.value.details["reason"] == "foreign_database"
    assert "database of its own" in str(info.value)
    # Nothing was written: no meta document, no index, the foreign document untouched.
    assert await raw_db.meta.find_one({"_id": "agentium-graph-mongodb"}) is None
    assert sorted(await raw_db.list_collection_names()) == [collection]
    assert [info["name"] for info in await (await raw_db[collection].list_indexes())
            .to_list()] == ["_id_"]
    assert await raw_db[collection].find_one({"_id": "someone-else"}) == {
        "_id": "someone-else", "order": 7}


async def test_stores_stamping_a_new_database_together_are_not_refused(
        mongodb_uri: str, mongodb_database: str) -> None:
    stores = [open_store(mongodb_uri, mongodb_database) for _ in range(6)]
    try:
        results = await asyncio.gather(*[s.create_task(create_request(f"k{i}"))
                                         for i, s in enumerate(stores)])
        assert all(result.created for result in results)
    finally:
        for opened in stores:
            await opened.close()


async def test_a_healthy_call_beside_a_stalled_one_survives_the_replacement(
        mongodb_uri: str, mongodb_database: str, short_deadline: None,
        stubborn: Stubborn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review 26: the replaced client was closed at once, under another task's
    call still running on it, which then failed with a permanent StoreError ('the MongoDB
    client is closed or unusable; create a new MongoDBDurableTaskStore'). The old client
    is closed once the operations using it ended."""
    async with open_store(mongodb_uri, mongodb_database, retries=3) as store:
        await _created(store, "stall")
        await _created(store, "healthy")
        store._state().cache.clear()
        old = store._state().client
        real = AsyncCollection.find_one
        stubborn.install(monkeypatch)
        stuck = AsyncCollection.find_one

        async def find_one(collection: AsyncCollection[Any], flt: Any = None, *args: Any,
                           **kwargs: Any) -> Any:
            if (flt or {}).get("_id") == "healthy":  # slow, in flight when the other stalls
                await asyncio.sleep(STALL_S * 0.9)
                return await real(collection, flt, *args, **kwargs)
            return await stuck(collection, flt, *args, **kwargs)

        monkeypatch.setattr(AsyncCollection, "find_one", find_one)

        async def healthy() -> Any:
            await stubborn.started.wait()
            await asyncio.sleep(STALL_S * 0.6)  # still running when the replacement happens
            return await store.get_header("healthy")

        stalled, header = await asyncio.gather(store.get_header("stall"), healthy(),
                                               return_exceptions=True)
        assert isinstance(stalled, StoreUnavailableError)
        assert stalled.details["client_replaced"] is True
        assert not isinstance(header, BaseException), header
        assert header is not None and header.key == "healthy"
        assert store._state().client is not old


async def test_a_stall_of_an_operation_on_the_replaced_client_keeps_the_new_one(
        mongodb_uri: str, mongodb_database: str, short_deadline: None,
        stubborn: Stubborn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review 29: an operation begun on the old client (a retry after a transient
    failure) that stalled there too compared against the new client and replaced it."""
    async with open_store(mongodb_uri, mongodb_database, retries=3) as store:
        await _created(store, "stall")
        await _created(store, "b")
        store._state().cache.clear()
        old = store._state().client
        real = AsyncCollection.find_one
        b_calls = 0

        async def stuck() -> None:
            while not stubborn.release.is_set():
                with contextlib.suppress(asyncio.CancelledError):  # ignored, as the pool's
                    await stubborn.release.wait()

        async def find_one(collection: AsyncCollection[Any], flt: Any = None, *args: Any,
                           **kwargs: Any) -> Any:
            nonlocal b_calls
            key = (flt or {}).get("_id")
            if collection.database.client is old and key == "stall":
                return await stuck()
            if key == "b":
                b_calls += 1
                if b_calls == 1:  # healthy but slow, then a transient failure: retried
                    await asyncio.sleep(STALL_S * 0.8)
                    raise AutoReconnect("blip")
                if collection.database.client is old:
                    return await stuck()  # the retry, still on the old session: stuck too
            return await real(collection, flt, *args, **kwargs)

        monkeypatch.setattr(AsyncCollection, "find_one", find_one)

        async def b() -> Any:
            await asyncio.sleep(STALL_S * 0.5)
            return await store.get_header("b")

        first, second = await asyncio.gather(store.get_header("stall"), b(),
                                             return_exceptions=True)
        assert isinstance(first, StoreUnavailableError)
        assert first.details["client_replaced"] is True
        assert isinstance(second, StoreUnavailableError)
        assert second.details["client_replaced"] is False
        fresh = store._state().client
        assert fresh is not old
        header = await store.get_header("b")  # the one replacement still serves
        assert header is not None and store._state().client is fresh


async def test_close_closes_a_replaced_client_still_in_use(
        mongodb_uri: str, mongodb_database: str, short_deadline: None,
        stubborn: Stubborn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review 29: close() gave a replaced client's closing 6 s while that closing
    waited for its operations up to twice a call's bound; the loop then ended and the old
    client was never closed."""
    monkeypatch.setattr(_loops, "RETIRE_WAIT_S", 0.2)
    store = open_store(mongodb_uri, mongodb_database, retries=0)
    await _created(store, "stall")
    await _created(store, "h")
    state = store._state()
    state.cache.clear()
    old = state.client
    real = AsyncCollection.find_one
    stubborn.install(monkeypatch)
    stuck = AsyncCollection.find_one
    healthy_started = asyncio.Event()

    async def find_one(collection: AsyncCollection[Any], flt: Any = None, *args: Any,
                       **kwargs: Any) -> Any:
        if (flt or {}).get("_id") == "h":  # a long healthy call on the old client
            healthy_started.set()
            await asyncio.sleep(STALL_S * 0.95)
            return await real(collection, flt, *args, **kwargs)
        return await stuck(collection, flt, *args, **kwargs)

    monkeypatch.setattr(AsyncCollection, "find_one", find_one)

    async def healthy() -> Any:
        await stubborn.started.wait()
        return await store.get_header("h")

    stall = asyncio.ensure_future(store.get_header("stall"))
    in_use = asyncio.ensure_future(healthy())
    with pytest.raises(StoreUnavailableError):
        await stall
    assert old is not store._state().client
    await healthy_started.wait()
    await store.close()  # the healthy call still runs on the old client
    assert not state.retiring
    assert old._closed  # type: ignore[attr-defined]
    in_use.cancel()
    with contextlib.suppress(BaseException):
        await in_use
