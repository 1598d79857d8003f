"""A sound compiled fast path for JSON Schema validation on the per-node hot path.

``jsonschema``'s ``iter_errors`` costs tens of microseconds per call, mostly in generic
dispatch. :func:`compile_fast` translates a schema, once, into a plain-Python predicate
built from nested closures. The predicate is *sound but conservative*: it returns True
only when the full ``jsonschema`` validator would accept the instance, and False whenever
it is unsure (including for every invalid instance). A False therefore means "ask
``jsonschema``", which decides and produces the error messages.

Soundness rules the design:

* only a small keyword subset is compiled, each keyword mirroring ``jsonschema``'s own
  check with the same Python operators (so NaN, ``-0.0`` and big-int comparisons behave
  identically); any other keyword anywhere in the schema makes the schema uncompilable;
* instances are dispatched on their *exact* type (``type(v) is dict``), never
  ``isinstance``: subclasses (``bool`` of ``int``, ``OrderedDict``, enums, ...), tuples and
  non-JSON values all fall back to ``jsonschema``;
* floats that are not finite, floats under ``"integer"`` and enum/const matches that are
  not type-strict equalities also fall back, rather than re-implementing the corner cases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import (
    Draft3Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
)
from jsonschema.validators import validator_for

Predicate = Callable[[Any], bool]

__all__ = ["Predicate", "compile_fast"]

_DRAFTS: tuple[type, ...] = (Draft202012Validator, Draft201909Validator, Draft7Validator,
                             Draft6Validator)

# Keywords that never affect validity in the supported drafts. Each is also checked
# against the draft's VALIDATORS at compile time, so a draft that did assert one of them
# would make the schema uncompilable instead of silently ignored.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly"})

_NONE = type(None)
_JSON_TYPES: tuple[type, ...] = (dict, list, str, int, float, bool, _NONE)
# "integer" is deliberately int only: jsonschema (draft 6+) also accepts integral floats,
# which fall back to it.
_TYPE_NAMES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
    "number": (int, float), "boolean": (bool,), "null": (_NONE,),
}
# Values an enum/const may match type-strictly: for these, Python ``==`` within one
# exact type agrees with jsonschema's ``equal`` (floats only when not NaN).
_SCALARS = (str, int, float, bool, _NONE)


class _Unsupported(Exception):
    """Raised while compiling when a schema uses something the fast path cannot mirror."""


_MISSING: Any = object()


def _always(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


def compile_fast(schema: Mapping[str, Any], validator_cls: type, *,
                 format_checker: object | None = None) -> Predicate | None:
    """A predicate that is True only for instances ``validator_cls(schema)`` accepts.

    None when the schema (or the draft) is outside the compiled subset; callers then use
    the real validator alone. ``format`` is an annotation only when the validator has no
    ``format_checker``; pass the validator's own so an asserting one disables the fast path.
    """
    if validator_cls not in _DRAFTS or not isinstance(schema, Mapping):
        return None
    try:
        return _Compiler(validator_cls, format_checker is None).root(schema)
    except (_Unsupported, RecursionError, re.error, TypeError):
        return None


def _limit(value: Any) -> int | float:
    # Same comparison operands as jsonschema; bools and non-numbers are left to it.
    if type(value) not in (int, float):
        raise _Unsupported
    return value  # type: ignore[no-any-return]


class _Compiler:
    def __init__(self, validator_cls: type, format_is_annotation: bool) -> None:
        self.cls = validator_cls
        self.keywords: Mapping[str, Any] = getattr(validator_cls, "VALIDATORS", {})
        self.format_is_annotation = format_is_annotation
        for name in _ANNOTATIONS:
            if name in self.keywords:
                raise _Unsupported

    def root(self, schema: Mapping[str, Any]) -> Predicate:
        if "$schema" in schema:
            uri = schema["$schema"]
            if not isinstance(uri, str) or \
                    validator_for({"$schema": uri}, default=Draft3Validator) is not self.cls:
                raise _Unsupported
            schema = {k: v for k, v in schema.items() if k != "$schema"}
        return self.schema(schema)

    def schema(self, node: Any) -> Predicate:
        if node is True:
            return _always
        if node is False:
            return _never
        if not isinstance(node, Mapping):
            raise _Unsupported
        for key in node:
            if key in _ANNOTATIONS:
                continue
            if key == "format" and self.format_is_annotation:
                continue
            if key not in _HANDLED:
                raise _Unsupported
        table: dict[type, Predicate] = {t: _always for t in _JSON_TYPES}
        constrained = False
        if "type" in node:
            names = node["type"]
            names = [names] if isinstance(names, str) else names
            if not isinstance(names, list):
                raise _Unsupported
            allowed: set[type] = set()
            for name in names:
                if not isinstance(name, str) or name not in _TYPE_NAMES:
                    raise _Unsupported
                allowed.update(_TYPE_NAMES[name])
            table = {t: p for t, p in table.items() if t in allowed}
            constrained = True
        values = self.values(node)
        if values is not None:
            table = {t: _member(values[t]) for t in table if t in values}
            constrained = True
        for kind, build in ((dict, self.object), (list, self.array), (str, _string),
                            (int, _number), (float, _number)):
            if kind in table:
                check = build(node)
                if check is not None:
                    table[kind] = _both(table[kind], check)
                    constrained = True
            elif any(k in node for k in _KIND_KEYWORDS[kind]):
                # Still compile the keyword's value so a malformed schema is rejected
                # consistently, whatever its "type".
                build(node)
        if float in table:
            table[float] = _both(_finite, table[float])
        if not constrained:
            return _always
        return _dispatch(table)

    def values(self, node: Mapping[str, Any]) -> dict[type, frozenset[Any]] | None:
        """The enum/const values usable type-strictly, by exact type; None if neither."""
        allowed: list[Any] | None = None
        if "enum" in node:
            if not isinstance(node["enum"], list):
                raise _Unsupported
            allowed = list(node["enum"])
        if "const" in node:
            const = node["const"]
            # const narrows enum: only values equal (type-strictly) to const remain.
            allowed = [const] if allowed is None else \
                [v for v in allowed if type(v) is type(const) and _same(v, const)]
        if allowed is None:
            return None
        by_type: dict[type, set[Any]] = {}
        for value in allowed:
            kind = type(value)
            if kind not in _SCALARS or (kind is float and math.isnan(value)):
                continue  # a structured or odd value: never matched here, jsonschema decides
            by_type.setdefault(kind, set()).add(value)
        return {k: frozenset(v) for k, v in by_type.items()}

    def object(self, node: Mapping[str, Any]) -> Predicate | None:
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise _Unsupported
        props_schema = node.get("properties", {})
        if not isinstance(props_schema, Mapping):
            raise _Unsupported
        props: dict[str, Predicate | None] = {}
        for name, sub in props_schema.items():
            if not isinstance(name, str):
                raise _Unsupported
            check = self.schema(sub)
            props[name] = None if check is _always else check
        extra: Predicate | None = None
        if "additionalProperties" in node:
            extra = self.schema(node["additionalProperties"])
            if extra is _always:
                extra = None
        low = _limit(node["minProperties"]) if "minProperties" in node else None
        high = _limit(node["maxProperties"]) if "maxProperties" in node else None
        if not required and extra is None and low is None and high is None and \
                all(p is None for p in props.values()):
            return None
        return _object(tuple(dict.fromkeys(required)), props, extra, low, high)

    def array(self, node: Mapping[str, Any]) -> Predicate | None:
        item: Predicate | None = None
        if "items" in node:
            # One schema for every item: 2020-12 "items" without "prefixItems" (never
            # compiled) and the schema form of the earlier drafts; their tuple form is not.
            if isinstance(node["items"], list):
                raise _Unsupported
            item = self.schema(node["items"])
            if item is _always:
                item = None
        low = _limit(node["minItems"]) if "minItems" in node else None
        high = _limit(node["maxItems"]) if "maxItems" in node else None
        unique = node.get("uniqueItems", False)
        if type(unique) is not bool:
            raise _Unsupported
        if item is None and low is None and high is None and not unique:
            return None
        return _array(item, low, high, unique)


def _string(node: Mapping[str, Any]) -> Predicate | None:
    low = _limit(node["minLength"]) if "minLength" in node else None
    high = _limit(node["maxLength"]) if "maxLength" in node else None
    search: Callable[[str], Any] | None = None
    if "pattern" in node:
        if not isinstance(node["pattern"], str):
            raise _Unsupported
        # jsonschema calls re.search(pattern, instance); a compiled pattern is the same.
        search = re.compile(node["pattern"]).search
    if low is None and high is None and search is None:
        return None

    def string(v: str) -> bool:
        if low is not None and len(v) < low:
            return False
        if high is not None and len(v) > high:
            return False
        return search is None or search(v) is not None
    return string


def _number(node: Mapping[str, Any]) -> Predicate | None:
    low = _limit(node["minimum"]) if "minimum" in node else None
    high = _limit(node["maximum"]) if "maximum" in node else None
    xlow = _limit(node["exclusiveMinimum"]) if "exclusiveMinimum" in node else None
    xhigh = _limit(node["exclusiveMaximum"]) if "exclusiveMaximum" in node else None
    if low is None and high is None and xlow is None and xhigh is None:
        return None

    # The very comparisons jsonschema makes (instance < minimum etc.), not their negations.
    def number(v: int | float) -> bool:
        if low is not None and v < low:
            return False
        if high is not None and v > high:
            return False
        if xlow is not None and v <= xlow:
            return False
        return xhigh is None or not v >= xhigh
    return number


def _object(required: tuple[str, ...], props: dict[str, Predicate | None],
            extra: Predicate | None, low: int | float | None,
            high: int | float | None) -> Predicate:
    get = props.get
    if extra is None:
        checked = {k: p for k, p in props.items() if p is not None}
        cget = checked.get
        if low is None and high is None:
            # The common tool schema: required names and typed properties only.
            def simple(v: dict[str, Any]) -> bool:
                for name in required:
                    if name not in v:
                        return False
                if checked:
                    for key, item in v.items():
                        check = cget(key)
                        if check is not None and not check(item):
                            return False
                return True
            return simple

    def full(v: dict[str, Any]) -> bool:
        if low is not None and len(v) < low:
            return False
        if high is not None and len(v) > high:
            return False
        for name in required:
            if name not in v:
                return False
        for key, item in v.items():
            # A key named in "properties" uses its schema (None: anything); any other key
            # is an additional property.
            check = get(key, _MISSING)
            if check is _MISSING:
                check = extra
            if check is not None and not check(item):
                return False
        return True
    return full


def _array(item: Predicate | None, low: int | float | None, high: int | float | None,
           unique: bool) -> Predicate:
    def array(v: list[Any]) -> bool:
        if low is not None and len(v) < low:
            return False
        if high is not None and len(v) > high:
            return False
        if item is not None:
            for x in v:
                if not item(x):
                    return False
        return not unique or _unique(v)
    return array


def _unique(items: list[Any]) -> bool:
    """True only if jsonschema's ``uniq`` would agree: scalar items (no floats, which
    jsonschema equates with ints) that are pairwise distinct within their exact type."""
    seen: set[tuple[type, Any]] = set()
    for x in items:
        kind = type(x)
        if kind is not str and kind is not int and kind is not bool and kind is not _NONE:
            return False
        key = (kind, x)
        if key in seen:
            return False
        seen.add(key)
    return True


def _finite(v: float) -> bool:
    return math.isfinite(v)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and type(a) in _SCALARS and a == b and a == a


def _member(values: frozenset[Any]) -> Predicate:
    def member(v: Any) -> bool:
        return v in values
    return member


def _both(first: Predicate, second: Predicate) -> Predicate:
    if first is _always:
        return second
    if second is _always:
        return first

    def both(v: Any) -> bool:
        return first(v) and second(v)
    return both


def _dispatch(table: dict[type, Predicate]) -> Predicate:
    """Route on the exact type; anything absent from ``table`` falls back (False)."""
    if not table:
        return _never
    if len(table) == 1:
        ((kind, check),) = table.items()
        if check is _always:
            def only_type(v: Any) -> bool:
                return type(v) is kind
            return only_type

        def one_type(v: Any) -> bool:
            return type(v) is kind and check(v)
        return one_type
    get = table.get

    def by_type(v: Any) -> bool:
        check = get(type(v))
        return check is not None and check(v)
    return by_type


_KIND_KEYWORDS: dict[type, tuple[str, ...]] = {
    dict: ("required", "properties", "additionalProperties", "minProperties",
           "maxProperties"),
    list: ("items", "minItems", "maxItems", "uniqueItems"),
    str: ("minLength", "maxLength", "pattern"),
    int: ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
    float: ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"),
}
_HANDLED = frozenset({"type", "enum", "const"}).union(*_KIND_KEYWORDS.values())
