"""How records map to MongoDB documents (see docs/design/mongodb-layout.md).

Records whose content is free-form (node and action records, the identity, journal
entries, charges, an error's details) are stored as their canonical pydantic JSON text:
it round-trips exactly (microsecond, timezone-aware datetimes; integers beyond int64; keys
such as ``$ref`` or ``a.b`` that are special in MongoDB field paths). The header is stored
field by field so that a commit can ``$set`` only what changed and a cancel request or a
lease renewal can touch only its own field.

Map keys chosen by callers (node ids, action ids, admission ids, counter names) become
field names through :func:`encode_key`, which escapes every character that is special in
a field path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from agentium_graph.errors import ErrorInfo, StoreSchemaError
from agentium_graph.store import JournalEntry, NodeRecord, TaskHeader, missing_persisted
from agentium_graph_mongodb._errors import bounded

#: The layout version this package reads and writes. Every document carries it as ``v``.
SCHEMA_VERSION = 1

TASKS, JOURNAL, BLOBS, META = "tasks", "journal", "blobs", "meta"
META_ID = "agentium-graph-mongodb"

# Escapes: '%' first so decoding is unambiguous; '.' and '$' are field-path syntax; NUL is
# not allowed in BSON keys. The empty string (not a valid path segment) becomes a bare '%'.
_ESCAPES = (("%", "%25"), (".", "%2E"), ("$", "%24"), ("\x00", "%00"))


def encode_key(key: str) -> str:
    """A field name for ``key`` that is safe as one segment of a dotted path."""
    if not key:
        return "%"
    for raw, escaped in _ESCAPES:
        key = key.replace(raw, escaped)
    return key


def decode_key(field: str) -> str:
    """The inverse of :func:`encode_key`."""
    if field == "%":
        return ""
    for raw, escaped in reversed(_ESCAPES):
        field = field.replace(escaped, raw)
    return field


# --- error texts kept inline -----------------------------------------------------------------
#: An error is stored twice in the task document (the node record and, when it fails the
#: task, the header), once per failed node: so that a failing node can always be recorded
#: under MongoDB's 16 MiB document limit, an inline error keeps at most this much of its
#: message (and a bounded excerpt of its details). The journal entry of the failure, a
#: document of its own, keeps the full error.
INLINE_ERROR_CHARS = 4096
_INLINE_DETAIL_CHARS = 256
_INLINE_DETAIL_KEYS = 32


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return (f"{text[:limit]}... [truncated by the MongoDB store: {len(text) - limit} more "
            "characters; the task's timeline has the full text]")


def inline_error(error: ErrorInfo) -> ErrorInfo:
    """``error`` as the task document keeps it: unchanged when small, else bounded."""
    if len(error.message) <= INLINE_ERROR_CHARS and len(error.details) <= _INLINE_DETAIL_KEYS \
            and len(json.dumps(error.details, default=str)) <= INLINE_ERROR_CHARS:
        return error
    details: dict[str, Any] = {}
    for name, value in list(error.details.items())[:_INLINE_DETAIL_KEYS]:
        if not isinstance(value, str | int | float | bool) and value is not None:
            value = json.dumps(value, default=str)
        if isinstance(value, str):
            value = _cut(value, _INLINE_DETAIL_CHARS)
        details[_cut(str(name), _INLINE_DETAIL_CHARS)] = value
    return error.model_copy(update={"message": _cut(error.message, INLINE_ERROR_CHARS),
                                    "details": details})


def stored_node(node: NodeRecord) -> NodeRecord:
    """The node record as the task document keeps it (its error bounded)."""
    if node.error is None:
        return node
    error = inline_error(node.error)
    return node if error is node.error else node.model_copy(update={"error": error})


# --- header --------------------------------------------------------------------------------

def header_doc(header: TaskHeader) -> dict[str, Any]:
    """The stored form of a header: JSON-mode fields, encoded map keys, error as text."""
    doc = header.model_dump(mode="json")
    if doc.get("plan_digest") is None:  # static plans: readable by versions before the field
        doc.pop("plan_digest", None)
    doc["counters"] = {encode_key(k): v for k, v in header.counters.items()}
    doc["limits"] = {encode_key(k): v for k, v in header.limits.items()}
    doc["error"] = None if header.error is None else inline_error(header.error).model_dump_json()
    return doc


def header_from_doc(doc: object, where: str, key: str) -> TaskHeader:
    """The header of the task document ``key``, parsed strictly: the store's queries
    compare stored values exactly (``header.fence: 1`` never matches ``"1"``), so a value
    pydantic would coerce is damage, not a header that no write can then match."""
    if not isinstance(doc, Mapping):
        raise damaged(where, "header is missing" if doc is None else
                      f"header is not a document (a {type(doc).__name__})", key)
    fields = dict(doc)
    for name in ("counters", "limits"):
        if isinstance(fields.get(name), Mapping):
            fields[name] = {decode_key(str(k)): v for k, v in fields[name].items()}
    error = fields.get("error")
    if isinstance(error, str):
        with schema_errors(where, "header.error", key):
            fields["error"] = json.loads(error)
    with schema_errors(where, "header", key):
        # Anything JSON cannot hold (a BSON date, an ObjectId) becomes a value no header
        # field accepts, so the error names its field.
        text = json.dumps(fields, default=lambda value: {"bson": type(value).__name__})
        header = TaskHeader.model_validate_json(text, strict=True)
    gap = missing_persisted(header)
    if gap is not None:  # it would read as its default (a used fence as 0)
        raise damaged(where, f"header.{gap} is missing, which every store writes", key)
    if header.key != key:
        raise damaged(where, f"header.key is {bounded_repr(header.key)}, not the document's "
                      f"_id {bounded_repr(key)}", key)
    return header


def changed_header_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``$set`` paths for the header fields that differ, never the cancel request.

    A cancel request belongs to whoever requested it; the lease holder's writes must not
    overwrite it, so it is left out even when the caller's copy is stale.
    """
    return {f"header.{name}": value for name, value in new.items()
            if name != "cancel" and old.get(name) != value}


# --- documents -------------------------------------------------------------------------------

def check_version(doc: Mapping[str, Any], where: str, key: str | None = None) -> None:
    """Refuse a document written by a newer (or no) agentium-graph-mongodb schema."""
    version = doc.get("v")
    extra = {} if key is None else {"key": key}
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreSchemaError(
            f"MongoDB store: {where} is not an agentium-graph-mongodb document (no schema "
            "version); point the store at a database of its own (database=...)",
            details={"where": where, **extra})
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"MongoDB store: {where} was written with store schema version {version}, newer "
            f"than this agentium-graph-mongodb supports ({SCHEMA_VERSION}); upgrade "
            "agentium-graph-mongodb to read it (nothing was changed)",
            details={"where": where, "schema_version": version,
                     "supported": SCHEMA_VERSION, **extra})


APPLICATION = "agentium-graph-mongodb"  # the meta document's "application"


def check_meta(doc: Mapping[str, Any], where: str) -> None:
    """Refuse a meta document of a newer schema, or of another application."""
    check_version(doc, where)
    application = doc.get("application")
    if application != APPLICATION:
        raise StoreSchemaError(
            f"MongoDB store: {where} names the application {bounded_repr(application)}, not "
            f"{APPLICATION!r}: the database belongs to another application; point the store "
            "at a database of its own (database=...); nothing was changed",
            details={"where": where, "application": bounded_repr(application)})


def damaged(where: str, problem: str, key: str | None = None) -> StoreSchemaError:
    """The error for a stored document that cannot be read: ``problem`` names the field."""
    details: dict[str, Any] = {"where": where, "problem": problem}
    if key is not None:
        details["key"] = key
    return StoreSchemaError(
        f"MongoDB store: {where} cannot be parsed: {problem}; it was edited by hand or "
        "written by an incompatible version. Restore it from a backup or upgrade "
        "agentium-graph-mongodb", details=details)


@contextmanager
def schema_errors(where: str, field: str = "", key: str | None = None) -> Iterator[None]:
    """Turn a parse failure of a stored document into a StoreSchemaError naming the field:
    ``field`` is the document path of what is parsed inside the block ("" for the whole
    document); pydantic's error locations are relative to it."""
    try:
        yield
    except (ValidationError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise damaged(where, _problem(exc, field), key) from exc


def _problem(exc: Exception, field: str) -> str:
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        path = ".".join(str(p) for p in (field, *first.get("loc", ())) if p != "")
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        return f"{path or 'the document'}: {bounded(str(first.get('msg', '?')), 200)}{more}"
    if isinstance(exc, KeyError):
        return f"{field or bounded_repr(exc.args[0] if exc.args else '?')} is missing"
    text = bounded(str(exc), 200) or type(exc).__name__
    return f"{field}: {text}" if field else text


def bounded_repr(value: object) -> str:
    return bounded(repr(value), 100)


def journal_doc(key: str, entry: JournalEntry, token: str) -> dict[str, Any]:
    """A journal entry: ``_id`` is ``{key}:{seq}`` (unique: the seq follows the last ':')."""
    return {"_id": journal_id(key, entry.seq), "k": key, "s": entry.seq,
            "v": SCHEMA_VERSION, "t": token, "e": entry.model_dump_json()}


def journal_id(key: str, seq: int) -> str:
    return f"{key}:{seq}"


def entry_from_doc(doc: Mapping[str, Any]) -> JournalEntry:
    where = f"journal entry {doc.get('_id')!r}"
    key = doc.get("k")
    key = key if isinstance(key, str) else None
    check_version(doc, where, key)
    with schema_errors(where, "e", key):
        return JournalEntry.model_validate_json(doc["e"])


def blob_doc(digest: str, text: str) -> dict[str, Any]:
    return {"_id": digest, "v": SCHEMA_VERSION, "body": text}


def blob_text(doc: Mapping[str, Any]) -> str:
    where = f"blob {doc.get('_id')!r}"
    check_version(doc, where)
    body = doc.get("body")
    if not isinstance(body, str):
        raise StoreSchemaError(f"MongoDB store: {where} has no text body; restore it from a "
                               "backup", details={"where": where})
    return body


def charges_text(charges: Mapping[str, int]) -> str:
    return json.dumps(dict(charges), sort_keys=True, separators=(",", ":"))
