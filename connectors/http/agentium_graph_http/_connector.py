"""HttpActionConnector: dispatch with an Idempotency-Key, reconcile by looking the key up."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, NoReturn

import httpx
from pydantic import ValidationError

from agentium_graph.connectors import (
    Absent,
    ActionOutcome,
    ActionRequest,
    DurableActionConnector,
    Unknown,
)
from agentium_graph.errors import ConfigurationError, config_error
from agentium_graph_http._config import (
    DEFAULT_MAX_RESPONSE_BYTES,
    HttpConnectorConfig,
    valid_key,
)
from agentium_graph_http._errors import (
    HttpConnectorError,
    HttpResponseError,
    HttpResponseTooLargeError,
    HttpTransientError,
    Reply,
    build_error,
    excerpt,
    scrubbed,
    status_error,
    transport_error,
)
from agentium_graph_http._read import ACCEPT_ENCODING, read_reply

_log = logging.getLogger("agentium_graph.connectors.http")
_USER_AGENT = "agentium-graph-http/0.1.0"
_RAISE_LIMIT = ("if this API's responses are that large, raise max_response_bytes (at most "
                "1 GiB) in the connector's config")


class HttpActionConnector:
    """A :class:`~agentium_graph.DurableActionConnector` for idempotent HTTP APIs.

    The destination dedupes requests by an ``Idempotency-Key`` header and answers
    ``GET <lookup path>/{key}`` with the stored response (200) or 404 for a key it never
    accepted. :meth:`dispatch` sends ``request.args`` as a JSON body with
    ``Idempotency-Key: request.action_id`` (the runtime's ``result_ref`` is the action id, so
    :meth:`resolve_result` looks up exactly the key that was sent), plus
    ``Agentium-Fence`` / ``Agentium-Dispatch`` with the request's fence and dispatch number
    when the runtime set them.

    Construct it with keyword options (mirroring :class:`HttpConnectorConfig`) or from a
    config with :meth:`from_config`. Pass ``client=`` to share a caller-owned, pooling
    ``httpx.AsyncClient`` (never closed here), or ``transport=`` to give the owned client
    a custom transport (closed with it); whatever the client, redirects are never followed
    (a redirect could carry the static headers to another host, or turn a POST into a GET
    whose 404 would look like proof of absence). The owned client is created on first use in the
    running event loop, keeps no idle connections (so successive loops, e.g. ``asyncio.run``
    per call, are safe; each loop gets its own client) and is closed by :meth:`aclose` or
    ``async with connector:``; the connector stays usable after closing.

    Errors: :meth:`dispatch` raises only :class:`HttpConnectorError` subclasses (or
    ``asyncio.CancelledError``); :meth:`resolve_result` never raises for a transport or
    server failure, it returns ``Unknown``.
    """

    def __init__(self, base_url: str, *, id: str = "http", version: str = "1",
                 create_path: str = "/charges", lookup_path_template: str = "/charges/{key}",
                 method: Literal["POST", "PUT"] = "POST",
                 headers: Mapping[str, str] | None = None,
                 idempotency_header: str = "Idempotency-Key",
                 fence_header: str | None = "Agentium-Fence",
                 dispatch_header: str | None = "Agentium-Dispatch", timeout_s: float = 10.0,
                 lookup_timeout_s: float | None = None, idempotent_destination: bool = True,
                 dispatch_attempts: int = 3, lookup_attempts: int = 1,
                 retry_wait_s: float = 0.25, retry_max_wait_s: float = 5.0,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 client: httpx.AsyncClient | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if headers is not None and not isinstance(headers, Mapping):
            # dict() would take a list of pairs, or fail with a bare ValueError on a string.
            raise ConfigurationError(
                f"invalid HTTP connector config {id!r}: headers: must be a mapping of header "
                f"names to values (a dict), not {type(headers).__name__}")
        options: dict[str, Any] = {
            "base_url": base_url, "id": id, "version": version, "create_path": create_path,
            "lookup_path_template": lookup_path_template, "method": method,
            "headers": dict(headers or {}), "idempotency_header": idempotency_header,
            "fence_header": fence_header, "dispatch_header": dispatch_header,
            "timeout_s": timeout_s, "lookup_timeout_s": lookup_timeout_s,
            "idempotent_destination": idempotent_destination,
            "dispatch_attempts": dispatch_attempts, "lookup_attempts": lookup_attempts,
            "retry_wait_s": retry_wait_s, "retry_max_wait_s": retry_max_wait_s,
            "max_response_bytes": max_response_bytes}
        try:
            config = HttpConnectorConfig(**options)
        except ValidationError as exc:
            raise config_error("HTTP connector config", {"id": id}, exc) from None
        if client is not None and transport is not None:
            raise ConfigurationError("pass either client= or transport=, not both: a "
                                     "caller-owned client already has its transport")
        self.config = config
        self.id = config.id
        self.version = config.version
        self.idempotent_destination = config.idempotent_destination
        self._secrets = config.secrets()
        # Whether the Accept-Encoding sent is ours (see _send) rather than the static one.
        self._asks_codings = not any(name.lower() == "accept-encoding"
                                     for name in config.headers)
        self._shared = client
        self._transport = transport
        self._warned_loops = False
        self._owned: httpx.AsyncClient | None = None
        self._owned_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    @classmethod
    def from_config(cls, config: HttpConnectorConfig, *,
                    client: httpx.AsyncClient | None = None,
                    transport: httpx.AsyncBaseTransport | None = None) -> HttpActionConnector:
        """A connector for ``config`` (validated again on the way in)."""
        return cls(**config.model_dump(), client=client, transport=transport)

    @property
    def destination(self) -> str:
        """The destination to bind tools with: ``ToolBinding(..., destination=c.destination)``."""
        return self.config.destination

    def __repr__(self) -> str:
        return (f"HttpActionConnector(id={self.id!r}, version={self.version!r}, "
                f"url={self.config.create_url()!r})")

    # -- the connector protocol ------------------------------------------------------------

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        """Send ``request.args`` once (retried only against an idempotent destination).

        2xx with a JSON body -> ``ActionOutcome(output=body, result_ref=request.result_ref)``.
        Raises :class:`HttpTransientError` (timeouts, connection failures, 5xx, 408, 409, 425,
        429), :class:`HttpRejectedError` (other 3xx/4xx), :class:`HttpResponseError` (2xx
        without a JSON body) or :class:`HttpConnectorError` (refused before sending).

        With ``idempotent_destination=True`` transient failures are retried up to
        ``dispatch_attempts`` times under the same key, which a deduping server turns into
        one acceptance. With ``False`` nothing is ever resent here: the runtime must
        reconcile through :meth:`resolve_result` first.
        """
        url = self._check(request)
        cfg = self.config
        try:
            body = json.dumps(request.args, allow_nan=False, ensure_ascii=False,
                              separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise HttpConnectorError(f"args of action {request.action_id} are not JSON "
                                     f"({exc}); nothing was sent", url=url) from None
        headers = {**cfg.headers, cfg.idempotency_header: request.action_id,
                   "Content-Type": "application/json", "Accept": "application/json"}
        if cfg.fence_header is not None and request.fence is not None:
            headers[cfg.fence_header] = str(request.fence)
        if cfg.dispatch_header is not None and request.dispatch is not None:
            headers[cfg.dispatch_header] = str(request.dispatch)
        attempts = cfg.dispatch_attempts if cfg.idempotent_destination else 1
        reached: int | None = None  # the first attempt that may have taken effect
        for attempt in range(1, attempts + 1):
            try:
                response = await self._send(cfg.method, url, body, headers, cfg.timeout_s)
                return ActionOutcome(output=self._body(response, url, cfg.method),
                                     result_ref=request.result_ref)
            except HttpTransientError as exc:
                if exc.may_have_taken_effect and reached is None:
                    reached = attempt
                if attempt == attempts:
                    if reached is not None and not exc.may_have_taken_effect:
                        raise _earlier_attempt_reached(exc, cfg.method, reached, attempts) from exc
                    raise
                delay = self._backoff(attempt, exc.details.get("retry_after_s"))
                _log.info("dispatch of %s to %s failed (%s); retrying in %.2fs under the "
                          "same idempotency key", request.action_id, url, exc.code, delay)
                await asyncio.sleep(delay)
            except HttpConnectorError as exc:  # a final answer (a 4xx, an unreadable 2xx)
                if reached is not None and not exc.may_have_taken_effect:
                    _mark_reached(exc, reached)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        """Look the idempotency key ``result_ref`` up; never raises for transport failures.

        200 with a JSON body -> ``ActionOutcome``; 404 -> ``Absent()`` (the server never
        accepted the key); anything else (other statuses, a malformed body, a timeout after
        ``lookup_timeout_s``, a connection failure) -> ``Unknown(reason=...)``, after up to
        ``lookup_attempts`` tries. A ``result_ref`` that is not a string or not a valid
        idempotency key is ``Unknown`` at once (nothing is sent). ``asyncio.CancelledError``
        propagates.
        """
        if not isinstance(result_ref, str):
            # Lookups never raise: a ref of the wrong type cannot have been sent either.
            return Unknown(reason=f"result_ref must be a string (the action id), not "
                           f"{type(result_ref).__name__}, so this connector never sent it")
        if not self.config.usable_key(result_ref):
            # Its lookup could not name it (e.g. "..": /charges/.. is /), and a 404 from
            # anywhere else is no proof of absence.
            return Unknown(reason=f"result_ref {result_ref[:80]!r} is not an idempotency "
                           "key this connector can send and look up, so it never sent it")
        url = self.config.lookup_url(result_ref)
        result: ActionOutcome | Absent | Unknown = Unknown()
        for attempt in range(1, self.config.lookup_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(self._backoff(attempt - 1, None))
            result = await self._lookup_once(url, result_ref)
            if not isinstance(result, Unknown):
                return result
            _log.info("lookup of %s at %s: %s", result_ref, url, result.reason)
        return result

    # -- lifecycle -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the owned client (a ``client=`` passed in stays open)."""
        owned, self._owned, self._owned_loop = self._owned, None, None
        if owned is not None:
            await owned.aclose()

    async def __aenter__(self) -> HttpActionConnector:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    # -- internals -------------------------------------------------------------------------

    def _check(self, request: ActionRequest) -> str:
        cfg = self.config
        if not cfg.accepts_destination(request.destination):
            raise HttpConnectorError(
                f"connector {self.id!r} sends to {cfg.create_path!r} only, not to destination "
                f"{request.destination!r}; bind the tool with destination="
                f"{cfg.destination!r} or use a connector configured for that path",
                details={"destination": request.destination})
        if request.result_ref != request.action_id:
            raise HttpConnectorError(
                f"action {request.action_id}: result_ref {request.result_ref!r} differs from "
                "the action id, but this connector looks results up by the Idempotency-Key "
                "it sends (the action id); nothing was sent",
                details={"action_id": request.action_id})
        if not valid_key(request.action_id):
            raise HttpConnectorError(
                f"action id {request.action_id[:80]!r} cannot be an Idempotency-Key (1-255 "
                "visible ASCII characters); nothing was sent")
        if not cfg.usable_key(request.action_id):
            raise HttpConnectorError(
                f"action id {request.action_id!r} cannot be looked up: in "
                f"{cfg.lookup_path_template!r} it makes a '.' or '..' path segment, which is "
                "removed on the way, so the lookup would ask another path; nothing was sent")
        return cfg.create_url()

    def _client(self) -> httpx.AsyncClient:
        if self._shared is not None:
            return self._shared
        loop = asyncio.get_running_loop()
        if self._owned is None or self._owned_loop is None or self._owned_loop() is not loop:
            # Connections belong to the loop that opened them, and a host may call us from
            # successive loops (asyncio.run per call): the owned client keeps no idle
            # connection that could outlive its loop, and each loop gets its own client.
            # A transport passed in keeps connections as it was built to (the client's
            # limits do not reach it): one it kept alive on a closed loop fails the next
            # request, so say how to build one that keeps none.
            if self._owned is not None and self._transport is not None and \
                    not self._warned_loops:
                self._warned_loops = True
                _log.warning(
                    "connector %s is used from another event loop than before, with the "
                    "transport= it was given: connections that transport kept alive belong "
                    "to the old loop and fail requests sent on them (the runtime then looks "
                    "the action up); build it with limits=httpx.Limits("
                    "max_keepalive_connections=0), or use one event loop", self.id)
            self._owned = httpx.AsyncClient(
                transport=self._transport, follow_redirects=False,
                headers={"User-Agent": _USER_AGENT},
                limits=httpx.Limits(max_keepalive_connections=0))
            self._owned_loop = weakref.ref(loop)
        return self._owned

    async def _send(self, method: str, url: str, body: bytes | None,
                    headers: Mapping[str, str], timeout_s: float) -> Reply:
        """One request, bounded as a whole by ``timeout_s``; failures come out typed.

        Redirects are never followed, even by a caller's client that would, and at most
        ``max_response_bytes`` of the decoded body are read (or ever held), so only the
        codings :func:`read_reply` inflates under that bound are asked for (unless the
        static headers name their own ``Accept-Encoding``).
        """
        client = self._client()
        sent = dict(headers)
        if self._asks_codings:
            sent["Accept-Encoding"] = ACCEPT_ENCODING
        progress = _Progress()
        try:
            request = client.build_request(method, url, content=body, headers=sent,
                                           timeout=httpx.Timeout(timeout_s),
                                           extensions={"trace": progress.trace})
        except Exception as exc:  # e.g. a header the client cannot encode: never sent
            # Chained with its text redacted: it may quote a header (a secret), and a
            # host's logger.exception prints the cause too.
            raise build_error(exc, url, method) from scrubbed(exc, self._secrets)
        try:
            async with asyncio.timeout(timeout_s):
                response = await client.send(request, stream=True, follow_redirects=False)
                try:
                    return await read_reply(response, self.config.max_response_bytes)
                finally:
                    await response.aclose()
        except Exception as exc:  # CancelledError is a BaseException and passes through
            raise transport_error(exc, url, method, timeout_s, self._secrets,
                                  unsent=progress.unsent) from scrubbed(exc, self._secrets)

    def _body(self, response: Reply, url: str, what: str) -> Any:
        if not response.is_success:
            raise status_error(response, url, what, self._secrets)
        if response.undecoded is not None:
            # An answer, not a failure: sent again, the server would answer alike.
            raise HttpResponseError(
                f"{what} {url} returned HTTP {response.status} with "
                f"{self._undecoded(response.undecoded)}; the server accepted the request, so "
                "check it there and record the outcome with runtime.resolve_action",
                url=url, status=response.status, may_have_taken_effect=True,
                body_excerpt="", details={"content_encoding": response.undecoded})
        if response.truncated:
            limit = self.config.max_response_bytes
            body = excerpt(response.text, self._secrets)
            raise HttpResponseTooLargeError(
                f"{what} {url} returned HTTP {response.status} with a body larger than "
                f"max_response_bytes={limit} (decoded), so it was not read: {body!r}; the "
                "server accepted the request, so check it there and record the outcome "
                f"with runtime.resolve_action; {_RAISE_LIMIT}", url=url,
                status=response.status,
                may_have_taken_effect=True, body_excerpt=body,
                details={"max_response_bytes": limit})
        try:
            return _parse_json(response.content)
        except ValueError as exc:
            body = excerpt(response.text, self._secrets)
            raise HttpResponseError(
                f"{what} {url} returned HTTP {response.status} but its body is not JSON "
                f"({exc}): {body!r}; the server accepted the request, so check it there and "
                "record the outcome with runtime.resolve_action",
                url=url, status=response.status, may_have_taken_effect=True,
                body_excerpt=body) from None

    async def _lookup_once(self, url: str, key: str) -> ActionOutcome | Absent | Unknown:
        cfg = self.config
        headers = {**cfg.headers, "Accept": "application/json"}
        timeout_s = cfg.effective_lookup_timeout_s
        try:
            response = await self._send("GET", url, None, headers, timeout_s)
        except HttpConnectorError as exc:
            return Unknown(reason=f"lookup failed ({exc.code}): {exc}")
        if response.status == 404:
            return Absent()
        if not response.is_success:
            return Unknown(reason=f"lookup GET {url} returned HTTP {response.status}: "
                           f"{excerpt(response.text, self._secrets)!r}")
        if response.undecoded is not None:
            return Unknown(reason=f"lookup GET {url} returned HTTP {response.status} with "
                           f"{self._undecoded(response.undecoded)}")
        if response.truncated:
            return Unknown(reason=f"lookup GET {url} returned HTTP {response.status} with a "
                           "body larger than max_response_bytes="
                           f"{cfg.max_response_bytes} (decoded), so it was not read; "
                           f"{_RAISE_LIMIT}")
        try:
            return ActionOutcome(output=_parse_json(response.content), result_ref=key)
        except ValueError as exc:
            return Unknown(reason=f"lookup GET {url} returned HTTP {response.status} "
                           f"with a body that is not JSON ({exc})")

    def _undecoded(self, coding: str) -> str:
        asked = ("the codings it asks for" if self._asks_codings else "but headers= sets "
                 "its own Accept-Encoding; remove it to ask for those only")
        return (f"a body in Content-Encoding {coding!r}, which this connector does not "
                f"decode (it decodes {ACCEPT_ENCODING} only, {asked}), so it was not read")

    def _backoff(self, attempt: int, retry_after_s: object) -> float:
        cfg = self.config
        delay = cfg.retry_wait_s * 2.0 ** (attempt - 1)
        if isinstance(retry_after_s, int | float):
            delay = max(delay, float(retry_after_s))
        return min(delay, cfg.retry_max_wait_s)


class _Progress:
    """How far httpcore got with one request, from its ``trace`` events.

    The whole-request ``asyncio.timeout`` fires no later than httpx's own connect timeout,
    so its ``TimeoutError`` says nothing of the phase: this does. A request is provably
    unsent when a connection was being opened (TCP, TLS) and no request bytes had started
    to go out; without events (another transport, a pooled connection) nothing is proven.
    """

    def __init__(self) -> None:
        self.connecting = False
        self.sending = False

    async def trace(self, name: str, info: Mapping[str, Any]) -> None:
        # "http11.send_request_headers.started", "connection.start_tls.started", ...
        if ".send_request" in name:
            self.sending = True
        elif name.startswith(("connection.connect_", "connection.start_tls")):
            self.connecting = True

    @property
    def unsent(self) -> bool:
        return self.connecting and not self.sending


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"{text[:40]} does not fit a finite float")
    return value


def _parse_json(content: bytes) -> Any:
    """Strict JSON: no NaN/Infinity (nor numbers too large for a finite float); empty,
    undecodable or too deeply nested is an error."""
    try:
        return json.loads(content, parse_constant=_reject_constant,
                          parse_float=_finite_float)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def _fits_the_protocol(connector: HttpActionConnector) -> DurableActionConnector:
    return connector  # mypy --strict proves the fit; there is no runtime_checkable here


def _mark_reached(exc: HttpConnectorError, reached: int) -> None:
    """A later attempt's final refusal (a 4xx for the reused key, say) after attempt
    ``reached`` lost its answer: the refusal proves nothing about that earlier attempt, so
    the error keeps its type but says the request may have been applied."""
    exc.may_have_taken_effect = True
    exc.details = {**exc.details, "may_have_taken_effect": True, "applied_attempt": reached}
    exc.args = (f"{exc.args[0]}; attempt {reached} may have been applied (its answer was "
                "lost), so the server may have applied the request; the runtime reconciles "
                "by looking the key up", *exc.args[1:])


def _earlier_attempt_reached(last: HttpTransientError, method: str, reached: int,
                             attempts: int) -> HttpTransientError:
    """The error of a dispatch whose last attempt provably did not apply, but an earlier one
    may have (its answer was lost): what the caller must act on is the earlier one."""
    return HttpTransientError(
        f"{method} {last.url}: attempt {attempts} of {attempts} failed ({last.code}"
        + (f", HTTP {last.status}" if last.status is not None else "")
        + f"), and attempt {reached} may have been applied (its answer was lost), so the "
        "server may have applied the request; the runtime reconciles by looking the key up",
        url=last.url, status=last.status, may_have_taken_effect=True,
        body_excerpt=last.body_excerpt,
        details={"last_attempt_code": last.code, "applied_attempt": reached})

