"""The test-server chooser, the pytest header, CI failing instead of skipping, and the
local server's crash controls: SIGKILL + restart keeps acknowledged writes, a stalled
(SIGSTOPped) server is bounded by timeouts."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mongodb_helpers import Tools, acquire_request, commit_request, create_request

from agentium_graph import ExecutionGraphProgram, ExecutionGraphRuntime
from agentium_graph.errors import StoreUnavailableError
from agentium_graph.store import Charge
from agentium_graph.testing import capture
from agentium_graph_mongodb import pytest_plugin, testing
from agentium_graph_mongodb.testing import (
    ENV_URI,
    LocalServer,
    choose_server,
    free_port,
    open_store,
    secantus_executable,
)


def _fake_mongod(directory: Path) -> Path:
    path = directory / "mongod"
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_uri_variable_wins_and_is_redacted(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_URI, "mongodb://ops:hunter2@db.example:27017/?replicaSet=rs0")
    monkeypatch.setenv("PATH", f"{_fake_mongod(tmp_path).parent}{os.pathsep}"
                               f"{os.environ.get('PATH', '')}")
    choice = choose_server()
    assert choice.kind == "uri"
    assert "hunter2" not in choice.detail and "db.example:27017" in choice.detail


def test_mongod_on_path_comes_before_secantusdb(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_URI, raising=False)
    monkeypatch.setattr(testing, "docker_answers", lambda timeout_s=2.0: False)
    fake = _fake_mongod(tmp_path)
    monkeypatch.setenv("PATH", str(fake.parent))
    choice = choose_server()
    assert (choice.kind, choice.detail) == ("mongod", str(fake))


def test_secantusdb_is_the_last_resort_and_none_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_URI, raising=False)
    monkeypatch.setattr(testing, "docker_answers", lambda timeout_s=2.0: False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(testing, "secantus_executable", lambda: "/opt/bin/secantusd-py")
    choice = choose_server()
    assert choice.kind == "secantusdb" and "/opt/bin/secantusd-py" in choice.detail
    monkeypatch.setattr(testing, "secantus_executable", lambda: None)
    choice = choose_server()
    assert choice.kind == "none" and "agentium-graph-mongodb[test]" in choice.detail


class _Config:
    def __init__(self) -> None:
        self.stash = pytest.Stash()


def test_the_header_names_the_choice_once(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _Config()
    calls: list[int] = []

    def chooser() -> testing.ServerChoice:
        calls.append(1)
        return testing.ServerChoice("secantusdb", "secantusdb 0.7.0b3 (x)")
    monkeypatch.setattr(pytest_plugin, "choose_server", chooser)
    header = pytest_plugin.pytest_report_header(config)  # type: ignore[arg-type]
    assert header == ["mongodb test server: secantusdb: secantusdb 0.7.0b3 (x)"]
    pytest_plugin.pytest_report_header(config)  # type: ignore[arg-type]
    assert calls == [1]


def test_a_missing_server_fails_in_ci_and_skips_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="never a skip"):
        pytest_plugin._unavailable("nothing here")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="nothing here"):
        pytest_plugin._unavailable("nothing here")


# --- a server of the test's own: taken ports, crashes, stalls --------------------------------

@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalServer]:
    executable = secantus_executable()
    if executable is None:
        pytest.skip("these tests start their own SecantusDB (pip install "
                    "'agentium-graph-mongodb[test]')")
    server = LocalServer("secantusdb", executable, tmp_path / "data")
    try:
        yield server
    finally:
        server.kill()  # its data is thrown away: no need for a clean (2 s) shutdown


def test_a_taken_port_is_retried_on_another(own_server: LocalServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        ports = iter([busy])  # then real free ports: one may be taken again meanwhile
        monkeypatch.setattr(testing, "free_port", lambda: next(ports, None) or free_port())
        own_server.start()
    assert own_server.port is not None and own_server.port != busy
    assert testing.ping(own_server.uri)


def test_a_port_another_server_answers_on_is_not_adopted(
        own_server: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own_server.start()
    assert own_server.port is not None and own_server.process is not None
    assert testing.server_pid(own_server.uri) == own_server.process.pid
    second = LocalServer("secantusdb", own_server.executable, tmp_path / "second")
    ports = iter([own_server.port])  # then real free ports
    monkeypatch.setattr(testing, "free_port", lambda: next(ports, None) or free_port())
    try:
        second.start()
        assert second.port != own_server.port and second.process is not None
        assert testing.server_pid(second.uri) == second.process.pid
    finally:
        second.kill()


async def test_acknowledged_writes_survive_a_server_crash(own_server: LocalServer) -> None:
    own_server.start()
    store = open_store(own_server.uri, "crash", retries=8, retry_max_wait_s=0.5,
                       server_selection_timeout_s=2)
    try:
        await store.create_task(create_request("k"))
        fence = (await store.acquire_lease(acquire_request("k"))).fence
        for i in range(20):
            await store.commit(commit_request("k", fence, [
                Charge(admission_id=f"c{i}", charges={"tool_calls": 1})]))
        before = await capture(store, "k")
        own_server.kill()
        own_server.start()  # same port, same data directory
        # The same store rides through: its pool reconnects and retries.
        assert await capture(store, "k") == before
        result = await store.commit(commit_request("k", fence, [
            Charge(admission_id="after", charges={"tool_calls": 1})]))
        assert result.header.counters["tool_calls"] == 21
    finally:
        await store.close()


async def test_a_stalled_server_is_bounded_by_timeouts(own_server: LocalServer) -> None:
    own_server.start()
    store = open_store(own_server.uri, "stall", socket_timeout_s=0.5,
                       server_selection_timeout_s=0.5, retries=1, retry_max_wait_s=0.05)
    try:
        await store.create_task(create_request("k"))
        own_server.pause()
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="attempt"):
            await store.get_header("k")
        assert time.monotonic() - started < 10
    finally:
        own_server.resume()
        await store.close()


# --- the server dies under a running graph ------------------------------------------------------

def _chain_program() -> ExecutionGraphProgram:
    ref = {"$ref": {"node": "src", "path": ["value"]}}
    return ExecutionGraphProgram(id="chain", version="1", plan={
        "schemaVersion": 1, "revision": 1, "nodes": [
            {"id": "src", "binding": "double", "version": "1", "args": {"x": 3}},
            {"id": "slow", "binding": "slow", "version": "1", "args": {"x": ref}},
            {"id": "join", "binding": "add", "version": "1",
             "args": {"values": [{"$ref": {"node": "slow", "path": ["value"]}}]}}]})


async def test_a_run_rides_through_a_server_crash(own_server: LocalServer) -> None:
    own_server.start()
    tools = Tools()
    tools.hold_slow = True
    release = asyncio.Event()
    tools.release = release
    store = open_store(own_server.uri, "ride", retries=10, retry_max_wait_s=0.5,
                       server_selection_timeout_s=2)
    try:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                        require_durable=True)
        await runtime.create("job", _chain_program())
        run = asyncio.create_task(runtime.run("job", worker_id="w1"))
        await asyncio.wait_for(tools.slow_started.wait(), timeout=10)
        own_server.kill()
        await asyncio.to_thread(own_server.start)  # same port and data
        release.set()
        result = await asyncio.wait_for(run, timeout=60)
        assert result.output["join"] == {"value": 7}
        view = await runtime.inspect("job")
        assert view.verified
    finally:
        await store.close()
    assert dict(tools.calls) == {"src": 1, "slow": 1, "join": 1}


async def test_a_run_that_outlives_the_retries_fails_typed_and_recovers(
        own_server: LocalServer) -> None:
    own_server.start()
    tools = Tools()
    tools.hold_slow = True
    release = asyncio.Event()
    tools.release = release
    store = open_store(own_server.uri, "outage", retries=1, retry_max_wait_s=0.05,
                       server_selection_timeout_s=0.3)
    try:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=store,
                                        require_durable=True)
        await runtime.create("job", _chain_program())
        run = asyncio.create_task(runtime.run("job", worker_id="w1"))
        await asyncio.wait_for(tools.slow_started.wait(), timeout=10)
        own_server.kill()
        release.set()  # "slow" finishes while the server is down: its commit cannot land
        with pytest.raises(StoreUnavailableError):
            await asyncio.wait_for(run, timeout=60)
    finally:
        await store.close()
    await asyncio.to_thread(own_server.start)
    tools.hold_slow = False
    async with open_store(own_server.uri, "outage") as fresh:
        runtime = ExecutionGraphRuntime(catalog=tools.catalog(), store=fresh,
                                        require_durable=True)
        result = await runtime.run("job", worker_id="w1")
        assert result.output["join"] == {"value": 7}
        assert (await runtime.inspect("job")).verified
    assert tools.calls["src"] == 1 and tools.calls["join"] == 1
    assert tools.calls["slow"] == 2  # its completion was never acknowledged: run again
