"""IdempotentTestServer keeps the contract connectors rely on, in and across processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from http_support import make_request

from agentium_graph import ActionOutcome, Unknown
from agentium_graph_http import HttpNetworkError, HttpTimeoutError
from agentium_graph_http.testing import IdempotentTestServer, read_server_state


def _post(client: httpx.Client, server: IdempotentTestServer, body: object,
          key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(f"{server.url}/charges", json=body, headers=headers)


def test_the_payments_api_contract(server: IdempotentTestServer) -> None:
    with httpx.Client() as client:
        assert _post(client, server, {"amount": 1}, None).status_code == 400
        assert _post(client, server, [1, 2], "k0").status_code == 400
        created = _post(client, server, {"amount": 1}, "k1")
        replayed = _post(client, server, {"amount": 1}, "k1")
        reused = _post(client, server, {"amount": 2}, "k1")
        found = client.get(f"{server.url}/charges/k1")
        missing = client.get(f"{server.url}/charges/k2")
        elsewhere = client.get(f"{server.url}/refunds/k1")

    assert created.status_code == 201
    assert (replayed.status_code, replayed.headers["idempotent-replayed"]) == (200, "true")
    assert replayed.json() == created.json() == found.json()
    assert reused.status_code == 422
    assert missing.status_code == elsewhere.status_code == 404
    assert server.accepted_counts() == {"k1": 1}
    assert (server.replay_count, server.post_count, server.lookup_count) == (1, 5, 2)


def test_without_dedupe_every_post_is_an_acceptance() -> None:
    with IdempotentTestServer(dedupe=False) as server, httpx.Client() as client:
        for _ in range(3):
            assert _post(client, server, {"amount": 1}, "k").status_code == 201
        assert server.accepted_for("k") == 3
        assert server.accepted_count == 3


def test_faults_count_down_or_stay_until_reset(server: IdempotentTestServer) -> None:
    with httpx.Client() as client:
        server.fail_lookups(2, status=500)
        statuses = [client.get(f"{server.url}/charges/x").status_code for _ in range(3)]
        assert statuses == [500, 500, 404]

        server.fail_posts_before_accept(None)
        statuses = [_post(client, server, {}, f"k{i}").status_code for i in range(3)]
        server.reset_faults()
        statuses.append(_post(client, server, {}, "k9").status_code)
        assert statuses == [503, 503, 503, 201]
    assert server.accepted_counts() == {"k9": 1}
    with pytest.raises(ValueError):
        server.fail_lookups(0)


def test_on_accept_runs_after_the_record_persists() -> None:
    seen: list[tuple[str, int]] = []
    server = IdempotentTestServer(on_accept=lambda key: seen.append((key,
                                                                    server.accepted_for(key))))
    with server, httpx.Client() as client:
        _post(client, server, {"amount": 1}, "k1")
        _post(client, server, {"amount": 1}, "k1")
    assert seen == [("k1", 1)]


def test_stop_releases_hung_requests(server: IdempotentTestServer) -> None:
    server.hang_lookups(None)
    errors: list[BaseException] = []

    def look() -> None:
        try:
            with httpx.Client(timeout=30) as client:
                client.get(f"{server.url}/charges/k")
        except httpx.HTTPError as exc:
            errors.append(exc)

    thread = threading.Thread(target=look)
    thread.start()
    server.wait_for_hung(1, timeout=5)
    server.stop()
    thread.join(timeout=10)  # the client would wait 30 s for a request stop() left hanging
    assert not thread.is_alive()


def test_wait_for_accepted_times_out(server: IdempotentTestServer) -> None:
    with pytest.raises(TimeoutError):
        server.wait_for_accepted(1, timeout=0.05)


def test_state_file_survives_a_restart_and_is_shared(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    with IdempotentTestServer(state_path=path) as first, httpx.Client() as client:
        created = _post(client, first, {"amount": 1}, "k1").json()
        with IdempotentTestServer(state_path=path) as second:
            assert _post(client, second, {"amount": 1}, "k1").json() == created
            assert _post(client, second, {"amount": 2}, "k2").status_code == 201
        assert client.get(f"{first.url}/charges/k2").status_code == 200
        first.wait_for_accepted(2, timeout=5)

    with IdempotentTestServer(state_path=path) as restarted, httpx.Client() as client:
        assert client.get(f"{restarted.url}/charges/k1").json() == created
    state = read_server_state(path)
    assert state.accepted == {"k1": 1, "k2": 1}
    assert (state.accepted_count, state.replays) == (2, 1)
    assert state.responses["k1"] == created


async def test_workers_in_fresh_processes_reach_it_by_url(server: IdempotentTestServer
                                                          ) -> None:
    script = (
        "import asyncio, sys\n"
        "from agentium_graph import ActionRequest\n"
        "from agentium_graph_http import HttpActionConnector\n"
        "async def main():\n"
        "    async with HttpActionConnector(sys.argv[1]) as c:\n"
        "        r = ActionRequest(action_id='act_p', result_ref='act_p', binding_id='b',\n"
        "                          binding_version='1', args={'n': 1}, destination='/charges',\n"
        "                          caller={})\n"
        "        print((await c.dispatch(r)).output['id'])\n"
        "asyncio.run(main())\n")
    async with server.connector() as here:
        await here.dispatch(make_request("act_p", args={"n": 1}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, server.url, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "ch_000001"
    assert server.accepted_counts() == {"act_p": 1}
    assert server.replay_count == 1


async def test_many_clients_at_once_keep_exact_counts(server: IdempotentTestServer) -> None:
    async with server.connector(retry_wait_s=0) as one, server.connector() as two:
        requests = [make_request(f"act_m{i}") for i in range(15)]
        await asyncio.gather(*(c.dispatch(r) for r in requests for c in (one, two)))
    assert server.accepted_count == 15
    assert server.replay_count == 15


async def test_a_failing_on_accept_hook_loses_the_response_and_is_reported() -> None:
    def boom(key: str) -> None:
        raise RuntimeError(f"harness hook failed for {key}")

    with IdempotentTestServer(on_accept=boom) as server:
        async with server.connector(idempotent_destination=False) as connector:
            request = make_request()
            with pytest.raises(HttpNetworkError):
                await connector.dispatch(request)
            assert isinstance(await connector.resolve_result(request.result_ref),
                              ActionOutcome)
    assert server.accepted_count == 1
    assert len(server.server_errors) == 1
    assert "harness hook failed" in server.server_errors[0]


def _post_in_thread(server: IdempotentTestServer, body: object, key: str,
                    out: list[int]) -> threading.Thread:
    def post() -> None:
        with httpx.Client(timeout=30) as client:
            out.append(_post(client, server, body, key).status_code)

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def test_a_key_is_in_flight_from_arrival_until_accepted(server: IdempotentTestServer) -> None:
    server.hang_posts(1)  # held before accepting
    statuses: list[int] = []
    thread = _post_in_thread(server, {"amount": 1}, "k1", statuses)
    try:
        server.wait_for_hung(1, timeout=10)
        with httpx.Client() as client:
            looked = client.get(f"{server.url}/charges/k1")
            again = _post(client, server, {"amount": 1}, "k1")
            other = client.get(f"{server.url}/charges/k2")
        assert server.state().in_flight == {"k1": 1}
    finally:
        server.release_hung()
        thread.join(timeout=30)

    assert looked.status_code == 409  # never 404 while the create may still happen
    assert looked.json()["error"]["code"] == "idempotency_key_in_flight"
    assert again.status_code == 409  # a second create with the key is not accepted
    assert other.status_code == 404
    assert statuses == [201]
    assert server.accepted_counts() == {"k1": 1}
    assert server.state().in_flight == {}
    with httpx.Client() as client:
        assert client.get(f"{server.url}/charges/k1").status_code == 200


async def test_a_slow_create_is_never_looked_up_as_absent(server: IdempotentTestServer
                                                          ) -> None:
    # The client gives up while the server still holds the create: the lookup must not
    # prove absence, since the charge is applied once the server goes on.
    async with server.connector(idempotent_destination=False, timeout_s=0.2,
                                lookup_timeout_s=5.0) as connector:
        request = make_request()
        server.hang_posts(1)
        try:
            with pytest.raises(HttpTimeoutError):
                await connector.dispatch(request)
            await asyncio.to_thread(server.wait_for_hung, 1, timeout=10)
            result = await connector.resolve_result(request.result_ref)
        finally:
            server.release_hung()
        assert isinstance(result, Unknown) and "409" in result.reason
        await asyncio.to_thread(server.wait_for_accepted, 1, timeout=10)
        assert isinstance(await connector.resolve_result(request.result_ref), ActionOutcome)
    assert server.accepted_for(request.action_id) == 1


def test_in_flight_keys_are_shared_through_the_state_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    statuses: list[int] = []
    with IdempotentTestServer(state_path=path) as first, \
            IdempotentTestServer(state_path=path) as second:
        first.hang_posts(1)
        thread = _post_in_thread(first, {"amount": 1}, "k1", statuses)
        try:
            first.wait_for_hung(1, timeout=10)
            with httpx.Client() as client:
                assert client.get(f"{second.url}/charges/k1").status_code == 409
                assert _post(client, second, {"amount": 1}, "k1").status_code == 409
            assert read_server_state(path).in_flight == {"k1": 1}
        finally:
            first.release_hung()
            thread.join(timeout=30)
    assert statuses == [201]
    state = read_server_state(path)
    assert (state.accepted, state.in_flight) == ({"k1": 1}, {})


def test_a_create_that_never_completes_stays_in_flight(tmp_path: Path) -> None:
    # A state file left by a server that died while holding a create (as a SIGKILLed
    # process would leave it): the key is in flight for good, never absent.
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"format": 1, "seq": 0, "records": {}, "accepted": {},
                                "replays": 0, "in_flight": {"k1": 1}}), "utf-8")
    with IdempotentTestServer(state_path=path) as server, httpx.Client() as client:
        assert client.get(f"{server.url}/charges/k1").status_code == 409
        assert client.get(f"{server.url}/charges/k2").status_code == 404


def test_a_state_file_without_in_flight_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"format": 1, "seq": 0, "records": {}, "accepted": {},
                                "replays": 0}), "utf-8")
    with IdempotentTestServer(state_path=path) as server, httpx.Client() as client:
        assert _post(client, server, {"amount": 1}, "k1").status_code == 201
    assert read_server_state(path).accepted == {"k1": 1}
