"""Checks of the arguments users pass to the runtime: a wrong type or value is a
ConfigurationError that names the argument and says what to pass, raised before anything is
stored. Also the timeline cursor's encoding."""

from __future__ import annotations

import base64
import binascii
import inspect
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from agentium_graph._canonical import INT64_MAX, digest
from agentium_graph._program import ExecutionGraphProgram
from agentium_graph.catalog._bindings import is_async_callable
from agentium_graph.errors import ConfigurationError
from agentium_graph.runtime._config import Budgets, RootLimits

M = TypeVar("M", RootLimits, Budgets)

# The store operations the runtime itself calls.
_STORE_CALLS = ("create_task", "get_header", "get_task", "get_identity", "acquire_lease",
                "renew_lease", "release_lease", "request_cancel", "commit", "get_blobs",
                "read_timeline")

_CURSOR_PREFIX = "agt1:"


def check_runtime_args(*, store: object, require_durable: object, lease_ttl: object,
                       poll_interval: object, effect_timeout: object, lookup_timeout: object,
                       lookup_attempts: object, clock: object, on_admission: object,
                       policy_revision: object, programs: object) -> None:
    """The types of ``ExecutionGraphRuntime(...)``'s arguments (their ranges are checked
    where they are used)."""
    if store is not None:
        # What the runtime calls, checked by name: a wrapper or test double that has these
        # works even without the rest of the protocol (list_tasks, close, async with).
        missing = [m for m in _STORE_CALLS if not callable(getattr(store, m, None))]
        if isinstance(store, type) or missing or not hasattr(store, "capabilities"):
            what = f" (it lacks {', '.join(f'{m}()' for m in missing)})" \
                if missing and not isinstance(store, type) else ""
            raise ConfigurationError(
                f"store must implement the DurableTaskStore protocol, not "
                f"{kind(store)}{what}; pass a store instance (InMemoryDurableTaskStore(), "
                "SQLiteDurableTaskStore(path), MongoDBDurableTaskStore(uri)) or omit it")
    if not isinstance(require_durable, bool):
        raise ConfigurationError(f"require_durable must be True or False, not "
                                 f"{kind(require_durable)}")
    for name, value in (("lease_ttl", lease_ttl), ("poll_interval", poll_interval),
                        ("effect_timeout", effect_timeout),
                        ("lookup_timeout", lookup_timeout)):
        if not is_number(value):
            raise ConfigurationError(f"{name} must be a number of seconds, not "
                                     f"{kind(value)}")
    if not isinstance(lookup_attempts, int) or isinstance(lookup_attempts, bool):
        raise ConfigurationError(f"lookup_attempts must be an int between 1 and 10, not "
                                 f"{kind(lookup_attempts)}")
    for name, fn in (("clock", clock), ("on_admission", on_admission)):
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"{name} must be a callable or None, not {kind(fn)}")
        if fn is not None and (is_async_callable(fn) or inspect.isasyncgenfunction(fn)):
            # Called without await: its coroutine would be dropped unseen.
            raise ConfigurationError(
                f"{name} must be a plain function, not an async one: the runtime calls it "
                "synchronously and would never await it; pass a 'def' function (hand "
                "async work to a task or queue of your own from it)")
    check_policy_revision(policy_revision)
    if isinstance(programs, ExecutionGraphProgram) or not isinstance(programs, Iterable):
        raise ConfigurationError(
            f"programs must be a list of ExecutionGraphProgram, not {kind(programs)}; "
            "pass programs=[program, ...]")


def kind(value: object) -> str:
    """How an error names a wrong value: its type (and the value when it is short)."""
    if isinstance(value, type):
        return f"the class {value.__name__} (pass an instance)"
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 else type(value).__name__


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_policy_revision(value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"policy_revision must be a non-empty string (e.g. '2'), "
                                 f"not {kind(value)}")


def root_limits(value: object, default: RootLimits) -> RootLimits:
    """``limits=``: a RootLimits, a dict of its fields (validated into one), or None."""
    return _model_arg(RootLimits, "limits", value, default)


def budgets_arg(value: object) -> Budgets:
    """``budgets=``: a Budgets, a dict of its fields (validated into one), or None."""
    return _model_arg(Budgets, "budgets", value, Budgets())


def _model_arg(cls: type[M], name: str, value: object, default: M) -> M:
    if value is None:
        return default
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        try:
            return cls(**{str(k): v for k, v in value.items()})
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{name}: {exc} (a dict given as {name} takes the fields of "
                f"{cls.__name__}: {', '.join(cls.model_fields)})") from None
    raise ConfigurationError(f"{name} must be {cls.__name__}(...), a dict of its fields or "
                             f"None, not {kind(value)}")


def grants_arg(value: object) -> tuple[str, ...] | None:
    """``grants=``: None (every binding) or a list of binding ids, sorted and unique."""
    if value is None:
        return None
    if isinstance(value, str):
        raise ConfigurationError(f"grants must be a list of binding ids, not a string; pass "
                                 f"grants=[{value!r}]")
    if isinstance(value, bytes | Mapping) or not isinstance(value, Iterable):
        raise ConfigurationError(f"grants must be a list of binding ids (or None for every "
                                 f"binding), not {kind(value)}")
    ids = list(value)
    bad = [g for g in ids if not isinstance(g, str) or not g]
    if bad:
        raise ConfigurationError(f"grants must be a list of binding ids, each a non-empty "
                                 f"string; {kind(bad[0])} is not one")
    return tuple(sorted(set(ids)))


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 200:
        raise ConfigurationError("task key must be a non-empty string of at most 200 chars")
    check_text("task key", key)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_new_key(key: str) -> None:
    """:func:`check_key`, and what a new task's key may not hold: control characters (a
    NUL or a newline cannot be typed or shown on a command line, and an escape sequence
    would drive an operator's terminal) and nothing but whitespace. Keys of tasks that
    already exist are only held to :func:`check_key`, so every stored task stays reachable."""
    check_key(key)
    found = _CONTROL.search(key)
    if found is not None:
        raise ConfigurationError(
            f"task key {key!r} holds the control character {found.group()!r} at position "
            f"{found.start()}; use printable text (e.g. an id, a UUID or 'order-42')")
    if key.isspace():
        raise ConfigurationError(f"task key {key!r} is only whitespace; use printable text")


def check_text(what: str, value: str) -> None:
    """Refuse text no store can hold: lone surrogates (e.g. undecodable bytes of a command
    line argument) have no UTF-8 form, and would fail deep in a store instead."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{what} {value!r} is not valid Unicode text (a lone surrogate at position "
            f"{exc.start}, often from bytes that are not UTF-8); pass UTF-8 text") from None


#: Longest cancel reason accepted (a traceback fits): the task's header keeps it, so every
#: later write of the header carries it, and a store's record has a size limit (MongoDB's
#: task document: 16 MiB). The errors of the nodes the cancel closes quote it bounded.
MAX_REASON_CHARS = 16_000
#: Longest operator name (``actor``): ``operator:<actor>`` becomes the lease owner while a
#: resolution is recorded, and lease owners are bounded like a worker id.
MAX_ACTOR_CHARS = 200


def check_reason(value: object) -> str:
    """A cancel reason: a non-blank string of at most :data:`MAX_REASON_CHARS` characters."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"cancel needs a reason: a non-blank string saying why "
                                 f"(it is journaled), not {kind(value)}")
    if len(value) > MAX_REASON_CHARS:
        raise ConfigurationError(
            f"cancel reason is {len(value):,} characters, more than the {MAX_REASON_CHARS:,} "
            "accepted (the task's header keeps it): say why in a few lines and keep logs "
            "elsewhere; nothing was recorded",
            details={"field": "reason", "length": len(value), "limit": MAX_REASON_CHARS})
    check_text("cancel reason", value)
    return value


def check_actor(value: object) -> str:
    """An operator's name for ``resolve_action``: non-blank, at most
    :data:`MAX_ACTOR_CHARS` characters."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError("resolve_action needs actor=... (who attests the outcome): "
                                 f"a non-blank name the journal records, not {kind(value)}")
    if len(value) > MAX_ACTOR_CHARS:
        raise ConfigurationError(
            f"actor is {len(value):,} characters, more than the {MAX_ACTOR_CHARS} accepted "
            "(it is recorded as the lease owner while the resolution is written); pass a "
            "short operator name; nothing was recorded",
            details={"field": "actor", "length": len(value), "limit": MAX_ACTOR_CHARS})
    check_text("actor", value)
    return value


def deadline_arg(value: datetime | timedelta | None,
              now: datetime) -> tuple[datetime | None, float | None]:
    if value is None:
        return None, None
    if isinstance(value, timedelta):
        if value.total_seconds() <= 0:
            raise ConfigurationError("a relative deadline must be positive")
        try:
            now + value
        except OverflowError:
            raise ConfigurationError(
                f"a relative deadline of {value} ends after the year 9999; pass a shorter "
                "timedelta, or deadline=None for no deadline") from None
        return None, value.total_seconds()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ConfigurationError("deadline must be timezone-aware (e.g. datetime.now(UTC))")
        try:
            return value.astimezone(UTC), None
        except OverflowError:  # e.g. 9999-12-31 23:00 at UTC-5 is past the year 9999 in UTC
            raise ConfigurationError(
                f"deadline {value.isoformat()} is after the year 9999 in UTC; pass an "
                "earlier deadline, or deadline=None for no deadline") from None
    raise ConfigurationError("deadline must be a datetime, a timedelta or None")


def encode_cursor(key: str, seq: int) -> str:
    raw = f"{_CURSOR_PREFIX}{digest(key)[7:19]}:{seq}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, key: str) -> int:
    if cursor is None:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, key_tag, seq = raw.rsplit(":", 2)
        if prefix + ":" != _CURSOR_PREFIX or key_tag != digest(key)[7:19] or \
                not 0 <= int(seq) <= INT64_MAX:
            raise ValueError(raw)
        return int(seq)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ConfigurationError(
            f"invalid timeline cursor for task {key!r}; pass a next_cursor returned by "
            "timeline() for the same task") from None
