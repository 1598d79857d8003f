"""The compiled schema fast path is sound: it never accepts what jsonschema rejects.

The differential test runs every compilable schema of a corpus (hand-written schemas for
each supported keyword and their combinations, plus every schema literal found in the
bench, the examples and the tests) against many generated instances under every
supported draft, and checks ``fast(x) -> jsonschema valid`` for each one; it also checks
that the fast path agrees with jsonschema often enough to be worth having.
"""

from __future__ import annotations

import ast
import collections
import copy
import decimal
import enum
import fractions
import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import (
    Draft3Validator,
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
    FormatChecker,
)
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend, validator_for

from agentium_graph import ToolBinding
from agentium_graph._fastschema import compile_fast

ROOT = Path(__file__).resolve().parent.parent
DRAFTS: tuple[type, ...] = (Draft202012Validator, Draft201909Validator, Draft7Validator,
                            Draft6Validator)
NUM = {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"]}

ORDER = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                           "price": {"type": "number", "exclusiveMinimum": 0}},
            "required": ["sku", "qty"], "additionalProperties": False}},
        "note": {"type": ["string", "null"], "maxLength": 20},
        "rush": {"type": "boolean", "default": False},
    },
    "required": ["items"],
}

HAND: list[dict[str, Any]] = [
    {},
    {"type": "object"},
    NUM,
    ORDER,
    {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"},
    {"type": "null"}, {"type": "array"},
    {"type": ["integer", "null"]}, {"type": ["number", "string"]},
    {"type": ["boolean", "integer"]}, {"type": ["object", "array"]},
    {"type": "integer", "minimum": 0, "maximum": 10},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5},
    {"minimum": -0.0}, {"maximum": 1e308}, {"minimum": 2**63}, {"exclusiveMaximum": 0.1},
    {"type": "integer", "minimum": 1.5}, {"type": "number", "maximum": 0},
    {"exclusiveMinimum": -(10**30), "exclusiveMaximum": 10**30},
    {"type": "string", "minLength": 1, "maxLength": 3}, {"maxLength": 0}, {"minLength": 2.0},
    {"type": "string", "pattern": "^[a-z]+$"}, {"pattern": "\\d"}, {"pattern": "^.$"},
    {"pattern": "😀"}, {"type": "string", "pattern": "^[A-Z]{3}-\\d+$", "maxLength": 8},
    {"enum": ["a", "b", 1, None, True]}, {"enum": [1, 2.5, 0]},
    {"enum": [[1], {"a": 1}, "x"]}, {"enum": []}, {"enum": [False, 0, "", None]},
    {"type": "integer", "enum": [1, 2, "3", True]}, {"enum": [1, 2, "a"], "const": 2},
    {"const": 0}, {"const": False}, {"const": {"a": 1}}, {"const": 1.0}, {"const": None},
    {"const": "é😀"}, {"type": "string", "const": 1},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "minItems": 1, "maxItems": 3},
    {"items": False}, {"items": True}, {"items": {}},
    {"type": "array", "uniqueItems": True},
    {"uniqueItems": True, "items": {"type": ["integer", "boolean", "string", "null"]}},
    {"uniqueItems": False, "maxItems": 2},
    {"type": "array", "items": {"type": "array", "items": {"type": "number", "minimum": 0}}},
    {"type": "object", "properties": {"a": {"type": "string"},
                                      "b": {"type": "integer", "minimum": 0}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "number"}},
    {"properties": {"a": True, "b": False}},
    {"properties": {"a": {}, "b": {"description": "anything"}}},
    {"additionalProperties": True}, {"additionalProperties": False},
    {"additionalProperties": {"type": "string", "minLength": 1},
     "properties": {"n": {"type": "integer"}}},
    {"minProperties": 1, "maxProperties": 2},
    {"type": "object", "required": ["a", "b", "a"]},
    {"properties": {"type": {"type": "string"}, "properties": {"const": "x"},
                    "required": {"type": "boolean"}}, "required": ["type"]},
    {"title": "t", "description": "d", "default": 1, "examples": [1], "$comment": "c",
     "deprecated": True, "readOnly": True, "writeOnly": False, "type": "integer"},
    {"type": "string", "format": "date-time"}, {"format": "email"},
    {"minLength": 2, "minimum": 3, "minItems": 1, "required": ["a"]},
    {"type": ["integer", "string", "array", "object"], "minimum": 0, "maxLength": 2,
     "maxItems": 1, "maxProperties": 1},
    {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True,
                                               "items": {"enum": ["x", "y", "z"]}}},
     "additionalProperties": {"type": "array", "items": {"type": "null"}}},
]

# Extra strings for pattern-heavy schemas, so generated strings sometimes match them.
STRINGS = ["", "a", "abc", "ABC", "ABC-1", "ABC-12345", "AB-1", "abc-1", "x", "y", "z",
           "3", "12", "a1", "é", "😀", "a😀", "𝄞", "\u0000", "ÅÄÖ", "\u212b", "\ud800",
           "2024-01-01T00:00:00Z", "not an email", "a@b.example", "é😀", "value", "type"]


# --- the schema corpus ------------------------------------------------------------------

_SCHEMA_WORDS = frozenset(
    set(Draft202012Validator.VALIDATORS) | set(Draft7Validator.VALIDATORS)
    | {"$schema", "$id", "$defs", "definitions", "title", "description", "default",
       "examples", "$comment", "deprecated", "readOnly", "writeOnly"})


def _harvested() -> list[dict[str, Any]]:
    """Every literal dict in bench/, examples/ and tests/ that looks like a JSON Schema."""
    found: dict[str, dict[str, Any]] = {}
    files = [*sorted((ROOT / "bench").glob("*.py")), *sorted((ROOT / "examples").glob("*.py")),
             *sorted((ROOT / "tests").glob("*.py"))]
    for path in files:
        if path.name in (Path(__file__).name, "test_literal_and_schema_refs.py"):
            continue  # this file, and a corpus of deliberately odd schemas
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Dict):
                continue
            try:
                value = ast.literal_eval(node)
            except (ValueError, SyntaxError, TypeError):
                continue
            if not value or not all(isinstance(k, str) and k in _SCHEMA_WORDS for k in value):
                continue
            try:
                validator_for(value, default=Draft202012Validator).check_schema(value)
            except Exception:
                continue
            found.setdefault(json.dumps(value, sort_keys=True), value)
    return list(found.values())


HARVESTED = _harvested()


def _corpus() -> list[tuple[str, dict[str, Any], type]]:
    cases: list[tuple[str, dict[str, Any], type]] = []
    for i, schema in enumerate(HAND):
        for cls in DRAFTS:
            try:
                cls.check_schema(schema)
            except Exception:
                continue
            cases.append((f"hand{i}-{cls.__name__}", schema, cls))
    for i, schema in enumerate(HARVESTED):
        cases.append((f"harvested{i}", schema,
                      validator_for(schema, default=Draft202012Validator)))
    cases.append(("dollar-schema-2020", {"$schema": "https://json-schema.org/draft/2020-12/schema",
                                         **NUM}, Draft202012Validator))
    cases.append(("dollar-schema-7", {"$schema": "http://json-schema.org/draft-07/schema#",
                                      **ORDER}, Draft7Validator))
    return cases


CORPUS = _corpus()


# --- instances --------------------------------------------------------------------------

class _Str(str):
    pass


class _Int(int):
    pass


class _Color(enum.IntEnum):
    RED = 1


INTS = [0, 1, -1, 2, 3, 7, 10, 11, 99, 100, 2**31, 2**63, -(2**63), 10**30, -(10**30),
        10**400]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, 0.1, 1e-300, 1e308, -1e308, 3.0, 1e16,
          float("nan"), float("inf"), float("-inf")]
ODD: list[Callable[[], Any]] = [
    lambda: (1, 2), lambda: collections.OrderedDict(value=1),
    lambda: collections.defaultdict(int, value=1), lambda: _Str("abc"), lambda: _Int(3),
    lambda: _Color.RED, lambda: decimal.Decimal("1"), lambda: fractions.Fraction(1, 2),
    lambda: b"abc", lambda: {1, 2}, lambda: frozenset(), lambda: {1: "a"},
    lambda: {"value": (1,)}, lambda: [(1,)], lambda: 1j,
]


def _scalar(rng: random.Random) -> Any:
    pick = rng.randrange(6)
    if pick == 0:
        return rng.choice([None, True, False])
    if pick == 1:
        return rng.choice(INTS)
    if pick == 2:
        return rng.choice(FLOATS)
    if pick == 3:
        return rng.randint(-20, 120)
    if pick == 4:
        return rng.choice(STRINGS)
    return "".join(rng.choice("ab1-Z é😀𝄞") for _ in range(rng.randrange(6)))


def _anything(rng: random.Random, depth: int = 0, keys: list[str] | None = None) -> Any:
    roll = rng.random()
    if depth >= 3 or roll < 0.6:
        return _scalar(rng)
    if roll < 0.65:
        return rng.choice(ODD)()
    if roll < 0.8:
        return [_anything(rng, depth + 1, keys) for _ in range(rng.randrange(4))]
    pool = (keys or []) + ["a", "b", "x", "value", "extra"]
    return {rng.choice(pool): _anything(rng, depth + 1, keys) for _ in range(rng.randrange(4))}


def _near(rng: random.Random, value: Any) -> Any:
    """A value jsonschema may or may not equate with ``value`` (1 vs 1.0 vs True...)."""
    if type(value) is bool:
        return rng.choice([value, int(value), float(value)])
    if type(value) is int:
        return rng.choice([value, float(value), value + 1, bool(value % 2)])
    if type(value) is float:
        return rng.choice([value, -value, int(value) if math.isfinite(value) else value])
    return copy.deepcopy(value)


def _number_for(rng: random.Random, schema: dict[str, Any], integer: bool) -> Any:
    bounds = [schema[k] for k in ("minimum", "maximum", "exclusiveMinimum",
                                  "exclusiveMaximum") if k in schema]
    pool: list[Any] = [*INTS[:10], rng.randint(-5, 50)]
    for b in bounds:
        pool += [b, b + 1, b - 1] if math.isfinite(b) else [b]
        if not integer:
            pool += [b + 0.25, b - 0.25]
    value = rng.choice(pool)
    if integer:
        if type(value) is float and math.isfinite(value):
            value = math.ceil(value) if rng.random() < 0.9 else value
        elif rng.random() < 0.05:
            value = float(value) if type(value) is int and abs(value) < 2**53 else value
    elif rng.random() < 0.4 and type(value) is int:
        value = float(value)
    return value


def _instance(rng: random.Random, schema: Any, depth: int = 0) -> Any:
    """Mostly schema-shaped values (so many are valid), with random corruptions."""
    if isinstance(schema, list):  # draft 7 tuple-form items
        schema = rng.choice(schema) if schema else True
    if schema is True or schema is False or rng.random() < 0.1 or depth > 4:
        return _anything(rng, depth)
    if "const" in schema:
        return _near(rng, schema["const"])
    if schema.get("enum"):
        return _near(rng, rng.choice(schema["enum"]))
    names = schema.get("type", ["object", "array", "string", "integer", "number",
                                "boolean", "null"])
    kind = rng.choice([names] if isinstance(names, str) else names)
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("integer", "number"):
        return _number_for(rng, schema, kind == "integer")
    if kind == "string":
        low = int(schema.get("minLength", 0))
        high = int(schema.get("maxLength", low + 6))
        if "pattern" in schema or rng.random() < 0.5:
            return rng.choice(STRINGS + [s * 2 for s in STRINGS[:8]])
        return "".join(rng.choice("abZ9 é😀𝄞") for _ in range(rng.randint(low, high)))
    if kind == "array":
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", low + 4))
        items = schema.get("items", True)
        out = [_instance(rng, items, depth + 1) for _ in range(rng.randint(low, high))]
        if schema.get("uniqueItems") and rng.random() < 0.7:
            unique: list[Any] = []
            for x in out:
                if not any(type(x) is type(y) and x == y for y in unique):
                    unique.append(x)
            out = unique
        return out
    props: dict[str, Any] = schema.get("properties", {})
    result: dict[str, Any] = {}
    for name in schema.get("required", []):
        if rng.random() < 0.95:
            result[name] = _instance(rng, props.get(name, True), depth + 1)
    for name, sub in props.items():
        if name not in result and rng.random() < 0.5:
            result[name] = _instance(rng, sub, depth + 1)
    if rng.random() < 0.3:
        extra = schema.get("additionalProperties", True)
        result[rng.choice(["extra", "zz", "a"])] = _instance(rng, extra, depth + 1)
    if "maxProperties" in schema and rng.random() < 0.8:
        while len(result) > schema["maxProperties"]:
            result.pop(next(iter(result)))
    return result


def _instances(schema: dict[str, Any], seed: str, count: int) -> Iterator[Any]:
    rng = random.Random(seed)
    for _ in range(count):
        yield _instance(rng, schema) if rng.random() < 0.85 else _anything(rng)


def _valid(validator: Any, value: Any) -> bool | None:
    """jsonschema's verdict; None when it raises (complex numbers under "minimum"...)."""
    try:
        return bool(validator.is_valid(value))
    except Exception:
        return None


# --- the differential test --------------------------------------------------------------

def test_fast_path_is_sound_and_mostly_agrees() -> None:
    pairs = agree = valid = fast_valid = compiled = 0
    unsound: list[str] = []
    for name, schema, cls in CORPUS:
        fast = compile_fast(schema, cls)
        if fast is None:
            continue
        compiled += 1
        validator = cls(schema)
        for value in _instances(schema, name, 400):
            verdict = _valid(validator, value)
            mine = fast(value)
            pairs += 1
            if mine and verdict is not True:
                unsound.append(f"{name}: {schema!r} accepted {value!r}")
            agree += mine == bool(verdict)
            valid += verdict is True
            fast_valid += mine
    assert not unsound, unsound[:20]
    assert compiled >= 200 and pairs >= 80_000
    # Worth having: it decides the large majority, and most valid values on its own.
    assert agree / pairs >= 0.95, (agree, pairs)
    assert valid >= pairs // 4
    assert fast_valid / valid >= 0.9, (fast_valid, valid)


UNCOMPILED = {"oneOf", "anyOf", "allOf", "$ref", "prefixItems", "patternProperties",
              "additionalItems"}


def _keys(schema: Any) -> set[str]:
    if isinstance(schema, dict):
        return set(schema).union(*(_keys(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_keys(v) for v in schema))
    return set()


def test_every_hand_written_and_harvested_schema_compiles() -> None:
    not_compiled = [(name, schema) for name, schema, cls in CORPUS
                    if compile_fast(schema, cls) is None]
    # The harvested schemas that use keywords outside the subset (oneOf...) fall back.
    assert all(name.startswith("harvested") and UNCOMPILED & _keys(schema)
               for name, schema in not_compiled), not_compiled
    assert NUM in HARVESTED and len(HARVESTED) >= 10


def test_non_json_values_fall_back() -> None:
    fast = compile_fast(NUM, Draft202012Validator)
    assert fast is not None
    for make in ODD:
        assert not fast(make())
    assert not fast({"value": True}) and not fast({"value": 1.0}) and not fast({"value": "1"})
    assert fast({"value": 10**400, "other": object()})
    anything = compile_fast({}, Draft202012Validator)
    assert anything is not None and anything(object()) and anything(1j)


# --- what is not compiled ---------------------------------------------------------------

UNSUPPORTED: list[dict[str, Any]] = [
    {"$ref": "#/$defs/a", "$defs": {"a": {}}}, {"$defs": {"a": {}}}, {"definitions": {}},
    {"allOf": [{}]}, {"anyOf": [{}]}, {"oneOf": [{}]}, {"not": {}},
    {"if": {}, "then": {}, "else": {}}, {"if": {}}, {"then": {}},
    {"dependentRequired": {"a": ["b"]}}, {"dependentSchemas": {"a": {}}},
    {"dependencies": {"a": ["b"]}}, {"patternProperties": {"^a": {}}},
    {"propertyNames": {"maxLength": 3}}, {"contains": {}}, {"minContains": 1},
    {"maxContains": 1}, {"unevaluatedProperties": False}, {"unevaluatedItems": False},
    {"prefixItems": [{}]}, {"additionalItems": False}, {"multipleOf": 2},
    {"$id": "https://example.com/s"}, {"$anchor": "a"}, {"$dynamicRef": "#a"},
    {"$dynamicAnchor": "a"}, {"$recursiveRef": "#"}, {"$recursiveAnchor": True},
    {"$vocabulary": {}}, {"contentMediaType": "application/json"},
    {"contentEncoding": "base64"}, {"contentSchema": {}}, {"x-custom": 1},
    {"items": [{"type": "integer"}]},
]


@pytest.mark.parametrize("schema", UNSUPPORTED, ids=lambda s: next(iter(s)))
@pytest.mark.parametrize("cls", DRAFTS, ids=lambda c: c.__name__)
def test_unsupported_keywords_are_not_compiled(schema: dict[str, Any], cls: type) -> None:
    assert compile_fast(schema, cls) is None
    nested = [
        {"type": "object", "properties": {"a": schema}},
        {"additionalProperties": schema},
        {"items": schema},
        {"type": "array", "items": {"properties": {"b": {"items": schema}}}},
        {"type": "string", "properties": {"a": schema}},  # even where "type" excludes it
    ]
    for outer in nested:
        assert compile_fast(outer, cls) is None, outer


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$schema": "https://json-schema.org/draft/2020-12/schema"}}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},  # not 2020-12
    {"$schema": "https://example.com/my-meta", "type": "object"},
    {"type": "integr"}, {"type": 5}, {"required": "a"}, {"minimum": True},
    {"minLength": "3"}, {"pattern": "("}, {"pattern": 5}, {"enum": "abc"},
    {"properties": []}, {"uniqueItems": 1}, {"items": 3},
], ids=repr)
def test_malformed_or_foreign_schemas_are_not_compiled(schema: dict[str, Any]) -> None:
    assert compile_fast(schema, Draft202012Validator) is None


@pytest.mark.parametrize("cls", [Draft4Validator, Draft3Validator,
                                 extend(Draft202012Validator, {}), object])
def test_unsupported_drafts_are_not_compiled(cls: type) -> None:
    assert compile_fast({"type": "object"}, cls) is None
    assert compile_fast({}, cls) is None


def test_format_is_only_an_annotation_without_a_format_checker() -> None:
    schema = {"type": "string", "format": "email"}
    fast = compile_fast(schema, Draft202012Validator)
    assert fast is not None and fast("not an email")
    assert Draft202012Validator(schema).is_valid("not an email")
    assert compile_fast(schema, Draft202012Validator, format_checker=FormatChecker()) is None
    b = pure(input_schema=schema)
    assert b.input_validator.format_checker is None  # type: ignore[attr-defined]
    assert b.input_errors("not an email") == []


def test_the_drafts_still_check_keywords_as_reviewed() -> None:
    """The fast path mirrors these jsonschema functions; an upgrade that changes which
    function checks a compiled keyword must be reviewed before this test is updated."""
    words = ["type", "enum", "const", "required", "properties", "additionalProperties",
             "minProperties", "maxProperties", "items", "minItems", "maxItems",
             "uniqueItems", "minLength", "maxLength", "pattern", "minimum", "maximum",
             "exclusiveMinimum", "exclusiveMaximum", "format"]
    for cls in DRAFTS:
        for word in words:
            fn = cls.VALIDATORS[word]
            expected = ("jsonschema._legacy_keywords.items_draft6_draft7_draft201909"
                        if word == "items" and cls is not Draft202012Validator
                        else f"jsonschema._keywords.{word}")
            assert f"{fn.__module__}.{fn.__name__}" == expected, (cls, word)
        checker = cls.TYPE_CHECKER
        assert checker.is_type(1, "integer") and not checker.is_type(True, "integer")
        assert checker.is_type(1.5, "number") and not checker.is_type(True, "number")
        assert not checker.is_type((), "array") and not checker.is_type(None, "object")


# --- the bindings -----------------------------------------------------------------------

def _echo(args: dict[str, Any]) -> dict[str, Any]:
    return args


def pure(**kw: Any) -> ToolBinding:
    return ToolBinding(id="t", version="1", recovery="pure", execute=_echo, **kw)


def _old_way(validator: Any, value: Any) -> list[ValidationError]:
    return sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))


def _shape(errors: list[ValidationError]) -> list[tuple[str, list[Any], list[Any], str | None]]:
    return [(e.message, list(e.absolute_path), list(e.absolute_schema_path),
             str(e.validator)) for e in errors]


@pytest.mark.parametrize("schema", [
    NUM, ORDER,
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
     "required": ["a", "b", "c"], "additionalProperties": False},
    {"oneOf": [{"type": "string"}, {"type": "integer"}]},  # not compiled: always jsonschema
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
     "items": [{"type": "integer"}], "additionalItems": False},
], ids=["num", "order", "multi", "oneOf", "draft7-tuple"])
def test_binding_errors_match_the_old_sorted_iter_errors(schema: dict[str, Any]) -> None:
    b = pure(input_schema=schema, output_schema=schema)
    seen_invalid = 0
    for value in _instances(schema, "binding" + json.dumps(schema), 300):
        if _valid(b.input_validator, value) is None:
            continue
        old = _old_way(b.input_validator, value)
        assert _shape(b.input_errors(value)) == _shape(old)
        assert _shape(b.output_errors(value)) == _shape(_old_way(b.output_validator, value))
        seen_invalid += bool(old)
    assert seen_invalid >= 30


def test_bench_schema_takes_the_fast_path() -> None:
    b = pure(input_schema=NUM, output_schema={"type": "object", "required": ["x"]})
    assert b._input_fast is not None and b._output_fast is not None
    assert b.input_errors({"value": 1}) == [] and b.output_errors({"x": None}) == []
    errors = b.input_errors({"value": "1", "x": 1})
    assert [e.message for e in errors] == ["'1' is not of type 'integer'"]
    assert list(errors[0].absolute_path) == ["value"]


def test_fast_path_ignores_later_schema_mutation() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    b = pure(input_schema=schema)
    b.input_schema["properties"]["n"]["type"] = "string"
    assert b.input_errors({"n": 1}) == []
    assert b.input_errors({"n": "x"}) != []
