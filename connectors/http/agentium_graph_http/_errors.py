"""The exception tree of the HTTP connector, and the one place httpx failures are mapped.

Every failure of :meth:`HttpActionConnector.dispatch` leaves the package as one of these
(never a raw ``httpx`` exception); ``asyncio.CancelledError`` always propagates as is::

    AgentiumGraphError                      (agentium_graph.errors)
    └── HttpConnectorError                  http_connector_error: request refused locally
        │                                   (bad destination, key or args); nothing was sent
        ├── HttpTransientError              http_transient: no answer that settles it; the
        │   │                               runtime reconciles through resolve_result
        │   ├── HttpTimeoutError            http_timeout: no response within timeout_s
        │   ├── HttpNetworkError            http_network: connection failed, reset or closed
        │   │                               without a response (a lost receipt looks like this)
        │   └── HttpServerError             http_server_error: 5xx, 408, 409, 425 or 429
        ├── HttpRejectedError               http_rejected: another 3xx/4xx; retrying the same
        │                                   request cannot succeed
        └── HttpResponseError               http_bad_response: a 2xx whose body is not JSON
            │                               or is in a coding not decoded here (br, zstd),
            │                               or a 303 See Other after a POST/PUT
            └── HttpResponseTooLargeError   http_response_too_large: a 2xx whose body is
                                            larger than max_response_bytes

Every error carries ``may_have_taken_effect``: ``False`` only when the request provably
did not reach the server's handler (connect failure, a 4xx/429 rejection, a local
refusal, a request that could not even be built). When it is ``True`` the caller must
reconcile with ``resolve_result`` before it could ever send the request again.

Messages never quote static header values: text quoted back from a server is redacted
(:func:`redact`), and the text of an exception raised while building or framing a request
(which may quote a header) is never copied, only its type name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

import httpx

from agentium_graph.errors import AgentiumGraphError

EXCERPT_CHARS = 300


class HttpConnectorError(AgentiumGraphError):
    """Root of the HTTP connector's errors; raised as is when a request is refused locally."""

    code = "http_connector_error"

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None,
                 may_have_taken_effect: bool = False, body_excerpt: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        merged: dict[str, Any] = {"url": url, "status": status,
                                  "may_have_taken_effect": may_have_taken_effect}
        if body_excerpt is not None:
            merged["body_excerpt"] = body_excerpt
        merged.update(details or {})
        super().__init__(message, details=merged)
        self.url = url
        self.status = status
        self.may_have_taken_effect = may_have_taken_effect
        self.body_excerpt = body_excerpt


class HttpTransientError(HttpConnectorError):
    """No answer that settles the request; reconcile with ``resolve_result`` before retrying."""

    code = "http_transient"


class HttpTimeoutError(HttpTransientError):
    code = "http_timeout"


class HttpNetworkError(HttpTransientError):
    code = "http_network"


class HttpServerError(HttpTransientError):
    """A status that may succeed later (5xx, 408, 409, 425, 429); ``retry_after_s`` if sent."""

    code = "http_server_error"

    def __init__(self, message: str, *, url: str, status: int, may_have_taken_effect: bool,
                 body_excerpt: str, retry_after_s: float | None = None) -> None:
        super().__init__(message, url=url, status=status, body_excerpt=body_excerpt,
                         may_have_taken_effect=may_have_taken_effect,
                         details={"retry_after_s": retry_after_s})
        self.retry_after_s = retry_after_s


class HttpRejectedError(HttpConnectorError):
    """The server refused the request (3xx/4xx); sending it again cannot succeed."""

    code = "http_rejected"


class HttpResponseError(HttpConnectorError):
    """A 2xx whose body is not JSON, or is in a content coding this connector does not
    decode (``details["content_encoding"]``): the server accepted, but the outcome is
    unreadable.

    Also raised for a ``303 See Other`` answering a POST/PUT: the server has most likely
    processed the request and points elsewhere for the result, which is not followed.
    """

    code = "http_bad_response"


class HttpResponseTooLargeError(HttpResponseError):
    """A 2xx whose body exceeds ``max_response_bytes``: accepted, outcome not read."""

    code = "http_response_too_large"


REDACTED = "[redacted]"


@dataclass(frozen=True)
class Reply:
    """A response read under the ``max_response_bytes`` bound.

    ``content`` holds at most that many decoded bytes; ``truncated`` says the body was
    longer and the rest was never read. ``undecoded`` is the ``Content-Encoding`` of a body
    in a coding that is not decoded here (``br``, ``zstd``...): that body is not read, and
    ``content`` is empty.
    """

    status: int
    headers: httpx.Headers
    content: bytes
    truncated: bool = False
    charset: str | None = None
    undecoded: str | None = None

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300

    @property
    def text(self) -> str:
        try:
            return self.content.decode(self.charset or "utf-8", errors="replace")
        except (LookupError, ValueError):
            # An unknown charset, or a codec that refuses errors="replace" or raises
            # whatever the bytes (idna, "undefined"): the server's text is read as UTF-8.
            return self.content.decode("utf-8", errors="replace")


# Statuses that say "not now" rather than "never". 409/425: a request with the same key
# is still in flight at the server, so the effect may yet happen.
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})
_NOT_APPLIED_STATUSES = frozenset({408, 429})


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced by ``[redacted]``,
    also as a server may echo it back: in another letter case, or percent-encoded."""
    for secret in secrets:
        if secret:
            forms = {secret, quote(secret, safe=""), quote_plus(secret)}
            pattern = "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))
            text = re.sub(pattern, REDACTED, text, flags=re.IGNORECASE)
    return text


def scrubbed(exc: BaseException, secrets: Iterable[str]) -> BaseException:
    """``exc`` with the text of its arguments redacted, to chain as an error's cause: a
    host's ``logger.exception`` prints the cause too, and a transport's message may quote
    what the server sent back (a header echoed in a status line)."""
    secrets = tuple(secrets)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:  # and what it chains (httpcore's)
        seen.add(id(link))
        link.args = tuple(redact(arg, secrets) if isinstance(arg, str) else
                          redact(arg.decode("utf-8", "replace"), secrets)
                          if isinstance(arg, bytes | bytearray) else arg for arg in link.args)
        link = link.__cause__ or link.__context__
    return exc


def excerpt(text: str, secrets: Iterable[str] = ()) -> str:
    """A short, single-line, redacted excerpt of a response body for error messages.

    Redaction runs on the whole flattened text before it is cut, so a secret spanning the
    cut is not left half visible (``secrets`` are compared whitespace-collapsed).
    """
    flat = redact(" ".join(text.split()), secrets)
    return flat if len(flat) <= EXCERPT_CHARS else flat[:EXCERPT_CHARS] + "..."


def retry_after(response: Reply) -> float | None:
    """``Retry-After`` in seconds when given as a number (dates are ignored)."""
    value = response.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    # "inf"/"nan"/"1e999" parse as floats but are no wait, and would not journal as JSON.
    return max(0.0, seconds) if seconds is not None and math.isfinite(seconds) else None


def status_error(response: Reply, url: str, what: str,
                 secrets: Iterable[str] = ()) -> HttpConnectorError:
    """The typed error for a non-2xx ``response`` to ``what`` (e.g. ``"POST"``)."""
    status = response.status
    body = excerpt(response.text, secrets)
    where = f"{what} {url} returned HTTP {status}"
    if status == 303 and what != "GET":
        # See Other after a POST/PUT is how many APIs say "done, the result is over there":
        # the request was most likely processed, and the other location is not followed.
        return HttpResponseError(
            f"{where} (See Other): {body!r}; the server most likely applied it and points "
            "to the result elsewhere, which this connector does not follow; the runtime "
            "reconciles by looking the key up", url=url, status=status,
            may_have_taken_effect=True, body_excerpt=body)
    if status >= 500 or status in _TRANSIENT_STATUSES:
        applied = status not in _NOT_APPLIED_STATUSES
        hint = ("the server may have applied it; the runtime reconciles by looking the key "
                "up before any retry" if applied else "the server did not apply it; it is "
                "safe to send again with the same Idempotency-Key")
        return HttpServerError(f"{where}: {body!r}; {hint}", url=url, status=status,
                               may_have_taken_effect=applied, body_excerpt=body,
                               retry_after_s=retry_after(response))
    return HttpRejectedError(
        f"{where}: {body!r}; the server refused the request, so fix the args, the "
        "destination or the credentials before running the task again",
        url=url, status=status, body_excerpt=body)


def build_error(exc: Exception, url: str, what: str) -> HttpConnectorError:
    """A request that could not even be built was never sent.

    The exception's text is not copied: it may quote a header value (a secret).
    """
    return HttpConnectorError(
        f"{what} {url}: the request could not be built ({type(exc).__name__}); it was never "
        "sent; check base_url, the paths and the static headers", url=url)


def transport_error(exc: Exception, url: str, what: str, timeout_s: float,
                    secrets: Iterable[str] = (), *, unsent: bool = False) -> HttpConnectorError:
    """Map an exception raised while sending ``what`` to ``url`` into the typed tree.

    Only connect-phase failures (and requests refused while being framed) prove the
    request never reached the server; ``unsent`` says the caller saw it fail before any
    request byte went out (a whole-request timeout during the TLS handshake). Only network
    errors quote their text (redacted): a framing error or an unexpected exception may
    quote a header value.
    """
    name = type(exc).__name__
    unsent = unsent or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout |
                                  httpx.PoolTimeout | httpx.UnsupportedProtocol |
                                  httpx.ProxyError)
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return HttpTimeoutError(
            f"{what} {url}: no response within {timeout_s:g}s ({name}); "
            + ("it was never sent" if unsent else "the server may have applied it"),
            url=url, may_have_taken_effect=not unsent, details={"timeout_s": timeout_s})
    if isinstance(exc, httpx.LocalProtocolError | httpx.InvalidURL):
        return HttpConnectorError(
            f"{what} {url}: the request could not be built ({name}); it was never sent; "
            "check base_url, the paths and the static headers", url=url)
    if isinstance(exc, httpx.TransportError):
        return HttpNetworkError(
            f"{what} {url} failed: {name}: {redact(str(exc), secrets)}; "
            + ("it was never sent" if unsent else "the connection ended before a response, "
               "so the server may have applied it"),
            url=url, may_have_taken_effect=not unsent)
    if isinstance(exc, httpx.DecodingError):
        # Our own reader's text (or httpx's): the coding and zlib's reason, no header.
        return HttpNetworkError(
            f"{what} {url}: the response body could not be decoded "
            f"({redact(str(exc), secrets)}); the server answered, so it may have applied it",
            url=url, may_have_taken_effect=True)
    return HttpNetworkError(
        f"{what} {url} failed unexpectedly ({name}); the server may have applied it",
        url=url, may_have_taken_effect=True)
