"""Canonical JSON, sha256 digests and deterministic identities.

Canonical form: UTF-8 JSON with object keys sorted, no insignificant whitespace, no NaN or
infinities, integers as integers. Every digest in the SDK is ``sha256`` over that form, so
nothing depends on dict order, process ids or wall-clock ties.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

JSONValue = Any  # a value made only of dict[str, ...], list, str, int, float, bool, None

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


class NotJSONError(ValueError):
    """The value is not plain JSON data; ``path`` says where."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def check_json(value: Any, path: str = "$") -> None:
    """Raise :class:`NotJSONError` unless ``value`` is plain JSON data."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if item is None or isinstance(item, bool | str | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise NotJSONError(where, "NaN and infinities are not JSON")
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise NotJSONError(where, f"object key {k!r} is not a string")
                stack.append((v, f"{where}.{k}"))
            continue
        if isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
            continue
        raise NotJSONError(where, f"{type(item).__name__} is not a JSON type")


def canonical_json(value: JSONValue) -> str:
    """Serialize ``value`` canonically; raises :class:`NotJSONError` for non-JSON data."""
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError):
        check_json(value)
        raise


def canonical_bytes(value: JSONValue) -> bytes:
    return canonical_json(value).encode("utf-8")


def digest(value: JSONValue) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


def digest_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def derive_id(kind: str, *parts: JSONValue) -> str:
    """A deterministic identity: ``<kind>_<first 24 hex of sha256(canonical [kind, *parts])>``."""
    h = hashlib.sha256(canonical_bytes([kind, *parts])).hexdigest()
    return f"{kind}_{h[:24]}"


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


def json_copy(value: JSONValue) -> JSONValue:
    """A deep copy of JSON data that shares nothing with the original."""
    return json.loads(canonical_json(value))
