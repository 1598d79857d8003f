"""MongoDB servers for tests, and the store factory harnesses and child processes name.

Which server, first that applies (see ``MONGODB.md`` of the project)::

    1. AGENTIUM_MONGODB_URI is set          -> use it
    2. a Docker engine answers (and the
       ``testcontainers`` package imports)  -> a ``mongo:8`` container, single-node replica set
    3. ``mongod`` is on PATH                -> a disposable mongod on a free 127.0.0.1 port
    4. otherwise                            -> SecantusDB (``secantusdb``, a test-only
                                               dependency) on a free 127.0.0.1 port

:func:`choose_server` decides without starting anything; :func:`start_server` starts the
choice. :class:`LocalServer` (mongod or SecantusDB) can also be SIGKILLed and restarted
on the same port and data directory, for crash tests. The store never sees any of this:
it only gets a URI. This module does not import pytest; the fixtures live in
:mod:`agentium_graph_mongodb.pytest_plugin`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from agentium_graph_mongodb._client import _redact
from agentium_graph_mongodb._store import MongoDBDurableTaskStore

FACTORY = "agentium_graph_mongodb.testing:open_store"
ENV_URI = "AGENTIUM_MONGODB_URI"
READY_TIMEOUT_S = 30.0
ServerKind = Literal["uri", "testcontainers", "mongod", "secantusdb", "none"]


def open_store(uri: str, database: str, **options: Any) -> MongoDBDurableTaskStore:
    """A store on ``database`` at ``uri`` with short test timeouts; does no I/O until used."""
    options.setdefault("server_selection_timeout_s", 10.0)
    return MongoDBDurableTaskStore(uri, database=database, **options)


class ServerStartError(RuntimeError):
    """No MongoDB-compatible server could be started; the message says why."""


@dataclass(frozen=True)
class ServerChoice:
    kind: ServerKind
    detail: str  # what the header prints (a redacted URI, a binary path, a version, a reason)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def choose_server() -> ServerChoice:
    """The first server option that applies, without starting anything."""
    uri = os.environ.get(ENV_URI, "").strip()
    if uri:
        return ServerChoice("uri", f"{ENV_URI}={_redact(uri)}")
    if importlib.util.find_spec("testcontainers") is not None and docker_answers():
        return ServerChoice("testcontainers", "mongo:8 (single-node replica set)")
    mongod = shutil.which("mongod")
    if mongod:
        return ServerChoice("mongod", mongod)
    secantus = secantus_executable()
    if secantus:
        return ServerChoice("secantusdb", f"secantusdb {_version('secantusdb')} ({secantus})")
    return ServerChoice("none", f"no {ENV_URI}, no Docker engine with testcontainers, no "
                                "mongod on PATH and no secantusd-py (pip install "
                                "'agentium-graph-mongodb[test]')")


def docker_answers(timeout_s: float = 2.0) -> bool:
    """Whether a Docker engine responds to a ping (through the docker SDK)."""
    try:
        docker: Any = importlib.import_module("docker")  # testcontainers' dependency
        client = docker.from_env(timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure means "no usable engine"
        return False


def secantus_executable() -> str | None:
    """``secantusd-py`` next to this interpreter or on PATH."""
    here = Path(sys.executable).parent
    return shutil.which("secantusd-py", path=os.pathsep.join(
        [str(here), os.environ.get("PATH", "")]))


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def ping(uri: str, timeout_s: float = 0.25) -> bool:
    """One ``ping`` command; True when the server answered."""
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=max(1, int(timeout_s * 1000)),
        connectTimeoutMS=max(1, int(timeout_s * 1000)))
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


def _accepts(port: int) -> bool:
    """Whether 127.0.0.1:port accepts a TCP connection (waits briefly when it does not)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.25):
            return True
    except OSError:
        time.sleep(0.05)  # bounded readiness polling of a starting server process
        return False


def server_pid(uri: str, timeout_s: float = 5.0) -> int | None:
    """The process id the server at ``uri`` reports (``serverStatus.pid``), if it answers."""
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=int(timeout_s * 1000),
        connectTimeoutMS=int(timeout_s * 1000))
    try:
        pid = client.admin.command("serverStatus").get("pid")
        return int(pid) if isinstance(pid, int | float) else None
    except PyMongoError:
        return None
    finally:
        client.close()


# --- servers ---------------------------------------------------------------------------------

class MongoServer:
    """A server the tests use: its URI, what it is, and how to stop it."""

    def __init__(self, kind: ServerKind, uri: str, description: str) -> None:
        self.kind = kind
        self.uri = uri
        self.description = description

    def stop(self) -> None:
        """Stop what the tests started (nothing for an external URI)."""

    def drop_database(self, name: str) -> None:
        client: MongoClient[dict[str, Any]] = MongoClient(self.uri,
                                                         serverSelectionTimeoutMS=10_000)
        try:
            client.drop_database(name)
        finally:
            client.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description})"


class LocalServer(MongoServer):
    """A ``mongod`` or SecantusDB process on 127.0.0.1 that the tests own.

    :meth:`kill` (SIGKILL) and :meth:`start` again reuse the same port and data directory,
    so acknowledged, journaled writes must survive; :meth:`stop` is a clean SIGTERM.
    """

    def __init__(self, kind: Literal["mongod", "secantusdb"], executable: str,
                 data_dir: Path) -> None:
        super().__init__(kind, "", f"{kind} ({executable})")
        self.executable = executable
        self.data_dir = data_dir
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def command(self, port: int) -> list[str]:
        if self.kind == "secantusdb":
            return [self.executable, "--host", "127.0.0.1", "--port", str(port),
                    "--storage-path", str(self.data_dir), "--standalone",
                    "--log-level", "WARNING"]
        return [self.executable, "--bind_ip", "127.0.0.1", "--port", str(port),
                "--dbpath", str(self.data_dir), "--quiet",
                "--logpath", str(self.data_dir / "mongod.log")]

    def start(self, attempts: int = 5) -> None:
        """Start (or restart on the same port and data), retrying on a taken port."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        reasons: list[str] = []
        for _ in range(attempts if self.port is None else 1):
            port = self.port if self.port is not None else free_port()
            log = (self.data_dir.parent / f"{self.data_dir.name}.log").open("ab")
            try:
                self.process = subprocess.Popen(self.command(port), stdout=log,
                                                stderr=subprocess.STDOUT)
            finally:
                log.close()
            uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline and self.process.poll() is None:
                # A plain TCP probe first: a driver client closed while its monitor is
                # still connecting to a server that is just starting can leak a socket.
                # Then make sure the server answering is ours, not another process that
                # took the port first (our process then exits: we try another port).
                if _accepts(port) and server_pid(uri) == self.process.pid:
                    self.port, self.uri = port, uri
                    self.description = f"{self.kind} on 127.0.0.1:{port} ({self.executable})"
                    return
            code = self.process.poll()
            if code is None:  # never answered: give up on this process
                self._signal(signal.SIGKILL)
                reasons.append(f"port {port}: no answer within {READY_TIMEOUT_S:g}s")
            else:
                reasons.append(f"port {port}: exited with status {code}")
            self.process = None
        raise ServerStartError(f"could not start {self.kind} ({self.executable}): "
                               f"{'; '.join(reasons)}; see {self.data_dir}.log")

    def kill(self) -> None:
        """SIGKILL the server (a crash); :meth:`start` brings it back on the same data."""
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the server stalls with its connections open. Returns once the kernel
        reports the process stopped (on Linux), so a request sent next cannot be answered."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                # The state is the field after the parenthesized command name.
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # no procfs here: the signal is all we can do
            if state in ("T", "t"):
                return
            time.sleep(0.005)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class ContainerServer(MongoServer):
    """A ``mongo:8`` container (testcontainers), initiated as a single-node replica set."""

    def __init__(self) -> None:
        container: Any = importlib.import_module("testcontainers.core.container")
        super().__init__("testcontainers", "", "mongo:8 container")
        self.container: Any = container.DockerContainer("mongo:8").with_command(
            "--replSet rs0 --bind_ip_all").with_exposed_ports(27017)

    def start(self) -> None:
        self.container.start()
        host = self.container.get_container_host_ip()
        port = int(self.container.get_exposed_port(27017))
        uri = f"mongodb://{host}:{port}/?directConnection=true"
        deadline = time.monotonic() + READY_TIMEOUT_S * 2
        while not ping(uri):
            if time.monotonic() > deadline:
                raise ServerStartError("the mongo:8 container did not answer in time")
        client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
        try:
            with contextlib.suppress(PyMongoError):  # already initiated
                client.admin.command("replSetInitiate", {
                    "_id": "rs0", "members": [{"_id": 0, "host": "localhost:27017"}]})
            while not client.admin.command("hello").get("isWritablePrimary"):
                if time.monotonic() > deadline:
                    raise ServerStartError("the mongo:8 replica set elected no primary in time")
        finally:
            client.close()
        self.uri = uri
        self.description = f"mongo:8 container, single-node replica set on {host}:{port}"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.container.stop()


def start_server(choice: ServerChoice, workdir: Path) -> MongoServer:
    """Start (or adopt, for a URI) the chosen server; ServerStartError when impossible."""
    if choice.kind == "uri":
        uri = os.environ[ENV_URI].strip()
        if not ping(uri, timeout_s=10.0):
            raise ServerStartError(f"{choice.detail} does not answer a ping within 10s")
        return MongoServer("uri", uri, choice.detail)
    if choice.kind == "testcontainers":
        container = ContainerServer()
        try:
            container.start()
        except Exception as exc:
            container.stop()
            raise ServerStartError(f"could not start the mongo:8 container: {exc}") from exc
        return container
    if choice.kind in ("mongod", "secantusdb"):
        executable = shutil.which("mongod") if choice.kind == "mongod" else \
            secantus_executable()
        if executable is None:
            raise ServerStartError(f"{choice.kind} is no longer available")
        server = LocalServer(choice.kind, executable, workdir / choice.kind)
        server.start()
        return server
    raise ServerStartError(choice.detail)


__all__ = [
    "ENV_URI", "FACTORY", "ContainerServer", "LocalServer", "MongoServer", "ServerChoice",
    "ServerStartError", "choose_server", "docker_answers", "free_port", "in_ci",
    "open_store", "ping", "secantus_executable", "server_pid", "start_server",
]
