"""Canonical JSON, digests and deterministic ids: the format every stored task depends on."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest

from agentium_graph import _canonical
from agentium_graph._canonical import (
    MAX_NESTING,
    NotJSONError,
    admission_id,
    attempt_id,
    canonical_bytes,
    canonical_json,
    check_json,
    derive_id,
    digest,
    digest_text,
    incarnation_id,
    json_copy,
    json_path,
    revision_id,
    task_id,
)

GOLDEN_VALUE: dict[str, Any] = {
    "z": [1, 2.5, True, None, "é"],
    "a": {"nested": {"b": 1, "a": -0.5}, "empty": {}, "list": []},
    "unicode": "日本 ✓",
    "int": 12345678901234567890,
}
GOLDEN_TEXT = (
    '{"a":{"empty":{},"list":[],"nested":{"a":-0.5,"b":1}},"int":12345678901234567890,'
    '"unicode":"日本 ✓","z":[1,2.5,true,null,"é"]}'
)
GOLDEN_DIGEST = "sha256:3609333fc982c66f0b3fcaf7fbb5abedd4e3ef920476be10ca7aad23537f85dc"


def test_golden_text_and_digest_are_pinned() -> None:
    assert canonical_json(GOLDEN_VALUE) == GOLDEN_TEXT
    expected = "sha256:" + hashlib.sha256(GOLDEN_TEXT.encode("utf-8")).hexdigest()
    assert digest(GOLDEN_VALUE) == expected
    # A literal: any change to the canonical form breaks every stored task's digests.
    assert digest(GOLDEN_VALUE) == GOLDEN_DIGEST


def test_digest_is_stable_across_processes() -> None:
    # Load the module by path: the check is about hash seeds, not about package imports.
    code = (
        "import importlib.util as u, json, sys;"
        "s=u.spec_from_file_location('c', sys.argv[2]); m=u.module_from_spec(s);"
        "s.loader.exec_module(m); v=json.loads(sys.argv[1]);"
        "print(m.digest(v)); print(m.derive_id('task', v))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(GOLDEN_VALUE),
                               _canonical.__file__], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed})
             for seed in ("1", "2")]
    outs = {p.communicate(timeout=60)[0] for p in procs}
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == {f"{GOLDEN_DIGEST}\n{derive_id('task', GOLDEN_VALUE)}\n"}


def test_key_order_does_not_matter() -> None:
    a = {"b": 1, "a": {"y": [1, {"q": 1, "p": 2}], "x": None}}
    b = {"a": {"x": None, "y": [1, {"p": 2, "q": 1}]}, "b": 1}
    assert list(a) != list(b)
    assert canonical_json(a) == canonical_json(b)
    assert digest(a) == digest(b)


def test_list_order_matters() -> None:
    assert digest([1, 2]) != digest([2, 1])


def test_no_insignificant_whitespace() -> None:
    text = canonical_json({"a": [1, 2], "b": {"c": "d e"}})
    assert text == '{"a":[1,2],"b":{"c":"d e"}}'


def test_unicode_is_utf8_not_escaped() -> None:
    assert canonical_json("ü→😀") == '"ü→😀"'
    assert canonical_bytes("ü→😀") == '"ü→😀"'.encode()
    assert canonical_bytes({"ключ": 1}) == '{"ключ":1}'.encode()


def test_keys_sorted_by_code_point() -> None:
    assert canonical_json({"b": 1, "a": 2, "B": 3, "é": 4}) == '{"B":3,"a":2,"b":1,"é":4}'


def test_tuples_encode_as_arrays() -> None:
    assert canonical_json((1, (2, "x"))) == '[1,[2,"x"]]'
    assert digest({"a": (1, 2)}) == digest({"a": [1, 2]})


def test_int_and_float_differ_and_bool_is_not_int() -> None:
    assert canonical_json([1, 1.0, True, False]) == "[1,1.0,true,false]"
    assert digest(1) != digest(1.0)
    assert digest(1) != digest(True)


def test_integers_of_more_digits_than_python_writes_are_rejected_with_path() -> None:
    limit = _canonical.MAX_INT_DIGITS
    largest = 10 ** limit - 1  # 4300 nines: still written
    assert canonical_json([largest, -largest]) == f"[{largest},{-largest}]"
    for bad in (10 ** limit, -(10 ** limit), 10 ** (limit * 2)):
        with pytest.raises(NotJSONError) as info:
            canonical_json({"a": [0, {"b": bad}]})
        assert info.value.path == "$.a[1].b"
        assert "digits" in info.value.reason
        with pytest.raises(NotJSONError) as info:
            digest(bad)
        assert info.value.path == "$"


class _Count(int):
    pass


def test_an_int_subclass_of_too_many_digits_is_rejected_too() -> None:
    assert canonical_json({"n": _Count(7)}) == '{"n":7}'
    with pytest.raises(NotJSONError, match="digits"):
        canonical_json({"n": _Count(10 ** _canonical.MAX_INT_DIGITS)})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinities_rejected_with_path(bad: float) -> None:
    with pytest.raises(NotJSONError) as info:
        canonical_json({"a": [0, {"b": bad}]})
    assert info.value.path == "$.a[1].b"
    assert "NaN" in info.value.reason
    with pytest.raises(NotJSONError):
        digest(bad)


@pytest.mark.parametrize("key", [1, 1.5, True, None, ("t",)])
def test_non_string_keys_rejected_with_path(key: Any) -> None:
    # json.dumps would silently turn 1 into "1", making {1: x} and {"1": x} collide.
    with pytest.raises(NotJSONError) as info:
        canonical_json({"outer": [{key: "v"}]})
    assert info.value.path == "$.outer[0]"
    assert repr(key) in info.value.reason
    assert "not a string" in info.value.reason


def test_int_key_does_not_collide_with_string_key() -> None:
    with pytest.raises(NotJSONError):
        digest({1: "x"})
    assert digest({"1": "x"}).startswith("sha256:")


@pytest.mark.parametrize("bad", [{1, 2}, b"bytes", Decimal("1.5"), object(), 1j])
def test_non_json_types_rejected(bad: Any) -> None:
    with pytest.raises(NotJSONError) as info:
        canonical_json({"k": [bad]})
    assert info.value.path == "$.k[0]"
    assert type(bad).__name__ in info.value.reason


def test_unpaired_surrogate_rejected() -> None:
    with pytest.raises(NotJSONError) as info:
        canonical_bytes({"a": "x\ud800"})
    assert info.value.path == "$.a"
    with pytest.raises(NotJSONError):
        digest({"\udfff": 1})


def test_circular_structure_rejected_not_hang() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(NotJSONError) as info:
        canonical_json({"a": loop})
    assert info.value.path == "$.a[1]"
    assert "circular" in info.value.reason
    d: dict[str, Any] = {}
    d["self"] = d
    with pytest.raises(NotJSONError):
        check_json(d)


def test_shared_but_acyclic_containers_are_fine() -> None:
    shared = {"x": 1}
    assert canonical_json([shared, shared, {"y": shared}]) == '[{"x":1},{"x":1},{"y":{"x":1}}]'


def test_reports_a_problem_with_its_path() -> None:
    with pytest.raises(NotJSONError) as info:
        check_json({"a": [1, float("nan")], "b": object()})
    assert info.value.path == "$.a[1]"


def test_check_json_custom_root_and_quoted_keys() -> None:
    with pytest.raises(NotJSONError) as info:
        check_json({"a.b": {"c d": set()}}, "$input")
    assert info.value.path == '$input["a.b"]["c d"]'


def test_json_path_rendering() -> None:
    assert json_path(()) == "$"
    assert json_path(("a", 0, "b_c", "x-y")) == "$.a[0].b_c.x-y"
    assert json_path(("", "a b", "0")) == '$[""]["a b"]["0"]'
    assert json_path(["k"], "$.nodes[1].args") == "$.nodes[1].args.k"


def test_json_copy_shares_nothing() -> None:
    original: dict[str, Any] = {"a": [{"b": 1}], "t": (1, 2)}
    copied = json_copy(original)
    assert copied == {"a": [{"b": 1}], "t": [1, 2]}
    copied["a"][0]["b"] = 2
    assert original["a"][0]["b"] == 1
    with pytest.raises(NotJSONError):
        json_copy({"x": float("nan")})


def test_digest_text_is_sha256_of_utf8() -> None:
    assert digest_text("é") == "sha256:" + hashlib.sha256("é".encode()).hexdigest()
    assert digest_text("x") != digest("x")  # digest() hashes the JSON string '"x"'


def test_derive_id_is_deterministic_and_distinguishes_parts() -> None:
    a = derive_id("inc", "k", {"b": 1, "a": 2}, 3)
    assert a == derive_id("inc", "k", {"a": 2, "b": 1}, 3)
    assert a.startswith("inc_") and len(a) == len("inc_") + 24
    assert all(c in "0123456789abcdef" for c in a[4:])
    assert a != derive_id("inc", "k", {"a": 2, "b": 1}, 4)
    assert a != derive_id("att", "k", {"a": 2, "b": 1}, 3)
    # Parts are framed as a JSON array, so shifting text between parts changes the id.
    assert derive_id("x", "ab", "c") != derive_id("x", "a", "bc")
    assert derive_id("x", 1) != derive_id("x", "1")


def test_derive_id_shortcut_hashes_exactly_the_canonical_array() -> None:
    # Strings, ints, bools and None are encoded in C on the hot path; every other part
    # goes through the checked encoder. Both must hash the same canonical bytes.
    def reference(kind: str, *parts: object) -> str:
        text = canonical_json([kind, *parts])
        return f"{kind}_{hashlib.sha256(text.encode()).hexdigest()[:24]}"

    rng = random.Random(7)
    alphabet = [chr(i) for i in range(0, 260)] + ["\u2028", "\U0001f600", "\ud7ff", "\ue000"]
    cases: list[tuple[object, ...]] = [
        ("att", "inc_abc", 1), ("adm", "att_x", "work"), ("x", None, -5, 10**30, 0),
        ("k", 'a"b', "c\\d", "tab\t", "é", "\x7f", ""), ("k", True, False, 1.5, [1], {"a": 1}),
        # Each kind of part alone too, so no shortcut hides behind a part that forces the
        # encoder (a bool is an int to isinstance, but canonically true/false, not 1/0).
        ("k", True), ("k", False), ("k", "a", False, 3), ("k", 1.5), ("k", [1]), ("k", {"a": 1})]
    for _ in range(5000):
        cases.append(("k", *("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                              for _ in range(rng.randint(1, 3)))))
    for case in cases:
        kind, *parts = case
        assert derive_id(str(kind), *parts) == reference(str(kind), *parts), case


def test_derive_id_refuses_what_the_checked_encoder_refuses() -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # the C encoder could then write any integer
    try:
        for parts in (("\ud800",), ("ok", "a\udfffb"), (10 ** 4300,), ("x", float("nan")),
                      ({1: "a"},)):
            with pytest.raises(NotJSONError):
                canonical_json(["k", *parts])
            with pytest.raises(NotJSONError):
                derive_id("k", *parts)
        big = 10 ** 4299  # 4,300 digits: still JSON here
        assert derive_id("k", big) == derive_id("k", *json.loads(f"[{big}]"))
    finally:
        sys.set_int_max_str_digits(old)


def test_named_ids_are_stable_and_distinct() -> None:
    assert task_id("k") == task_id("k") != task_id("k2")
    assert task_id("k").startswith("task_")
    assert revision_id("k", "root", 1) != revision_id("k", "root", 2)
    inc = incarnation_id("k", "n", 1, "b", "1", digest({}))
    assert inc.startswith("inc_")
    assert inc != incarnation_id("k", "n", 1, "b", "2", digest({}))
    assert attempt_id(inc, 1) != attempt_id(inc, 2)
    assert admission_id("s", "tool") == admission_id("s", "tool") != admission_id("s", "model")


def _nested(levels: int, as_dict: bool) -> Any:
    value: Any = {} if as_dict else []
    for _ in range(levels - 1):
        value = {"k": value} if as_dict else [value]
    return value


@pytest.mark.parametrize("as_dict", [False, True])
@pytest.mark.parametrize("levels", [MAX_NESTING, MAX_NESTING + 1, 50_000])
def test_nesting_is_bounded_not_a_recursion_error(levels: int, as_dict: bool) -> None:
    deep = _nested(levels, as_dict)
    if levels <= MAX_NESTING:
        assert json.loads(canonical_json(deep)) == deep
        return
    with pytest.raises(NotJSONError) as info:
        digest(deep)
    assert f"deeper than {MAX_NESTING}" in info.value.reason
