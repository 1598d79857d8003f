"""``checked_json``: the C fast path must accept, refuse and encode exactly what the walk does.

The reference is the definition: :func:`check_json` (which decides and names the path)
followed by the canonical encoder. Every value below, hand-picked edge cases and a seeded
random mix of JSON and non-JSON parts, must give the same text or the same error.
"""

from __future__ import annotations

import enum
import json
import math
import random
from collections import OrderedDict
from decimal import Decimal
from typing import Any

import pytest

from agentium_graph import _canonical
from agentium_graph._canonical import (
    MAX_INT_DIGITS,
    MAX_NESTING,
    NotJSONError,
    canonical_json,
    check_json,
    checked_json,
    json_copy,
)


def reference(value: Any) -> tuple[str, ...]:
    try:
        check_json(value)
    except NotJSONError as exc:
        return ("refused", exc.path, exc.reason)
    return ("ok", _canonical._encoder.encode(value))


def fast(value: Any) -> tuple[str, ...]:
    try:
        text, parsed = checked_json(value)
    except NotJSONError as exc:
        return ("refused", exc.path, exc.reason)
    assert parsed == json.loads(text)
    return ("ok", text)


def nested(depth: int, leaf: Any = 1, *, kind: str = "list") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def cyclic_list() -> list[Any]:
    items: list[Any] = [1]
    items.append({"back": items})
    return items


def cyclic_dict() -> dict[str, Any]:
    d: dict[str, Any] = {"a": 1}
    d["self"] = [d]
    return d


EDGE_CASES: list[Any] = [
    None, True, False, 0, -1, 1.5, -0.0, 1e300, "", "é", "日本", "\x00\x1f\"\\",
    [], {}, [[]], {"": {}}, (1, 2), {"t": (1, [2, (3,)])}, [(), ()],
    {1: "a"}, {"1": "a", 1: "b"}, {True: 1}, {None: 1}, {1.5: 1}, {"a": {2: 3}},
    [float("nan")], {"x": float("inf")}, -math.inf,
    10 ** (MAX_INT_DIGITS - 1), -(10 ** (MAX_INT_DIGITS - 1)), [10 ** 40],
    "\ud800", {"k": "a\udfffb"}, {"\ud800": 1}, ["x", {"\udc00key": "v"}],
    nested(MAX_NESTING - 1), nested(MAX_NESTING), nested(MAX_NESTING + 1),
    nested(MAX_NESTING - 1, kind="dict"), nested(MAX_NESTING, kind="dict"),
    nested(MAX_NESTING + 1, kind="dict"), nested(MAX_NESTING + 5, [1, {"a": []}]),
    {"brackets": "[" * 500 + "{" * 500, "deep": nested(10)},
    ["]" * 300, nested(MAX_NESTING - 2, "[{\"]")],
    [nested(3)] * (MAX_NESTING + 10),
    *({"wide": [[] for _ in range(MAX_NESTING)], "deep": nested(depth)}
      for depth in (MAX_NESTING - 2, MAX_NESTING - 1, MAX_NESTING)),
    *([{"s": "]]}}"}, nested(depth, kind="dict"), [[[]]] * MAX_NESTING]
      for depth in (MAX_NESTING - 2, MAX_NESTING - 1, MAX_NESTING)),
    cyclic_list(), cyclic_dict(),
    {1, 2}, b"bytes", Decimal("1.5"), object(), [1, 2, {"a": Decimal(1)}],
    OrderedDict([("b", 1), ("a", 2)]), Color.RED, {"c": Color.RED}, Name("n"), {Name("k"): 1},
    {"s": "x" * 10_000, "n": 7},
]


@pytest.mark.parametrize("value", EDGE_CASES, ids=lambda v: type(v).__name__)
def test_edge_cases_match_the_walk(value: Any) -> None:
    assert fast(value) == reference(value)


def test_integers_at_the_digit_bound_match_the_walk() -> None:
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # so the encoder itself could write any integer
    try:
        for value in (10 ** MAX_INT_DIGITS - 1, 10 ** MAX_INT_DIGITS,
                      {"big": -(10 ** MAX_INT_DIGITS)}, ["1" * (MAX_INT_DIGITS + 5)]):
            assert fast(value) == reference(value)
        assert fast(10 ** MAX_INT_DIGITS)[0] == "refused"
        assert fast(["1" * (MAX_INT_DIGITS + 5)])[0] == "ok"
    finally:
        sys.set_int_max_str_digits(old)


LEAVES: list[Any] = [
    0, 7, -3, 2.5, True, None, "s", "é", "a\"b", 10 ** 30, (), (1,),
    float("nan"), "\ud801", Decimal(2), {3}, b"x",
]


def random_value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        return rng.choice(LEAVES)
    width = rng.randrange(0, 4)
    if roll < 0.65:
        return [random_value(rng, depth - 1) for _ in range(width)]
    if roll < 0.7:
        return tuple(random_value(rng, depth - 1) for _ in range(width))
    keys: list[Any] = ["a", "b", "é", "", "k1", 1, True, "\udc80"]
    out: dict[Any, Any] = {}
    for _ in range(width):
        key = rng.choice(keys) if rng.random() < 0.15 else rng.choice(keys[:5])
        out[key] = random_value(rng, depth - 1)
    return out


def test_a_random_mix_matches_the_walk() -> None:
    rng = random.Random(20261201)
    refused = 0
    for _ in range(3000):
        value = random_value(rng, 5)
        expected = reference(value)
        assert fast(value) == expected, value
        refused += expected[0] == "refused"
    assert 300 < refused < 2700  # both outcomes are exercised


def test_the_copy_shares_nothing_and_callers_see_the_same_api() -> None:
    value = {"a": [1, {"b": "c"}], "t": (1, 2)}
    text, parsed = checked_json(value)
    assert text == canonical_json(value) == '{"a":[1,{"b":"c"}],"t":[1,2]}'
    assert parsed == json_copy(value) == {"a": [1, {"b": "c"}], "t": [1, 2]}
    parsed["a"][1]["b"] = "changed"
    assert value["a"][1]["b"] == "c"


def test_the_path_of_a_refusal_is_the_callers() -> None:
    with pytest.raises(NotJSONError) as info:
        checked_json({"x": [1, {2: 3}]}, "$input")
    assert info.value.path == "$input.x[1]"


def test_plain_json_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(value: Any, path: str = "$") -> None:
        raise AssertionError("the walk ran for plain JSON")

    monkeypatch.setattr(_canonical, "check_json", walked)
    plan = {"nodes": [{"id": f"n{i}", "args": {"x": {"$ref": {"node": "a", "path": ["v"]}}}}
                      for i in range(300)], "deep": nested(MAX_NESTING - 1)}
    text, parsed = checked_json(plan)
    assert parsed == plan and text.startswith('{"deep":')
