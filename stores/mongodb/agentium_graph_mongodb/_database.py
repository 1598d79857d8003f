"""Which database a store uses, and MongoDB's rules for its name; no I/O.

One rule, for the store and for the ``agentium-graph`` CLI alike (the CLI asks
:meth:`MongoDBDurableTaskStore.database_for`): an explicit ``database`` wins; otherwise the
database the client's URI names, as pymongo reads it (``client.get_default_database()``:
the URI's path, percent-decoded, up to its first ``.``); otherwise ``agentium``.
"""

from __future__ import annotations

from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import InvalidName

from agentium_graph.errors import ConfigurationError
from agentium_graph_mongodb._errors import bounded

__all__ = ["DEFAULT_DATABASE", "check_database_name", "resolve_database"]

DEFAULT_DATABASE = "agentium"
_FORBIDDEN = '/\\. "$*<>:|?\x00'
_MAX_BYTES = 63
_SYSTEM_DATABASES = frozenset({"admin", "local", "config"})
_RULE = f"use at most {_MAX_BYTES} bytes of letters, digits, '_' or '-'"


def resolve_database(client: AsyncMongoClient[dict[str, Any]], database: str | None, *,
                     source: str) -> str:
    """The store's database: ``database`` if given (checked by the caller), else the one
    ``client``'s URI names, else :data:`DEFAULT_DATABASE`. ``source`` describes where the
    client's URI came from in messages (``MongoDB URI 'mongodb://u:***@h/admin'``, with
    the password already redacted)."""
    if database is not None:
        return database
    try:
        # No I/O: pymongo parsed the URI when the client was constructed.
        named = client.get_default_database(DEFAULT_DATABASE).name
    except InvalidName as exc:  # a '\' or a NUL, percent-encoded in the path
        raise ConfigurationError(
            f"invalid MongoDB database name in the path of {source} (the path of a MongoDB "
            f"URI names the store's database): {exc}; {_RULE}, or pass database=...",
            details={"argument": "uri_or_client"}) from None
    if named != DEFAULT_DATABASE:
        check_database_name(named, source=source)
    return named


def check_database_name(name: object, *, source: str | None = None) -> None:
    """MongoDB's rules for database names, and none of MongoDB's own databases. ``source``:
    the name came from the path of that URI (see :func:`resolve_database`), not from
    ``database=``; the message then says so."""
    problem = None
    if not isinstance(name, str):
        problem = f"must be a string, got {type(name).__name__}"
    elif not name:
        problem = "is empty"
    elif name.lower() in _SYSTEM_DATABASES:
        raise _system_database(name, source)
    elif bad := sorted({c for c in name if c in _FORBIDDEN}):
        problem = f"contains {', '.join(repr(c) for c in bad)}"
    else:
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            problem = "is not valid Unicode text"
        else:
            if size > _MAX_BYTES:
                problem = f"is {size} bytes long (MongoDB allows {_MAX_BYTES})"
    if problem is None:
        return
    if source is None:
        raise ConfigurationError(
            f"invalid MongoDB database name {bounded(repr(name), 100)} (database=...): it "
            f"{problem}; {_RULE}", details={"argument": "database"})
    raise ConfigurationError(
        f"invalid MongoDB database name {bounded(repr(name), 100)} in the path of {source} "
        f"(the path of a MongoDB URI names the store's database): it {problem}; {_RULE}, or "
        "pass database=...", details={"argument": "uri_or_client"})


def _system_database(name: str, source: str | None) -> ConfigurationError:
    why = ("'local' is never replicated (a failover would lose every task), 'config' holds "
           "a sharded cluster's metadata and 'admin' its users")
    if source is None:
        return ConfigurationError(
            f"database={name!r} is one of MongoDB's own databases (admin, local, config): "
            f"{why}. Give the store a database of its own, for example "
            f"database={DEFAULT_DATABASE!r}", details={"argument": "database"})
    # mongodb://user:pw@host/admin is a common way to name the authentication database.
    return ConfigurationError(
        f"{source} names the database {name!r}, one of MongoDB's own (admin, local, "
        f"config): the path of a MongoDB URI names the store's database, and {why}. If the "
        f"path names the database to authenticate against, use ?authSource={name} in the "
        f"URI instead and pass database={DEFAULT_DATABASE!r} (or write a path naming the "
        f"store's database: mongodb://user:password@host/{DEFAULT_DATABASE}?authSource={name})",
        details={"argument": "uri_or_client", "database": name})
