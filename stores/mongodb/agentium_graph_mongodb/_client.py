"""The store's arguments and the driver client it makes: checked timeouts and counts, a
URI turned into an ``AsyncMongoClient`` with the store's defaults, how long one driver call
may take, and URIs shown without their secrets."""

from __future__ import annotations

import ipaddress
import math
import warnings
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pymongo import AsyncMongoClient
from pymongo.errors import ConfigurationError as PyMongoConfigurationError
from pymongo.uri_parser import split_options

from agentium_graph.errors import ConfigurationError
from agentium_graph_mongodb._errors import bounded

_MAX_SECONDS = 1_000_000.0  # timeouts beyond ~11 days are mistakes, and overflow the driver


def _shown(value: object) -> str:
    """A wrong argument for an error message: its type and a bounded repr."""
    return f"{type(value).__name__} {bounded(repr(value), 100)}"


def _seconds(name: str, value: object) -> float:
    # An int or a float, never a bool or a string (True is not one second here).
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 < value <= _MAX_SECONDS):
        raise ConfigurationError(
            f"{name} must be a positive number of seconds (an int or a float, at most "
            f"{_MAX_SECONDS:g}), got {_shown(value)}", details={"argument": name})
    return float(value)


def _count(name: str, value: object, minimum: int) -> int:
    # A real int, never a bool, a float or a string (True is not one retry here).
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(
            f"{name} must be an int >= {minimum}, got {_shown(value)}",
            details={"argument": name})
    return int(value)


def _source(uri_or_client: object) -> str:
    """Where a database named by a URI's path came from, for messages (no password)."""
    if isinstance(uri_or_client, str):
        return f"MongoDB URI {_redact(uri_or_client)!r}"
    return "the URI of the given AsyncMongoClient"


def call_deadline(client: AsyncMongoClient[dict[str, Any]]) -> float | None:
    """How long one driver call may take before it counts as stuck: finding a server,
    opening a connection and two replies (a cursor's first batch and one more), plus five
    seconds. None when the client waits for a reply without limit (socketTimeoutMS=0)."""
    try:
        options = client.options
        select = float(options.server_selection_timeout)
        pool = options.pool_options
        connect = pool.connect_timeout
        reply = pool.socket_timeout
    except (AttributeError, TypeError, ValueError):  # a client unlike pymongo's own
        return None
    if reply is None or connect is None:
        return None
    return select + float(connect) + 2 * float(reply) + 5.0


def _client_from_uri(uri: str, server_selection_timeout_s: float, connect_timeout_s: float,
                     socket_timeout_s: float) -> AsyncMongoClient[dict[str, Any]]:
    try:
        parts = urlsplit(uri)
        query = parts.query
        _check_srv_host(parts.scheme, parts.netloc)
        _check_options(query)
        given = {name.lower() for name, _ in _options(query)}
        options: dict[str, Any] = {}
        for name, seconds in (("serverSelectionTimeoutMS", server_selection_timeout_s),
                              ("connectTimeoutMS", connect_timeout_s),
                              ("socketTimeoutMS", socket_timeout_s)):
            if name.lower() not in given:
                options[name] = max(1, int(seconds * 1000))
        if "appname" not in given:
            options["appname"] = "agentium-graph-mongodb"
        if "retrywrites" not in given:
            # The store retries a compare-and-set itself, after inserting its side records
            # again; a driver retry would skip that (see Session._transition).
            options["retryWrites"] = False
        # AsyncMongoClient does no I/O here: it connects (and resolves SRV) on first use.
        return AsyncMongoClient(uri, **options)
    except (PyMongoConfigurationError, ValueError, TypeError) as exc:
        reason = bounded(_without_password(uri, str(exc)), 300)
        raise ConfigurationError(
            f"invalid MongoDB URI {_redact(uri)!r}: {reason}; expected "
            "mongodb://[user:password@]host[:port][/?options] or mongodb+srv://host/",
            details={"uri": _redact(uri), "argument": "uri_or_client"}) from None


def _check_srv_host(scheme: str, netloc: str) -> None:
    """pymongo refuses an IP address after ``mongodb+srv://`` only when it first resolves
    the name (a permanent error on the first call); refuse it here, with the other
    malformed URIs."""
    if scheme.lower() != "mongodb+srv":
        return
    host = netloc.rpartition("@")[2].strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return
    raise ValueError("mongodb+srv:// needs a DNS name whose SRV records list the servers, "
                     "not an IP address; for one server at an address use "
                     "mongodb://ADDRESS:PORT/")


def _options(query: str) -> list[tuple[str, str]]:
    """The options of a URI's query, in order: MongoDB separates them by '&' or, in a URI
    without any, by ';'."""
    separator = "&" if "&" in query or ";" not in query else ";"
    return parse_qsl(query, keep_blank_values=True, separator=separator)


# URI options MongoDB lets a URI give several times (each adds a tag set).
_REPEATABLE = frozenset({"readpreferencetags"})


def _check_options(query: str) -> None:
    """Refuse an unknown URI option or a malformed value, naming the option (not its value,
    which may be a secret). pymongo only warns and goes on without it: with
    ``serverSelectionTimeoutMS=abc`` an unreachable server would be reported after the
    driver's 30 s default instead of the store's 5 s."""
    if not query:
        return
    seen: set[str] = set()
    for name, _ in _options(query):
        lowered = name.lower()
        if lowered in seen and lowered not in _REPEATABLE:
            # pymongo only warns and keeps one of them.
            raise ValueError(f"URI option {name!r} is given more than once; give it once")
        seen.add(lowered)
    try:
        _split_strictly(query)
    except (PyMongoConfigurationError, ValueError, TypeError) as exc:
        for name, value in _options(query):
            try:
                _split_strictly(f"{name}={value}")
            except (PyMongoConfigurationError, ValueError, TypeError):
                raise ValueError(f"URI option {name!r} is unknown or has a malformed value "
                                 f"({exc})") from None
        raise


def _split_strictly(query: str) -> None:
    """pymongo's own check of ``query``, where a warning is an error too: it only warns
    about a value it then drops (``compressors=zlibb``, a compressor whose module is not
    installed), and the client would go on without what the URI asked for."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split_options(query, validate=True, warn=False)
    for warning in caught:
        if issubclass(warning.category, UserWarning):
            raise ValueError(str(warning.message))
    for warning in caught:  # e.g. a DeprecationWarning for a deprecated option: shown
        warnings.warn(warning.message, warning.category, stacklevel=4)


def _without_password(uri: str, text: str) -> str:
    """``text`` (a driver message that may quote the URI) with the URI's password masked."""
    userinfo = uri.partition("://")[2].partition("/")[0].rpartition("@")[0]
    secret = userinfo.partition(":")[2]
    for form in {secret, unquote(secret)} - {""}:
        text = text.replace(form, "***")
    return text


def _redact(uri: str) -> str:
    """The URI without its password (and without options, which may carry secrets)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparsable MongoDB URI>"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, hosts = netloc.rpartition("@")
        name, colon, _ = user.partition(":")
        netloc = f"{name}:***@{hosts}" if colon else f"{name}@{hosts}"
    return f"{parts.scheme}://{netloc}{parts.path}"
