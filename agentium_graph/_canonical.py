"""Canonical JSON, sha256 digests and deterministic identities.

Canonical form: UTF-8 JSON (non-ASCII kept as UTF-8, not escaped) with object keys sorted by
code point, no insignificant whitespace, no NaN or infinities, integers as integers and
floats as Python's shortest round-trip repr (so ``1`` and ``1.0`` differ), tuples as arrays.
Only string keys are accepted. Every digest in the SDK is ``sha256`` over that form, so
nothing depends on dict order, process ids or wall-clock ties. The format is pinned by a
golden digest in the tests: changing it invalidates every stored task.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from json import encoder as _json_encoder
from typing import Any, Final

JSONValue = Any  # a value made only of dict[str, ...], list, str, int, float, bool, None
# The largest integer every store can hold (MongoDB's are int64): limits, counters, token
# counts and journal positions stay at or below it.
INT64_MAX = 2**63 - 1

_fast_encoder = json.JSONEncoder(ensure_ascii=False, check_circular=False, allow_nan=False,
                                 separators=(",", ":"))
_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


class NotJSONError(ValueError):
    """The value is not plain JSON data; ``path`` says where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$\-]*")


def json_path(parts: Iterable[str | int], root: str = "$") -> str:
    """Render a JSON path: ``$.a[0]``, with odd keys quoted as ``$["a.b"]``."""
    out = root
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _PLAIN_KEY.fullmatch(p):
            out += f".{p}"
        else:
            out += "[" + json.dumps(p, ensure_ascii=False) + "]"
    return out


_Link = tuple[Any, str | int] | None  # (parent link, key): a path built only on error


def _where(root: str, link: _Link) -> str:
    parts: list[str | int] = []
    while link is not None:
        link, key = link
        parts.append(key)
    return json_path(reversed(parts), root)


def _encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no unpaired surrogate), so it can be UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str, root: str, link: _Link) -> None:
    if not _encodable(text):
        raise NotJSONError(_where(root, link), "string holds an unpaired surrogate, which "
                                               "is not valid Unicode")


# Integers of more digits than this are refused: Python will not write them as text beyond
# its default limit (4300 digits, ``sys.set_int_max_str_digits``), so they could be neither
# hashed nor journaled. A fixed bound, so every process accepts the same values.
MAX_INT_DIGITS = 4300
_INT_BOUND = 10 ** MAX_INT_DIGITS


def _check_scalar(item: Any, root: str, link: _Link) -> None:
    if item is None or isinstance(item, bool):
        return
    if isinstance(item, int):
        if -_INT_BOUND < item < _INT_BOUND:
            return
        raise NotJSONError(_where(root, link), f"integer has more than {MAX_INT_DIGITS} "
                                               "digits; pass it as a string")
    if isinstance(item, str):
        if not item.isascii():
            _check_text(item, root, link)
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise NotJSONError(_where(root, link), "NaN and infinities are not JSON")
    else:
        raise NotJSONError(_where(root, link), f"{type(item).__name__} is not a JSON type")


_EXIT = object()
MAX_NESTING = 200  # deeper data is rejected: encoders and validators recurse per level


def check_json(value: Any, path: str = "$") -> None:
    """Raise :class:`NotJSONError` (with the offending path) unless ``value`` is plain JSON.

    Rejects non-string object keys (``json`` would silently turn ``1`` into ``"1"``),
    NaN and infinities, integers of more than :data:`MAX_INT_DIGITS` digits, unpaired
    surrogates, circular containers and non-JSON types.
    Tuples are accepted and encode as arrays. Containers may nest at most
    :data:`MAX_NESTING` levels. One problem is reported, not all.
    """
    # Iterative (deep data must not hit the recursion limit); plain leaves are checked
    # inline and paths are only built for an error, so valid data costs one cheap pass.
    stack: list[tuple[Any, Any, int]] = [(value, None, 0)]
    active: set[int] = set()  # containers on the current path, to detect cycles
    while stack:
        item, link, depth = stack.pop()
        if item is _EXIT:
            active.discard(link)
            continue
        is_dict = isinstance(item, dict)
        if not is_dict and not isinstance(item, list | tuple):
            _check_scalar(item, path, link)
            continue
        ident = id(item)
        if ident in active:
            raise NotJSONError(_where(path, link), "circular reference")
        if depth >= MAX_NESTING:
            raise NotJSONError(_where(path, link), f"nested deeper than {MAX_NESTING} levels")
        active.add(ident)
        stack.append((_EXIT, ident, 0))
        nested: list[tuple[Any, _Link, int]] = []
        for key, child in (item.items() if is_dict else enumerate(item)):
            if is_dict and (type(key) is not str or not key.isascii()):
                if not isinstance(key, str):
                    raise NotJSONError(_where(path, link),
                                       f"object key {key!r} is not a string")
                _check_text(key, path, link)
            kind = type(child)
            if kind is int:
                if -_INT_BOUND < child < _INT_BOUND:
                    continue
            elif kind is bool or child is None or (kind is str and child.isascii()):
                continue
            if kind is float and math.isfinite(child):
                continue
            nested.append((child, (link, key), depth + 1))
        stack.extend(reversed(nested))


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not a JSON type")


# The C encoders behind ``_encoder.encode`` and ``_fast_encoder.encode``, called directly:
# ``encode`` builds a new one on every call, which costs more than encoding a small value.
# They skip the cycle check (checked data has no cycles: a cycle hits the recursion limit
# instead). ``None`` where the C accelerator is missing.
_c_make_encoder = getattr(_json_encoder, "c_make_encoder", None)
_c_canonical = None if _c_make_encoder is None else _c_make_encoder(
    None, _refuse, _json_encoder.encode_basestring, None, ":", ",", True, False, False)
_c_plain = None if _c_make_encoder is None else _c_make_encoder(
    None, _refuse, _json_encoder.encode_basestring, None, ":", ",", False, False, False)


# ``json.loads`` of a text the C encoders above wrote (no whitespace around the value):
# the C scanner ``json.loads`` ends in, called directly. ``loads`` goes through three
# Python calls and two regex matches for the whitespace such a text never has.
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = \
    json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _parse_encoded(text: str) -> Any:
    """``json.loads(text)`` for a text one of this module's encoders wrote."""
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return json.loads(text)  # (not reached for encoder output) raises as loads does
    return value if end == len(text) else json.loads(text)


def _encode_checked(value: JSONValue) -> str:
    """The canonical JSON of data already checked (or parsed from JSON)."""
    if _c_canonical is None:
        return _encoder.encode(value)
    try:
        return "".join(_c_canonical(value, 0))
    except RecursionError:
        raise ValueError("value nests too deeply or is circular: check it first") from None


def canonical_json(value: JSONValue, *, trusted: bool = False) -> str:
    """Serialize ``value`` canonically; raises :class:`NotJSONError` for non-JSON data.

    ``trusted=True`` skips the JSON check for data already checked (or parsed from JSON):
    the hot path must not walk the same value twice.
    """
    if trusted:
        return _encode_checked(value)
    return checked_json(value)[0]


_LONG_DIGITS = re.compile(rf"\d{{{MAX_INT_DIGITS + 1}}}")
_INNERMOST = re.compile(r"[\[{][^\[\]{}]*[\]}]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _nesting_ok(text: str) -> bool:
    """Whether the JSON ``text`` nests at most :data:`MAX_NESTING` levels."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return True  # cannot nest deeper than it has containers
    rest = _STRING.sub("", text)  # brackets inside strings are not containers
    for _ in range(MAX_NESTING + 1):  # one round per level, one more to see none left
        rest, found = _INNERMOST.subn("", rest)
        if not found:
            return True
    return False


def checked_json(value: Any, path: str = "$") -> tuple[str, JSONValue]:
    """The canonical JSON of ``value`` and a fresh copy parsed from it, after the checks of
    :func:`check_json` (raising :class:`NotJSONError` with the path where they fail).

    Plain JSON is checked in C: it is encoded (no NaN, no foreign types), parsed back and
    compared with the original, which only equal when every key was a string and no value
    changed on the way; a value that is too long for the cheap bounds on nesting and integer
    digits, holds tuples or fails any step is walked by :func:`check_json`, which decides
    and names the path."""
    text: str | None = None
    if _c_canonical is not None:
        try:
            text = "".join(_c_canonical(value, 0))
        except (TypeError, ValueError, RecursionError):
            text = None
    if text is not None and (text.isascii() or _encodable(text)) and _nesting_ok(text) and (
            len(text) <= MAX_INT_DIGITS or _LONG_DIGITS.search(text) is None):
        parsed = _parse_encoded(text)
        try:
            same = bool(parsed == value)
        except Exception:  # a subclass's own __eq__ (or __bool__) raised: walk it instead
            same = False
        if same:
            return text, parsed
    check_json(value, path)
    text = _encode_checked(value)
    return text, _parse_encoded(text)


def canonical_bytes(value: JSONValue, *, trusted: bool = False) -> bytes:
    return canonical_json(value, trusted=trusted).encode("utf-8")


def digest(value: JSONValue, *, trusted: bool = False) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    text = canonical_json(value, trusted=trusted)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_digest(value: JSONValue) -> str:
    """:func:`digest` of a pydantic record's JSON-mode dump whose free-form parts were
    checked when they entered (plans, inputs, schemas): the walk is skipped, and a value
    that still is not JSON falls back to the checked path, which names where it is."""
    try:
        return digest(value, trusted=True)
    except (TypeError, ValueError):
        return digest(value)


def digest_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


# Id parts whose C encoding is their canonical JSON as it is (no keys to check, no walk).
_ATOMS = frozenset((str, int, bool, type(None)))


def derive_id(kind: str, *parts: JSONValue) -> str:
    """A deterministic identity: ``<kind>_<first 24 hex of sha256(canonical [kind, *parts])>``."""
    # Ids are derived on the hot path from strings and ints: the C encoder writes their
    # canonical JSON (identical bytes: a test compares it with the checked encoder). Text
    # that is not UTF-8 (an unpaired surrogate), an integer too long to be JSON here, or any
    # other part goes through the checked encoder, which refuses and names what is wrong.
    items = [kind, *parts]
    data = None
    if _c_canonical is not None and _ATOMS.issuperset(map(type, items)):
        try:
            data = "".join(_c_canonical(items, 0)).encode("utf-8")
        except (UnicodeEncodeError, ValueError):
            data = None
        if data is not None and len(data) > MAX_INT_DIGITS:
            data = None  # could hold an integer longer than the checked encoder accepts
    if data is None:
        data = canonical_bytes(items)
    return f"{kind}_{hashlib.sha256(data).hexdigest()[:24]}"


def task_id(key: str) -> str:
    return derive_id("task", key)


def revision_id(key: str, scope: str, revision: int) -> str:
    return derive_id("rev", key, scope, revision)


def incarnation_id(key: str, node_path: str, revision: int, binding: str, version: str,
                   args_digest: str) -> str:
    return derive_id("inc", key, node_path, revision, binding, version, args_digest)


def attempt_id(incarnation: str, number: int) -> str:
    return derive_id("att", incarnation, number)


def admission_id(subject: str, purpose: str) -> str:
    """Admission ids bind a charge to what it pays for, so a replay charges nothing new."""
    return derive_id("adm", subject, purpose)


def json_copy(value: JSONValue, *, trusted: bool = False) -> JSONValue:
    """A deep copy of JSON data that shares nothing with the original."""
    kind = type(value)
    if kind is int or kind is bool or value is None or (
            kind is str and (trusted or value.isascii())):
        return value  # immutable, and nothing to check: nothing to share
    if trusted:
        if _c_plain is None:
            return json.loads(_fast_encoder.encode(value))
        return _parse_encoded("".join(_c_plain(value, 0)))
    return checked_json(value)[1]


class DuplicateKeyError(ValueError):
    """A JSON text whose object gives one key twice: ``json.loads`` would keep the last
    value silently, and a reader keeping the first would see other data."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def loads_unique(text: str) -> Any:
    """``json.loads(text)``, refusing an object with a duplicate key (DuplicateKeyError):
    for text a model wrote, whose journaled form must mean one thing to every reader."""
    return json.loads(text, object_pairs_hook=_unique_pairs)
