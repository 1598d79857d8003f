"""A real, idempotent HTTP server with fault switches, for testing HTTP connectors.

:class:`IdempotentTestServer` runs the stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (a free
port unless ``port=`` is given) in a background thread and serves a tiny payments API::

    POST /charges        JSON object body + Idempotency-Key header (400 without either)
                         new key             -> 201, stored response; one acceptance
                         same key, same body -> 200 + "Idempotent-Replayed: true", the stored
                                                response; no new acceptance
                         same key, other body-> 422; nothing accepted
                         same key while a post with it is still in flight -> 409
                         with refuse_stale_fences=True: an Agentium-Fence lower than
                         the highest one this key arrived with -> 412; nothing accepted
    GET /charges/{key}   200 + the stored response; 409 while a post with that key is
                         still in flight (arrived, not yet accepted or refused); 404 only
                         if the key was never accepted and is not in flight

It counts acceptances per key, and fault switches (each for the next ``n`` requests, or
every request until :meth:`~IdempotentTestServer.reset_faults` when ``n=None``) make it
lose a response after accepting, fail or hang lookups, refuse posts before accepting, or
answer an accepted post with a non-JSON body. Tests wait for conditions with
:meth:`~IdempotentTestServer.wait_for_accepted` / :meth:`~IdempotentTestServer.wait_for_hung`
instead of sleeping.

With ``state_path=`` the accepted records live in a JSON file, read and written under an
exclusive ``flock`` for every request, so several server instances (in several processes)
share one dedupe ledger, a restarted server remembers what it accepted, and another
process can read the counts with :func:`read_server_state`. POSIX only.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from agentium_graph_http._connector import HttpActionConnector

__all__ = ["IdempotentTestServer", "ServerState", "read_server_state"]

_MAX_BODY = 1 << 20


@dataclass(frozen=True)
class ServerState:
    """What a server has accepted: per-key acceptance counts and stored responses."""

    accepted: dict[str, int] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)
    replays: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)

    @property
    def accepted_count(self) -> int:
        return sum(self.accepted.values())


def read_server_state(path: str | os.PathLike[str]) -> ServerState:
    """The state persisted at ``path`` by a server started with ``state_path=path``."""
    with _locked(Path(path)):
        raw = _load(Path(path))
    return _to_state(raw)


def _empty() -> dict[str, Any]:
    return {"format": 1, "seq": 0, "records": {}, "accepted": {}, "replays": 0,
            "in_flight": {}, "fences": {}}


def _load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return _empty()
    return data


def _save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True), "utf-8")
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _to_state(raw: dict[str, Any]) -> ServerState:
    return ServerState(accepted=dict(raw["accepted"]),
                       responses={k: copy.deepcopy(r["response"])
                                  for k, r in raw["records"].items()},
                       replays=int(raw["replays"]),
                       in_flight=dict(raw.get("in_flight", {})))


def _enter_flight(data: dict[str, Any], key: str) -> None:
    flights = data.setdefault("in_flight", {})
    flights[key] = flights.get(key, 0) + 1


def _leave_flight(data: dict[str, Any], key: str) -> None:
    flights = data.setdefault("in_flight", {})
    left = flights.get(key, 0) - 1
    if left > 0:
        flights[key] = left
    else:
        flights.pop(key, None)


def _digest(body: Any) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Fault:
    """A switch armed for the next ``remaining`` requests (``None``: until reset)."""

    def __init__(self) -> None:
        self.armed = False
        self.remaining: int | None = 0
        self.status = 503
        self.seconds: float | None = None

    def arm(self, n: int | None, *, status: int = 503, seconds: float | None = None) -> None:
        if n is not None and n < 1:
            raise ValueError("n must be >= 1, or None for every request until reset_faults()")
        self.armed, self.remaining, self.status, self.seconds = True, n, status, seconds

    def take(self) -> bool:
        if not self.armed:
            return False
        if self.remaining is not None:
            self.remaining -= 1
            self.armed = self.remaining > 0
        return True


class IdempotentTestServer:
    """A local payments-like API that dedupes by ``Idempotency-Key`` (see the module doc).

    Use it as a context manager (``with IdempotentTestServer() as server:``) or call
    :meth:`start` / :meth:`stop`. ``dedupe=False`` turns it into a non-idempotent server
    (every post is a new acceptance) to show what blind resending does. ``on_accept(key)``
    runs in the server thread after an acceptance is persisted and before the response is
    sent: a crash harness can kill its worker there (if it raises, the connection closes
    without a response and the traceback lands in ``server_errors``). ``max_hang_s`` bounds
    every hang. ``refuse_stale_fences=True`` keeps the highest ``Agentium-Fence`` each key
    arrived with (seen, whether or not that post was then accepted) and refuses (412,
    nothing accepted) a post with a lower one, or with a fence that is not an integer: what
    a destination that cannot dedupe does against a worker paused past its lease. It reads
    that header name only (a connector's ``fence_header`` renamed is not seen).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, resource: str = "charges",
                 dedupe: bool = True, state_path: str | os.PathLike[str] | None = None,
                 on_accept: Callable[[str], None] | None = None,
                 max_hang_s: float = 60.0, refuse_stale_fences: bool = False) -> None:
        if not resource or "/" in resource:
            raise ValueError("resource must be one path segment, e.g. 'charges'")
        self.host = host
        self.resource = resource
        self.dedupe = dedupe
        self.state_path = Path(state_path) if state_path is not None else None
        self.on_accept = on_accept
        self.max_hang_s = max_hang_s
        self.refuse_stale_fences = refuse_stale_fences
        self._requested_port = port
        self._cond = threading.Condition()
        self._memory = _empty()
        self._faults = {name: _Fault() for name in (
            "drop_after_accept", "fail_posts", "fail_lookups", "hang_lookups",
            "hang_posts_before", "hang_posts_after", "non_json_after_accept")}
        self._hung = 0
        self._release_generation = 0
        self._stopping = False
        self._conns: set[socket.socket] = set()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.post_count = 0
        self.lookup_count = 0
        self.stale_refused = 0
        self.last_post_headers: dict[str, str] = {}
        self.server_errors: list[str] = []

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> IdempotentTestServer:
        if self._httpd is not None:
            raise RuntimeError("the server is already running")
        self._stopping = False
        httpd = _Server((self.host, self._requested_port), _Handler)
        httpd.app = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"IdempotentTestServer:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hung requests, cut open connections and join every server thread."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        httpd.shutdown()  # no new connections after this
        with self._cond:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        thread.join()
        self._httpd = self._thread = None

    def __enter__(self) -> IdempotentTestServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("start the server first")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:54321``."""
        return f"http://{self.host}:{self.port}"

    @property
    def create_path(self) -> str:
        return f"/{self.resource}"

    @property
    def lookup_path_template(self) -> str:
        return f"/{self.resource}/{{key}}"

    def connector(self, **options: Any) -> HttpActionConnector:
        """An :class:`HttpActionConnector` pointed at this server (``options`` override)."""
        options.setdefault("create_path", self.create_path)
        options.setdefault("lookup_path_template", self.lookup_path_template)
        return HttpActionConnector(self.url, **options)

    # -- counters --------------------------------------------------------------------------

    def state(self) -> ServerState:
        with self._transaction(write=False) as data:
            return _to_state(data)

    @property
    def accepted_count(self) -> int:
        """Acceptances in total (one per key unless ``dedupe=False``)."""
        return self.state().accepted_count

    def accepted_counts(self) -> dict[str, int]:
        return self.state().accepted

    def accepted_for(self, key: str) -> int:
        return self.state().accepted.get(key, 0)

    @property
    def replay_count(self) -> int:
        """Posts answered from the stored response (same key, same body)."""
        return self.state().replays

    def response_for(self, key: str) -> Any:
        """The stored response for ``key``, or None if it was never accepted."""
        return self.state().responses.get(key)

    def wait_for_accepted(self, n: int = 1, *, timeout: float = 10.0) -> None:
        """Block until at least ``n`` acceptances exist; ``TimeoutError`` after ``timeout``."""
        self._wait(lambda: self.accepted_count >= n, timeout, f"{n} acceptance(s)")

    def wait_for_hung(self, n: int = 1, *, timeout: float = 10.0) -> None:
        """Block until at least ``n`` requests are held by a hang switch."""
        self._wait(lambda: self._hung >= n, timeout, f"{n} hung request(s)")

    # -- fault switches --------------------------------------------------------------------

    def drop_response_after_accept(self, n: int | None = 1) -> None:
        """Accept and persist the next ``n`` new posts, then close without responding."""
        self._arm("drop_after_accept", n)

    def fail_posts_before_accept(self, n: int | None = 1, *, status: int = 503) -> None:
        """Answer the next ``n`` posts with ``status`` without accepting them."""
        self._arm("fail_posts", n, status=status)

    def fail_lookups(self, n: int | None = 1, *, status: int = 503) -> None:
        """Answer the next ``n`` lookups with ``status``."""
        self._arm("fail_lookups", n, status=status)

    def hang_lookups(self, n: int | None = 1, *, seconds: float | None = None) -> None:
        """Hold the next ``n`` lookups until :meth:`release_hung` (or ``seconds``), then answer."""
        self._arm("hang_lookups", n, seconds=seconds)

    def hang_posts(self, n: int | None = 1, *, after_accept: bool = False,
                   seconds: float | None = None) -> None:
        """Hold the next ``n`` posts before accepting them, or after (``after_accept=True``).

        A held post goes on when released, even if its client gave up meanwhile: a real
        server also finishes work whose caller timed out.
        """
        self._arm("hang_posts_after" if after_accept else "hang_posts_before", n,
                  seconds=seconds)

    def respond_non_json_after_accept(self, n: int | None = 1) -> None:
        """Accept the next ``n`` new posts but answer 200 with an HTML body."""
        self._arm("non_json_after_accept", n)

    def release_hung(self) -> None:
        """Let every currently held request go on."""
        with self._cond:
            self._release_generation += 1
            self._cond.notify_all()

    def reset_faults(self) -> None:
        with self._cond:
            for fault in self._faults.values():
                fault.armed = False

    # -- request handling (server threads) -------------------------------------------------

    def _arm(self, name: str, n: int | None, *, status: int = 503,
             seconds: float | None = None) -> None:
        with self._cond:
            self._faults[name].arm(n, status=status, seconds=seconds)

    def _take(self, name: str) -> _Fault | None:
        with self._cond:
            fault = self._faults[name]
            return fault if fault.take() else None

    def _hang(self, fault: _Fault) -> None:
        limit = fault.seconds if fault.seconds is not None else self.max_hang_s
        with self._cond:
            generation = self._release_generation
            self._hung += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._stopping
                                    or self._release_generation != generation, timeout=limit)
            finally:
                self._hung -= 1

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        # Another process may write state_path without notifying us: re-check it often.
        step = 0.05 if self.state_path is not None else timeout
        with self._cond:
            while not ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"IdempotentTestServer: no {what} within {timeout}s")
                self._cond.wait(min(step, remaining))

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[dict[str, Any]]:
        with self._cond:
            if self.state_path is None:
                yield self._memory
                return
            with _locked(self.state_path):
                data = _load(self.state_path)
                yield data
                if write:
                    _save(self.state_path, data)

    def _handle_post(self, key: str | None, body: Any,
                     fence: str | None = None) -> tuple[int, Any, str]:
        """Decide a post: (status, JSON response, how to answer), the last one of
        ``respond``, ``replay``, ``drop`` (close without answering) or ``non_json``."""
        with self._cond:
            self.post_count += 1
        if not key:
            return 400, _error("missing_idempotency_key",
                               "send an Idempotency-Key header"), "respond"
        if not isinstance(body, dict):
            return 400, _error("invalid_body", "the body must be a JSON object"), "respond"
        fault = self._take("fail_posts")
        if fault is not None:
            return fault.status, _error("unavailable", "try again later"), "respond"
        if self.refuse_stale_fences and fence is not None:
            refused = self._stale_fence(key, fence)
            if refused is not None:
                return 412, refused, "respond"
        hang = self._take("hang_posts_before")
        digest = _digest(body)
        if hang is not None:
            # The key is in flight from the moment the request arrives: lookups answer 409
            # until it is accepted or refused, never 404 (contract rule 3). A post that
            # never completes (a server process killed while holding it) stays in flight,
            # persisted with state_path=, so it can never pass for an absent key.
            with self._transaction(write=True) as data:
                if self.dedupe and key in data.setdefault("in_flight", {}):
                    return 409, _in_flight(key), "respond"
                _enter_flight(data, key)
            self._hang(hang)
        # Without a hang, arrival and acceptance happen in this one transaction: no lookup
        # can fall between them, so the key needs no in-flight mark.
        with self._transaction(write=True) as data:
            if hang is not None:
                _leave_flight(data, key)
            elif self.dedupe and key in data.setdefault("in_flight", {}):
                return 409, _in_flight(key), "respond"
            record = data["records"].get(key)
            if self.dedupe and record is not None:
                if record["digest"] != digest:
                    return 422, _error("idempotency_key_reused", "this key was used with a "
                                       "different body"), "respond"
                data["replays"] += 1
                return 200, record["response"], "replay"
            data["seq"] += 1
            response = {"id": f"ch_{data['seq']:06d}", "object": self.resource.rstrip("s"),
                        "idempotency_key": key, "status": "succeeded", "request": body}
            data["records"][key] = {"digest": digest, "response": response}
            data["accepted"][key] = data["accepted"].get(key, 0) + 1
            self._cond.notify_all()
        if self.on_accept is not None:
            self.on_accept(key)
        fault = self._take("hang_posts_after")
        if fault is not None:
            self._hang(fault)
        if self._take("drop_after_accept") is not None:
            return 201, response, "drop"
        if self._take("non_json_after_accept") is not None:
            return 200, response, "non_json"
        return 201, response, "respond"

    def _stale_fence(self, key: str, fence: str) -> dict[str, Any] | None:
        """Record ``fence`` for ``key``, or the 412 body refusing it as lower than seen."""
        if not (fence.isascii() and fence.isdigit() and len(fence) <= 20):
            return _error("invalid_fence", "Agentium-Fence must be a non-negative integer")
        with self._transaction(write=True) as data:
            fences = data.setdefault("fences", {})
            highest = fences.get(key, 0)
            if int(fence) < highest:
                with self._cond:
                    self.stale_refused += 1
                return _error("stale_fence", f"fence {fence} is lower than fence {highest} "
                              f"seen for key {key!r}; a newer worker owns this action")
            fences[key] = int(fence)
        return None

    def _handle_lookup(self, key: str) -> tuple[int, Any]:
        with self._cond:
            self.lookup_count += 1
        fault = self._take("fail_lookups")
        if fault is not None:
            return fault.status, _error("unavailable", "try again later")
        fault = self._take("hang_lookups")
        if fault is not None:
            self._hang(fault)
        with self._transaction(write=False) as data:
            record = data["records"].get(key)
            flying = key in data.get("in_flight", {})
        if record is not None:
            return 200, record["response"]
        if flying:
            return 409, _in_flight(key)
        return 404, _error("not_found", f"no request with idempotency key {key!r}")

    def _track(self, conn: socket.socket, opened: bool) -> None:
        with self._cond:
            if opened:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _in_flight(key: str) -> dict[str, Any]:
    return _error("idempotency_key_in_flight", f"a request with idempotency key {key!r} is "
                  "still being processed; try again later")


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    request_queue_size = 128
    block_on_close = True
    app: IdempotentTestServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            self.app.server_errors.append("".join(traceback.format_exception(exc)))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections end on their own
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.app._track(self.connection, True)

    def finish(self) -> None:
        self.server.app._track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _route(self) -> tuple[str, str | None]:
        path = urlsplit(self.path).path
        base = self.server.app.create_path
        if path == base:
            return "collection", None
        if path.startswith(base + "/") and path.count("/") == 2 and len(path) > len(base) + 1:
            return "item", unquote(path[len(base) + 1:])
        return "other", None

    def do_POST(self) -> None:
        app = self.server.app
        route, _ = self._route()
        length = self.headers.get("Content-Length")
        if route != "collection":
            self._drain(length)
            self._no_route(route)
            return
        if length is None or not length.isdigit():
            self._reply(411, _error("length_required", "send a Content-Length"), close=True)
            return
        if int(length) > _MAX_BODY:
            self._reply(413, _error("too_large", "the body is too large"), close=True)
            return
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with app._cond:
            app.last_post_headers = dict(self.headers.items())
        status, response, action = app._handle_post(self.headers.get("Idempotency-Key"), body,
                                                     self.headers.get("Agentium-Fence"))
        if action == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "non_json":
            self._reply(200, "<html><body>Accepted</body></html>", content_type="text/html")
            return
        extra = {"Idempotent-Replayed": "true"} if action == "replay" else {}
        self._reply(status, response, headers=extra)

    def do_GET(self) -> None:
        route, key = self._route()
        if route != "item" or key is None:
            self._no_route(route)
            return
        status, response = self.server.app._handle_lookup(key)
        self._reply(status, response)

    def _no_route(self, route: str) -> None:
        if route == "other":
            self._reply(404, _error("no_route", f"no route for {self.path}"))
        else:
            self._reply(405, _error("method_not_allowed", f"{self.command} is not allowed "
                                    f"on {self.path}"))

    def _drain(self, length: str | None) -> None:
        if length is not None and length.isdigit() and int(length) <= _MAX_BODY:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _reply(self, status: int, payload: Any, *, headers: dict[str, str] | None = None,
               content_type: str = "application/json", close: bool = False) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client gave up (e.g. its timeout fired during a hang)
            self.close_connection = True
