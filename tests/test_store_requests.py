"""Store requests refuse what a store could not journal faithfully, naming where it is."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agentium_graph.store._requests import AppendJournal


@pytest.mark.parametrize("data, where", [
    ({"o": object()}, "data.o: object is not a JSON type"),
    ({"tags": {1, 2}}, "data.tags: set is not a JSON type"),
    ({"x": [1, float("nan")]}, "data.x[1]: NaN and infinities are not JSON"),
    ({"raw": b"x"}, "data.raw: bytes is not a JSON type"),
    ({"deep": {"k": {3: 4}}}, "data.deep.k: object key 3 is not a string"),
])
def test_append_journal_data_must_be_plain_json(data: dict[str, Any], where: str) -> None:
    # A store would write these as something else (a set as a list, NaN as null) or fail
    # mid-commit with an untyped error; refused when the step is built instead.
    with pytest.raises(ValidationError, match="journal data must be plain JSON") as info:
        AppendJournal(kind="note", data=data)
    assert where in str(info.value)


def test_append_journal_data_of_plain_json_is_kept_as_given() -> None:
    data = {"kind": "x", "nested": [1, {"a": None, "b": 2.5, "c": "é"}], "t": (1, 2)}
    step = AppendJournal(kind="note", data=data)
    assert step.data == data
