"""The public, frozen configuration of :class:`HttpActionConnector`."""

from __future__ import annotations

import json
import re
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentium_graph.errors import bool_only, int_only, number_only

# Always fullmatch: "$" would also match before a trailing newline.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
# RFC 9110 field content, ASCII only: visible characters, with spaces or tabs between them.
_FIELD_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20\x21-\x7e\t]*[\x21-\x7e])?)?")
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_DOT_SEGMENTS = frozenset({".", ".."})
# Fields that frame the message or bind one connection (hop-by-hop): the client sets them,
# and a static one would frame a request twice or let a proxy strip a header it names.
_FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding",
                      "connection", "keep-alive", "proxy-connection", "te", "trailer",
                      "upgrade"})
# Fields the connector (or the client) sets on every request: a key put in one of them is
# overwritten or changes what the request means.
_SET_PER_REQUEST = frozenset({"content-type", "accept", "accept-encoding", "host",
                              "user-agent"})


def _unsendable(text: str) -> bool:
    """Whether ``text`` has whitespace or a control character, which no URL may carry."""
    return any(ch.isspace() or ch < "\x21" or ch == "\x7f" for ch in text)


def _dot_segment(path: str) -> bool:
    """Whether ``path`` has a ``.`` or ``..`` segment (``%2e`` spelled too): httpx removes
    them, and servers may decode then remove them, so the request would go elsewhere."""
    return any(unquote(part) in _DOT_SEGMENTS for part in path.split("/"))


def _plain_path(name: str, value: str, example: str) -> str:
    path = "/" + value.strip().lstrip("/")
    if _unsendable(path):
        raise ValueError(f"{value!r} must not contain spaces or control characters "
                         "(percent-encode them)")
    if "?" in path or "#" in path or _dot_segment(path):
        # A query may carry secrets and URLs land in reasons and logs; a dot segment is
        # removed on the way, so the request would reach another path than the one named.
        raise ValueError(f"{name} must be a plain path without a query, a fragment or "
                         f"'.'/'..' segments, e.g. {example!r}")
    return path


class HttpConnectorConfig(BaseModel):
    """Everything that defines one HTTP connector; frozen, so a connector cannot drift.

    One connector targets one resource of one API: ``method`` to ``create_path`` creates,
    ``GET lookup_path_template`` (with ``{key}`` replaced by the URL-quoted idempotency key)
    looks a request up. ``ActionRequest.destination`` must name ``create_path`` (with or
    without its leading slash), because :meth:`HttpActionConnector.resolve_result` only
    receives the key and can only prove absence at the one lookup endpoint paired with
    that path. Use one connector (with its own ``id``) per resource.

    ``headers`` are static request headers (e.g. ``Authorization``); they are never shown
    in ``repr`` or in error messages (their values are redacted from quoted response
    bodies too), and must be valid HTTP field content: visible ASCII, with spaces or tabs
    between. ``max_response_bytes`` bounds the decoded body read from any response (a
    gzip or deflate body is inflated no further than that). ``dispatch_attempts`` applies
    only when ``idempotent_destination`` is true: only then is resending a POST with the
    same key safe. ``lookup_attempts`` bounds lookup retries (GETs are always safe to
    repeat). ``fence_header`` and ``dispatch_header`` name the headers that carry the
    request's lease fence and dispatch number when the runtime set them (``None`` sends
    neither): a destination that cannot dedupe by key can refuse a post whose fence is
    lower than one it already accepted for that key. Types are exact:
    ``idempotent_destination`` takes a real bool, the attempt counts and
    ``max_response_bytes`` real ints, the ``*_s`` durations an int or a float; never a bool
    or a string standing in for a number (``True`` is not 1 here).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    id: str = Field(default="http", min_length=1)
    version: str = Field(default="1", min_length=1)
    create_path: str = "/charges"
    lookup_path_template: str = "/charges/{key}"
    method: Literal["POST", "PUT"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    idempotency_header: str = "Idempotency-Key"
    fence_header: str | None = "Agentium-Fence"
    dispatch_header: str | None = "Agentium-Dispatch"
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    lookup_timeout_s: float | None = Field(default=None, gt=0, le=600)
    idempotent_destination: bool = True
    dispatch_attempts: int = Field(default=3, ge=1, le=10)
    lookup_attempts: int = Field(default=1, ge=1, le=10)
    retry_wait_s: float = Field(default=0.25, ge=0, le=60)
    retry_max_wait_s: float = Field(default=5.0, ge=0, le=300)
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1024,
                                    le=1024 * 1024 * 1024)

    @field_validator("idempotent_destination", mode="before")
    @classmethod
    def _bools_only(cls, value: Any) -> Any:
        # Not 1 or "false" (pydantic's lax mode takes those): the flag decides whether a
        # dispatch is ever sent twice.
        return bool_only(value)

    @field_validator("dispatch_attempts", "lookup_attempts", "max_response_bytes",
                     mode="before")
    @classmethod
    def _ints_only(cls, value: Any) -> Any:
        # Not True, 2.0 or "3" (pydantic's lax mode takes those): dispatch_attempts=True
        # would quietly mean one attempt.
        return int_only(value)

    @field_validator("timeout_s", "lookup_timeout_s", "retry_wait_s", "retry_max_wait_s",
                     mode="before")
    @classmethod
    def _numbers_only(cls, value: Any) -> Any:
        # An int or a float, not True or "10" (pydantic's lax mode takes those).
        return number_only(value)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        # Messages show the URL without its query and fragment (an API key in the query)
        # and never with credentials: '@' is refused before anything quotes the value (a
        # password holding '/' hides it from urlsplit's netloc).
        if "@" in value:
            raise ValueError("base_url must not carry credentials (or any '@'); pass them "
                             "in headers=, which are kept out of reprs and error messages")
        shown = repr(value.split("?", 1)[0].split("#", 1)[0])
        if _unsendable(value):
            # urlsplit drops tabs and newlines silently: check the text as given.
            raise ValueError(f"{shown} must not contain spaces or control characters")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{shown} is not an absolute http(s) URL")
        if "?" in value or "#" in value:
            # Even empty ("https://api.example.com?"): the paths appended after it would
            # become the query or the fragment, and every request would go to the root.
            raise ValueError(f"{shown} must not carry a query or a fragment (not shown)")
        if _dot_segment(parts.path):
            raise ValueError(f"{shown} must not have '.' or '..' path segments: they are "
                             "removed on the way, so requests would go elsewhere")
        try:
            _ = parts.port  # raises for a port out of range or that is not a number
            httpx.URL(value)
        except (ValueError, httpx.InvalidURL) as exc:
            raise ValueError(f"{shown} is not a URL httpx can send to: {exc}") from None
        return value.rstrip("/")

    @field_validator("create_path")
    @classmethod
    def _check_create_path(cls, value: str) -> str:
        path = _plain_path("create_path", value, "/charges")
        if path == "/" or "{" in path:
            raise ValueError(f"{value!r} must be a plain path such as '/charges'")
        return path

    @field_validator("lookup_path_template")
    @classmethod
    def _check_lookup(cls, value: str) -> str:
        path = _plain_path("lookup_path_template", value, "/charges/{key}")
        if path.count("{key}") != 1 or path.replace("{key}", "").count("{"):
            raise ValueError(f"{value!r} must contain '{{key}}' exactly once and no other "
                             "placeholder, e.g. '/charges/{key}'")
        return path

    @field_validator("idempotency_header", "fence_header", "dispatch_header")
    @classmethod
    def _check_header_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _TOKEN.fullmatch(value):
            raise ValueError(f"{value!r} is not a valid header name")
        if value.lower() in _FRAMING | _SET_PER_REQUEST:
            # The key would be overwritten by the connector's own value (sent with no key
            # at all), or change how the request is framed or routed.
            raise ValueError(f"{value!r} is a header the connector or HTTP sets itself; "
                             "name a header of its own, e.g. 'Idempotency-Key'")
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header name {name!r} is not valid")
            if not _FIELD_VALUE.fullmatch(text):
                # Never quote the value: it is usually a secret, and this message is shown.
                raise ValueError(f"header {name!r}: the value is not valid HTTP field content "
                                 "(visible ASCII characters, with spaces or tabs only "
                                 "between them; no control characters or non-ASCII)")
        return dict(value)

    @model_validator(mode="after")
    def _check_reserved(self) -> HttpConnectorConfig:
        # Accept too: the connector reads only JSON and asks for it on every request, so a
        # static one was silently replaced (or, spelled in another case, sent twice).
        own = [h for h in (self.idempotency_header, self.fence_header, self.dispatch_header)
               if h is not None]
        if len({h.lower() for h in own}) != len(own):
            raise ValueError("idempotency_header, fence_header and dispatch_header must be "
                             f"three different headers (got {', '.join(map(repr, own))}); "
                             "set fence_header or dispatch_header to None to send neither")
        reserved = {*(h.lower() for h in own), "content-type", "accept", *_FRAMING}
        clash = sorted(n for n in self.headers if n.lower() in reserved)
        if clash:
            raise ValueError(f"headers must not set {', '.join(clash)}: the connector sets "
                             "the key, the fence and dispatch number, the content type, "
                             "Accept (it reads JSON only) and the message framing per "
                             "request, and hop-by-hop fields could let a proxy strip the key")
        return self

    @property
    def destination(self) -> str:
        """The ``destination`` string tool bindings should use with this connector."""
        return self.create_path

    def accepts_destination(self, destination: str) -> bool:
        return "/" + destination.strip().lstrip("/") == self.create_path

    def create_url(self) -> str:
        return self.base_url + self.create_path

    def lookup_url(self, key: str) -> str:
        return self.base_url + self._lookup_path(key)

    def _lookup_path(self, key: str) -> str:
        return self.lookup_path_template.replace("{key}", quote(key, safe=""))

    def usable_key(self, key: str) -> bool:
        """Whether ``key`` can be sent (a valid header value) and looked up: its lookup path
        must keep it, which a key such as ``..`` does not (``/charges/..`` is ``/``)."""
        return valid_key(key) and not _dot_segment(self._lookup_path(key))

    def secrets(self) -> tuple[str, ...]:
        """Texts to redact from anything quoted back from a server: the static header
        values and their longer words (a server may echo just the token of ``Bearer t``)."""
        found: set[str] = set()
        for text in self.headers.values():
            flat = " ".join(text.split())
            if flat:
                found.add(flat)
            found.update(word for word in flat.split() if len(word) >= 8)
        # Also as a JSON encoder may echo them in an error body: '"' and '\\' escaped,
        # and '/' written as '\\/' (PHP's json_encode does by default).
        for secret in list(found):
            escaped = json.dumps(secret)[1:-1]
            found.update({escaped, escaped.replace("/", "\\/")})
        return tuple(sorted(found, key=len, reverse=True))

    @property
    def effective_lookup_timeout_s(self) -> float:
        return self.lookup_timeout_s if self.lookup_timeout_s is not None else self.timeout_s


def valid_key(key: str) -> bool:
    """Whether ``key`` can travel as a header value: 1-255 visible ASCII characters."""
    return bool(_KEY.fullmatch(key))
