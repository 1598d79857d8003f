"""resolve_args: a node's args with every $ref replaced by the producer's value (copied)
and every $literal unwrapped, at the moment the node is started."""

from __future__ import annotations

from typing import Any

import pytest

from agentium_graph.plan import resolve_args
from tests.test_plan_validation import SCHEMA_WITH_REF, ref


def test_resolve_args_everywhere() -> None:
    args = {"a": ref("p", "x", 1), "list": [ref("q"), {"k": ref("p", "x")}], "plain": [1, "s"]}
    outputs = {"p": {"x": [10, {"deep": True}]}, "q": "whole"}
    assert resolve_args(args, outputs) == {
        "a": {"deep": True}, "list": ["whole", {"k": [10, {"deep": True}]}], "plain": [1, "s"]}


def test_resolve_args_copies_values() -> None:
    outputs = {"p": {"x": [1, 2]}}
    resolved = resolve_args({"v": ref("p", "x")}, outputs)
    resolved["v"].append(3)
    assert outputs == {"p": {"x": [1, 2]}}


@pytest.mark.parametrize(("path", "output"), [
    (("missing",), {"x": 1}),
    (("x", 5), {"x": [1]}),
    (("x", 0), {"x": "string"}),      # no indexing into strings
    (("x", "0"), {"x": [1]}),         # field names do not index arrays
    ((0,), {"0": "v"}),               # indexes do not select object fields
    (("x", "y"), {"x": None}),
])
def test_resolve_args_missing_path_names_the_ref(path: tuple[str | int, ...],
                                                 output: Any) -> None:
    with pytest.raises(LookupError) as info:
        resolve_args({"v": ref("p", *path)}, {"p": output})
    assert "$ref p" in str(info.value)


def test_resolve_args_missing_producer_output() -> None:
    with pytest.raises(LookupError, match="node 'p' has no output"):
        resolve_args({"v": ref("p")}, {})


def test_resolved_args_unwrap_literals_and_resolve_only_real_references() -> None:
    args = {"schema": {"$literal": SCHEMA_WITH_REF},
            "nested": {"$literal": {"$literal": "kept as written"}},
            "v": ref("a", "x")}
    resolved = resolve_args(args, {"a": {"x": 5}})
    assert resolved == {"schema": SCHEMA_WITH_REF,
                        "nested": {"$literal": "kept as written"}, "v": 5}
    resolved["schema"]["$defs"]["n"]["type"] = "string"  # a copy: the plan is untouched
    assert SCHEMA_WITH_REF["$defs"]["n"]["type"] == "integer"
