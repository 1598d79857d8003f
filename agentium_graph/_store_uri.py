"""Open a durable task store from a URI (``--store`` of the CLI, the demo).

Accepted forms::

    sqlite:///relative/path.db      a file relative to the current directory
    sqlite:////absolute/path.db     an absolute path (four slashes)
    mongodb://host[:port][/database][?options]
    mongodb+srv://host[/database][?options]

Everything after ``sqlite:///`` is taken literally as the filesystem path (``~`` is
expanded; nothing is percent-decoded), except that a ``?`` is refused: SQLite URIs take no
``?options`` here, and a query string must not silently become part of a file name.
Store packages are imported lazily, so the core never imports a driver.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal
from urllib.parse import urlsplit

from agentium_graph.errors import ConfigurationError, StoreError
from agentium_graph.store._protocol import DurableTaskStore

__all__ = ["ACCEPTED_FORMS", "StoreURI", "open_store_uri", "parse_store_uri", "redact"]

ACCEPTED_FORMS = ("sqlite:///relative/path.db, sqlite:////absolute/path.db, "
                  "mongodb://host[:port]/[database], mongodb+srv://host/[database]")

_SQLITE_PREFIX = "sqlite:///"
_MONGO_SCHEMES = ("mongodb", "mongodb+srv")


@dataclass(frozen=True, slots=True)
class StoreURI:
    """A parsed store URI. ``path`` is set for SQLite, ``database`` for MongoDB."""

    scheme: Literal["sqlite", "mongodb"]
    uri: str = field(repr=False)  # may hold a password: repr() shows redact(uri) instead
    path: Path | None = None
    database: str | None = None

    def __repr__(self) -> str:
        return (f"StoreURI(scheme={self.scheme!r}, uri={redact(self.uri)!r}, "
                f"path={self.path!r}, database={self.database!r})")


# URI options whose values may be secrets (tlsCertificateKeyFilePassword, an AWS session
# token inside authMechanismProperties): their values are masked like a password.
_SECRET_OPTION = re.compile(r"password|secret|token|key|credential|authmechanismproperties",
                            re.IGNORECASE)


def redact(uri: str) -> str:
    """``uri`` with any password, and the value of any option that may hold a secret,
    replaced by ``***``, fit for messages and logs. Only a ``user:password@`` part is
    changed of the user part: ``user@`` and an empty ``@`` have no password."""
    # sqlite:///path has no user part or options: a file name may hold ':', '@' and '?'.
    if uri[:len(_SQLITE_PREFIX)].lower() == _SQLITE_PREFIX:
        return uri
    # The options start at the first '?' after the user part (a password may hold one
    # escaped by a driver that is lenient).
    cut = uri.find("?", uri.rfind("@") + 1)
    uri, mark, query = (uri, "", "") if cut < 0 else (uri[:cut], "?", uri[cut + 1:])
    if mark:
        query = "&".join(
            f"{name}=***" if sep and _SECRET_OPTION.search(name) else f"{name}{sep}{value}"
            for name, sep, value in (part.partition("=") for part in query.split("&")))
    head, sep, tail = uri.partition("://")
    userinfo, at, host = tail.rpartition("@")
    if sep and at and ":" in userinfo:
        uri = f"{head}://{userinfo.split(':', 1)[0]}:***@{host}"
    return f"{uri}{mark}{query}"


def _bad(uri: str, why: str) -> ConfigurationError:
    shown = redact(uri)
    return ConfigurationError(
        f"invalid store URI {shown!r}: {why}; accepted forms: {ACCEPTED_FORMS}",
        details={"uri": shown})


def parse_store_uri(uri: str, *, database: str | None = None) -> StoreURI:
    """Parse ``uri`` without any I/O; raise ConfigurationError naming the accepted forms.

    ``database`` overrides the MongoDB database named in the URI path; it is rejected
    for SQLite, where it would silently mean nothing. The MongoDB database is the one
    ``MongoDBDurableTaskStore(uri, database=database)`` uses (``database``, else the URI's
    path as pymongo reads it, else ``agentium``): the store's package decides it, so a
    worker and the CLI given the same URI use the same database, and without that package
    a MongoDB URI raises StoreError saying which package to install.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise _bad(str(uri), "it is empty")
    scheme, sep, rest = uri.partition(":")
    scheme = scheme.lower()
    if not sep or not scheme:
        hint = f" (did you mean sqlite:///{uri}?)" if uri.endswith(".db") else ""
        raise _bad(uri, f"it has no scheme{hint}")
    if scheme == "sqlite":
        if database is not None:
            raise ConfigurationError("--database applies only to mongodb:// store URIs",
                                     details={"uri": uri})
        if not uri[len("sqlite:"):].startswith("///"):
            raise _bad(uri, "a sqlite URI has three slashes before a relative path and four "
                            "before an absolute one")
        raw = uri[len(_SQLITE_PREFIX):]
        if not raw.strip():
            raise _bad(uri, "the database file path is missing")
        if raw.endswith(("/", os.sep)):
            raise _bad(uri, f"{raw!r} names a directory; add the database file's name "
                            f"(e.g. {raw.rstrip('/' + os.sep)}/tasks.db)")
        if "?" in raw:
            # SQLAlchemy-style ?options would silently become part of the file name.
            bare, _, options = uri.partition("?")
            raise _bad(uri, f"a sqlite URI takes no options ('?{options}'): write {bare!r} "
                            "(a file whose name holds '?' needs renaming)")
        if raw == ":memory:":
            raise _bad(uri, "an in-memory database is not durable; name a file")
        if "\0" in raw:
            raise _bad(uri, "the path contains a NUL character, which no file path can hold")
        if not _is_utf8(raw):
            raise _bad(uri, "the path is not valid UTF-8 text (it holds a byte that is not "
                            "UTF-8); SQLite needs a UTF-8 path: rename the file or directory")
        try:
            path = Path(raw).expanduser()
        except RuntimeError:  # "~name" of a user this system does not know
            raise _bad(uri, f"cannot expand {raw.split('/')[0]!r}: no such user's home "
                            "directory; write the path out in full") from None
        return StoreURI(scheme="sqlite", uri=uri, path=path)
    if scheme in _MONGO_SCHEMES:
        try:
            parts = urlsplit(uri)
        except ValueError as exc:  # an unbalanced '[' or ']' of an IPv6 host, say
            raise _bad(uri, f"its host is not valid ({exc})") from None
        if not rest.startswith("//") or not parts.netloc or parts.netloc.endswith("@"):
            raise _bad(uri, "a mongodb URI needs a host after '//'")
        if not _is_utf8(uri):
            raise _bad(uri, "it is not valid UTF-8 text")
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
        if userinfo is not None and not userinfo.partition(":")[0]:
            raise _bad(uri, "the user name before '@' is empty; write user:password@host, "
                            "or leave out the '@' to connect without credentials")
        module = _store_module("agentium_graph_mongodb", "agentium-graph-mongodb")
        # The store's own parser refuses an unknown or malformed ?option (pymongo only warns
        # and goes on without it); the core never imports pymongo.
        name: str = module.MongoDBDurableTaskStore.database_for(uri, database)
        return StoreURI(scheme="mongodb", uri=uri, database=name)
    raise _bad(uri, f"unknown scheme {scheme!r}")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def open_store_uri(uri: str, *, database: str | None = None, must_exist: bool = False,
                   read_only: bool = False) -> DurableTaskStore:
    """Construct the store a URI names; like every store constructor, this does no I/O.

    ``must_exist=True`` (the CLI) refuses a SQLite path whose file does not exist instead
    of letting the store create an empty database there, and opens it with
    ``create=False`` so a file without agentium-graph tables is refused, not initialized;
    a MongoDB store then makes one attempt per operation (``retries=0``), so an unreachable
    server is reported after its server selection timeout. ``read_only=True`` opens a
    SQLite file read-only (``SQLiteDurableTaskStore(..., read_only=True)``: nothing is
    created, converted or migrated), and a MongoDB database with
    ``MongoDBDurableTaskStore(..., read_only=True)`` (no write is sent; a database without
    an agentium-graph store is refused and left uncreated). ``must_exist`` without
    ``read_only`` opens a MongoDB store with ``create=False`` likewise. A store whose package
    is not installed raises StoreError saying which package to install.
    """
    parsed = parse_store_uri(uri, database=database)
    if parsed.scheme == "sqlite":
        assert parsed.path is not None
        try:
            exists = parsed.path.is_file()
            if not exists and parsed.path.is_symlink():
                parsed.path.stat()  # a dangling link or a loop: say which (OSError)
        except FileNotFoundError:
            exists = False
        except OSError as exc:  # e.g. a directory on the path this user may not enter
            raise StoreError(
                f"cannot look at SQLite task database {str(parsed.path)!r}: "
                f"{exc.strerror or exc}; check the path and the permissions of each "
                "directory on it", details={"path": str(parsed.path)}) from None
        if must_exist and not exists:
            where = parsed.path.parent
            blocker = next((d for d in (where, *where.parents) if d.exists()), None)
            why = (f"{str(blocker)!r} is a file, not a directory" if blocker is not None
                   and not blocker.is_dir()
                   else "its directory does not exist" if not where.is_dir()
                   else "it is a directory, not a database file" if parsed.path.is_dir()
                   else "it is not a regular file" if parsed.path.exists()
                   else "no such file")
            raise StoreError(
                f"no SQLite task database at {str(parsed.path)!r} ({why}); check --store "
                "(sqlite:///relative/path.db or sqlite:////absolute/path.db) or set "
                "AGENTIUM_STORE", details={"path": str(parsed.path)})
        cls = _store_class("agentium_graph_sqlite", "SQLiteDurableTaskStore",
                           "agentium-graph-sqlite")
        options: dict[str, Any] = {"read_only": True} if read_only else \
            {"create": False} if must_exist else {}
        if must_exist:
            # A command fails fast on a file another process keeps locked: one wait of the
            # busy timeout, not a worker's backed-off retries (about 26 s); it can be re-run.
            options["busy_retries"] = 0
        store: DurableTaskStore = cls(parsed.path, **options)
        return store
    cls = _store_class("agentium_graph_mongodb", "MongoDBDurableTaskStore",
                       "agentium-graph-mongodb")
    # A command fails fast (must_exist: the CLI): one attempt within the store's 5 s server
    # selection, not the retries a long-running worker wants; the user can run it again.
    retries: dict[str, int] = {"retries": 0} if must_exist else {}
    # As for SQLite: a read-only store only reads, and neither creates a database that holds
    # no store (a typo'd name) nor writes to one; must_exist refuses such a database.
    options = {"read_only": True} if read_only else {"create": False} if must_exist else {}
    # The caller's database (None: the URI's): the store resolves it as parse_store_uri did.
    store = cls(parsed.uri, database=database, **retries, **options)
    return store


def _store_class(module: str, name: str,
                 distribution: str) -> Callable[..., DurableTaskStore]:
    found: Callable[..., DurableTaskStore] = getattr(_store_module(module, distribution), name)
    return found


def _store_module(module: str, distribution: str) -> ModuleType:
    # importlib keeps store packages (and their drivers) optional for the core and mypy.
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        cause = "" if exc.name == module else f" (importing it failed: {exc})"
        raise StoreError(
            f"this store needs the {distribution} package{cause}; install it with "
            f"`pip install {distribution}`", details={"package": distribution}) from None
