"""The shortcuts on the pure-node path make what the code they replace made.

``new_context`` builds a :class:`ToolContext` as its dataclass ``__init__`` does, and
``_parse_encoded`` parses an encoder's text exactly as ``json.loads`` does.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest

from agentium_graph import _canonical
from agentium_graph.plan._validate import resolve_args
from agentium_graph.runtime._context import CancelFlag, ToolContext, new_context


def _fields() -> dict[str, Any]:
    return {"key": "k", "node_id": "n1", "attempt": 2, "attempt_id": "att_1", "fence": 3,
            "worker_id": "w", "binding": "step", "version": "1"}


def test_new_context_is_the_dataclass_constructor() -> None:
    made = new_context(**_fields())
    built = ToolContext(**_fields())
    assert type(made) is ToolContext
    assert list(made.__dict__) == list(built.__dict__)  # same keys, same order
    assert {k: v for k, v in made.__dict__.items() if k != "_cancel"} == \
        {k: v for k, v in built.__dict__.items() if k != "_cancel"}
    assert isinstance(made._cancel, CancelFlag) and not made.cancelled
    assert made._cancel is not new_context(**_fields())._cancel  # a flag of its own
    assert repr(made) == repr(built)
    assert made == dataclasses.replace(built, _cancel=made._cancel)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.fence = 4  # type: ignore[misc]
    # Every field the dataclass has is set (a new field must be added to new_context too).
    assert [f.name for f in dataclasses.fields(ToolContext)] == list(made.__dict__)


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.randrange(-10**20, 10**20)
    if kind == 1:
        return rng.random() * 10 ** rng.randrange(-5, 30)
    if kind == 2:
        chars = 'ab"\\\n\u00e9\u4e2d\U0001f600 '
        return "".join(rng.choice(chars) for _ in range(rng.randrange(6)))
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return rng.choice([0, -0.0, 1e308, "", "\ufeffx"])
    if kind in (5, 6):
        return {str(_value(rng, depth + 1)): _value(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_parse_encoded_is_json_loads() -> None:
    rng = random.Random(24)
    for _ in range(2000):
        value = _value(rng)
        for text in (_canonical.canonical_json(value), _canonical._encode_checked(value)):
            parsed = _canonical._parse_encoded(text)
            expected = json.loads(text)
            assert json.dumps(parsed) == json.dumps(expected)
            assert type(parsed) is type(expected)


@pytest.mark.parametrize("text", ["", " 1", "1 ", "[1] [2]", "{", "nul", "\ufeff1"])
def test_parse_encoded_fails_as_json_loads(text: str) -> None:
    try:
        expected: Any = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as caught:
            _canonical._parse_encoded(text)
        assert str(caught.value) == str(exc)
    else:
        assert _canonical._parse_encoded(text) == expected


def test_resolve_args_literals_refs_and_lists() -> None:
    outputs = {"a": {"value": [1, {"x": 2}]}}
    args = {"p": {"$ref": {"node": "a", "path": ["value", 1]}},
            "q": [{"$ref": {"node": "a"}}, 3, "s"],
            "r": {"$literal": {"$ref": {"node": "nope"}}},
            "s": {"$ref": {"node": "a"}, "$literal": 5}}
    resolved = resolve_args(args, outputs)
    assert resolved == {"p": {"x": 2}, "q": [{"value": [1, {"x": 2}]}, 3, "s"],
                        "r": {"$ref": {"node": "nope"}}, "s": 5}
    assert resolved["p"] is not outputs["a"]["value"][1]  # a copy
    assert resolve_args([1, {"$ref": {"node": "a", "path": ["value", 0]}}], outputs) == [1, 1]
    assert resolve_args(7, outputs) == 7
    with pytest.raises(LookupError, match=r"\$ref b.*node 'b' has no output"):
        resolve_args({"x": {"$ref": {"node": "b"}}}, outputs)
    with pytest.raises(LookupError, match="the output has no"):
        resolve_args({"x": {"$ref": {"node": "a", "path": ["nope"]}}}, outputs)
