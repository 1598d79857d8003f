"""HttpActionConnector against a real local server: dispatch, dedupe, lookup, lost receipts."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

import pytest
from http_support import make_request

from agentium_graph import Absent, ActionOutcome, DurableActionConnector, ToolBinding, Unknown
from agentium_graph_http import (
    HttpActionConnector,
    HttpConnectorError,
    HttpNetworkError,
    HttpRejectedError,
    HttpResponseError,
    HttpServerError,
    HttpTimeoutError,
    HttpTransientError,
)
from agentium_graph_http.testing import IdempotentTestServer

Connect = Callable[..., HttpActionConnector]


async def test_dispatch_sends_args_under_the_action_id_as_idempotency_key(
        server: IdempotentTestServer, connect: Connect) -> None:
    request = make_request(args={"amount": 700, "currency": "usd"})
    outcome = await connect().dispatch(request)

    assert outcome.result_ref == request.result_ref == request.action_id
    assert outcome.output["idempotency_key"] == request.action_id
    assert outcome.output["request"] == {"amount": 700, "currency": "usd"}
    assert server.accepted_for(request.action_id) == 1
    assert server.response_for(request.action_id) == outcome.output


async def test_replay_with_the_same_key_is_deduped(server: IdempotentTestServer,
                                                   connect: Connect) -> None:
    connector = connect()
    request = make_request()
    first = await connector.dispatch(request)
    second = await connector.dispatch(request)

    assert first == second
    assert server.accepted_count == 1
    assert server.replay_count == 1


async def test_same_key_with_other_args_is_a_permanent_rejection(
        server: IdempotentTestServer, connect: Connect) -> None:
    connector = connect()
    await connector.dispatch(make_request("act_reused", args={"amount": 1}))
    with pytest.raises(HttpRejectedError) as info:
        await connector.dispatch(make_request("act_reused", args={"amount": 2}))

    assert info.value.status == 422
    assert info.value.may_have_taken_effect is False
    assert "idempotency_key_reused" in (info.value.body_excerpt or "")
    assert server.accepted_count == 1


async def test_lookup_finds_the_dispatched_outcome(connect: Connect) -> None:
    connector = connect()
    request = make_request()
    outcome = await connector.dispatch(request)

    assert await connector.resolve_result(request.result_ref) == outcome


async def test_lookup_of_a_never_accepted_key_is_absent(server: IdempotentTestServer,
                                                        connect: Connect) -> None:
    assert await connect().resolve_result("act_never_sent") == Absent()
    assert server.lookup_count == 1


async def test_lookup_503_is_unknown(server: IdempotentTestServer, connect: Connect) -> None:
    connector = connect()
    request = make_request()
    await connector.dispatch(request)
    server.fail_lookups(1)

    result = await connector.resolve_result(request.result_ref)
    assert isinstance(result, Unknown)
    assert "503" in result.reason
    assert isinstance(await connector.resolve_result(request.result_ref), ActionOutcome)


async def test_lookup_retries_are_bounded(server: IdempotentTestServer,
                                          connect: Connect) -> None:
    connector = connect(lookup_attempts=3)
    request = make_request()
    outcome = await connector.dispatch(request)

    server.fail_lookups(2)
    assert await connector.resolve_result(request.result_ref) == outcome
    server.fail_lookups(3)
    assert isinstance(await connector.resolve_result(request.result_ref), Unknown)
    assert server.lookup_count == 1 + 3 + 3 - 1


async def test_lookup_timeout_is_unknown(server: IdempotentTestServer,
                                         connect: Connect) -> None:
    connector = connect(lookup_timeout_s=0.2)
    server.hang_lookups(1)
    try:
        result = await connector.resolve_result("act_any")
    finally:
        server.release_hung()

    assert isinstance(result, Unknown)
    assert "http_timeout" in result.reason


async def test_lost_receipt_is_transient_and_lookup_recovers_it(
        server: IdempotentTestServer, connect: Connect) -> None:
    connector = connect(idempotent_destination=False)
    request = make_request()
    server.drop_response_after_accept(1)

    with pytest.raises(HttpNetworkError) as info:
        await connector.dispatch(request)
    assert isinstance(info.value, HttpTransientError)
    assert info.value.may_have_taken_effect is True
    assert server.post_count == 1  # never resent against a non-idempotent destination

    outcome = await connector.resolve_result(request.result_ref)
    assert isinstance(outcome, ActionOutcome)
    assert outcome.output["idempotency_key"] == request.action_id
    assert server.accepted_count == 1


async def test_idempotent_destination_resends_under_the_same_key(
        server: IdempotentTestServer, connect: Connect) -> None:
    connector = connect(idempotent_destination=True, dispatch_attempts=3)
    request = make_request()
    server.drop_response_after_accept(1)

    outcome = await connector.dispatch(request)
    assert outcome.output["idempotency_key"] == request.action_id
    assert server.post_count == 2
    assert server.accepted_count == 1
    assert server.replay_count == 1


async def test_transient_failures_are_retried_only_when_idempotent(
        server: IdempotentTestServer, connect: Connect) -> None:
    server.fail_posts_before_accept(1, status=503)
    with pytest.raises(HttpServerError) as info:
        await connect(idempotent_destination=False).dispatch(make_request("act_once"))
    assert info.value.status == 503
    assert info.value.may_have_taken_effect is True
    assert server.accepted_count == 0
    assert await connect().resolve_result("act_once") == Absent()

    server.fail_posts_before_accept(2, status=503)
    outcome = await connect(dispatch_attempts=3).dispatch(make_request("act_twice"))
    assert outcome.output["idempotency_key"] == "act_twice"
    assert server.post_count == 1 + 3


async def test_retries_give_up_after_dispatch_attempts(server: IdempotentTestServer,
                                                       connect: Connect) -> None:
    server.fail_posts_before_accept(None, status=429)
    with pytest.raises(HttpServerError) as info:
        await connect(dispatch_attempts=2).dispatch(make_request())
    assert info.value.status == 429
    assert info.value.may_have_taken_effect is False
    assert server.post_count == 2


async def test_4xx_is_a_permanent_typed_error_and_never_retried(
        server: IdempotentTestServer, connect: Connect) -> None:
    server.fail_posts_before_accept(1, status=402)
    with pytest.raises(HttpRejectedError) as info:
        await connect(dispatch_attempts=3).dispatch(make_request())

    error = info.value
    assert (error.code, error.status, error.may_have_taken_effect) == ("http_rejected", 402,
                                                                       False)
    assert "unavailable" in (error.body_excerpt or "")
    assert error.details["status"] == 402
    assert server.post_count == 1


async def test_non_json_success_body_is_a_typed_error(server: IdempotentTestServer,
                                                      connect: Connect) -> None:
    connector = connect()
    request = make_request()
    server.respond_non_json_after_accept(1)

    with pytest.raises(HttpResponseError) as info:
        await connector.dispatch(request)
    assert info.value.may_have_taken_effect is True
    assert info.value.status == 200
    assert "<html>" in (info.value.body_excerpt or "")
    assert server.post_count == 1
    assert isinstance(await connector.resolve_result(request.result_ref), ActionOutcome)
    assert server.accepted_count == 1


async def test_dispatch_timeout_is_transient_and_reconcilable(
        server: IdempotentTestServer, connect: Connect) -> None:
    # Only the dispatch needs the short timeout: the lookup after it gets time to answer.
    connector = connect(timeout_s=0.2, lookup_timeout_s=5.0, idempotent_destination=False)
    request = make_request()
    server.hang_posts(1, after_accept=True)
    try:
        with pytest.raises(HttpTimeoutError) as info:
            await connector.dispatch(request)
    finally:
        server.release_hung()

    assert info.value.may_have_taken_effect is True
    assert isinstance(await connector.resolve_result(request.result_ref), ActionOutcome)
    assert server.accepted_count == 1


async def test_unreachable_server_was_never_sent() -> None:
    # Port 1 (tcpmux) is closed here; a stopped server's port could be reused by then.
    connector = HttpActionConnector("http://127.0.0.1:1", idempotent_destination=False,
                                    timeout_s=2.0)
    async with connector:
        with pytest.raises(HttpNetworkError) as info:
            await connector.dispatch(make_request())
        assert info.value.may_have_taken_effect is False
        result = await connector.resolve_result("act_any")
    assert isinstance(result, Unknown)


async def test_destination_must_be_the_create_path(server: IdempotentTestServer,
                                                   connect: Connect) -> None:
    connector = connect()
    assert connector.destination == "/charges"
    await connector.dispatch(make_request(destination="charges"))
    with pytest.raises(HttpConnectorError) as info:
        await connector.dispatch(make_request(destination="/refunds"))

    assert type(info.value) is HttpConnectorError
    assert info.value.may_have_taken_effect is False
    assert server.post_count == 1


async def test_result_ref_must_be_the_idempotency_key(server: IdempotentTestServer,
                                                      connect: Connect) -> None:
    with pytest.raises(HttpConnectorError, match="result_ref"):
        await connect().dispatch(make_request("act_a", result_ref="other"))
    with pytest.raises(HttpConnectorError, match="Idempotency-Key"):
        await connect().dispatch(make_request("act with spaces"))
    assert server.post_count == 0
    assert isinstance(await connect().resolve_result("bad key\n"), Unknown)


async def test_cancellation_propagates_from_dispatch(server: IdempotentTestServer,
                                                     connect: Connect) -> None:
    connector = connect(dispatch_attempts=3)
    server.hang_posts(1)
    task = asyncio.create_task(connector.dispatch(make_request()))
    try:
        await asyncio.to_thread(server.wait_for_hung, 1, timeout=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        server.release_hung()
    assert task.cancelled()
    await connector.dispatch(make_request())  # still usable afterwards


async def test_cancellation_propagates_from_resolve_result(server: IdempotentTestServer,
                                                           connect: Connect) -> None:
    connector = connect(lookup_attempts=3)
    server.hang_lookups(1)
    task = asyncio.create_task(connector.resolve_result("act_any"))
    try:
        await asyncio.to_thread(server.wait_for_hung, 1, timeout=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        server.release_hung()
    assert task.cancelled()


async def test_concurrent_dispatches_accept_each_key_once(server: IdempotentTestServer,
                                                          connect: Connect) -> None:
    connector = connect()
    requests = [make_request(f"act_c{i}") for i in range(10)]
    await asyncio.gather(*(connector.dispatch(r) for r in requests + requests))

    assert server.accepted_counts() == {r.action_id: 1 for r in requests}


async def test_it_is_a_durable_action_connector_bound_to_a_tool(connect: Connect) -> None:
    connector: DurableActionConnector = connect(id="payments", version="3")
    binding = ToolBinding(id="charge", version="1", connector=connector,
                          destination=connect().destination)
    descriptor = binding.descriptor()

    assert (descriptor.connector_id, descriptor.connector_version) == ("payments", "3")
    assert descriptor.idempotent_destination is True


def test_usable_from_successive_event_loops(server: IdempotentTestServer) -> None:
    connector = server.connector()  # e.g. a module-level connector behind runtime.run_sync
    request = make_request()
    for _ in range(3):
        outcome = asyncio.run(connector.dispatch(request))
        gc.collect()  # a client left bound to a closed loop would warn here
    assert asyncio.run(connector.resolve_result(request.result_ref)) == outcome
    asyncio.run(connector.aclose())
    gc.collect()
    assert server.accepted_count == 1
