"""Root limits and budgets too large to pin, and a task input too deep for its schema.

``RootLimits(max_work_attempts=10**5000)`` was accepted, then every ``create`` failed with a
bare NotJSONError when the limits were pinned as JSON; a deep input against a recursive
``input_schema`` made ``create`` raise a bare RecursionError. Both are now typed errors
that name what is wrong, raised before anything is stored.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentium_graph import (
    Budgets,
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
    PlanValidationError,
    RootLimits,
)
from bench._graphs import ROOT_LIMITS, catalog, chain


@pytest.mark.parametrize("cls, field", [
    (RootLimits, "max_expanded_nodes"), (RootLimits, "max_work_attempts"),
    (RootLimits, "max_plan_revisions"), (Budgets, "model_calls"), (Budgets, "tool_calls"),
    (Budgets, "input_tokens"), (Budgets, "output_tokens")])
def test_a_limit_too_large_to_pin_is_refused_at_once(cls: type[Any], field: str) -> None:
    assert getattr(cls(**{field: 2**63 - 1}), field) == 2**63 - 1
    for huge in (2**63, 10**5000):
        with pytest.raises(ConfigurationError, match=field):
            cls(**{field: huge})


def test_the_largest_limits_pin_and_run() -> None:
    async def main() -> None:
        store = InMemoryDurableTaskStore()
        runtime = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS)
        biggest = 2**63 - 1
        await runtime.create("k", chain(2), limits={"max_work_attempts": biggest},
                             budgets={"tool_calls": biggest})
        result = await runtime.run("k")
        assert result.status == "completed"
        view = await runtime.inspect("k")
        assert view.limits["work_attempts"] == biggest
        assert view.limits["tool_calls"] == biggest

    asyncio.run(main())


def test_a_deep_input_against_a_recursive_schema_is_a_diagnostic() -> None:
    # Several validator frames per level: plain JSON within the nesting bound (200) is
    # already too deep for Python's stack (a bare RecursionError before).
    tree = {"anyOf": [{"type": "object",
                       "properties": {"child": {"allOf": [{"$ref": "#"}]}}}]}
    program = chain(2).model_copy(update={"input_schema": tree})
    program = ExecutionGraphProgram.model_validate(program.model_dump())
    deep: dict[str, Any] = {}
    for _ in range(195):  # within the JSON nesting bound (200)
        deep = {"child": deep}

    async def main() -> None:
        store = InMemoryDurableTaskStore()
        runtime = ExecutionGraphRuntime(catalog=catalog(), store=store, limits=ROOT_LIMITS)
        with pytest.raises(PlanValidationError) as caught:
            await runtime.create("k", program, input=deep)
        (problem,) = caught.value.diagnostics
        assert problem.code == "input_invalid" and problem.path == "$input"
        assert "nests too deeply" in problem.message
        assert await store.get_header("k") is None  # nothing stored
        # A shallow input of the same shape is taken.
        await runtime.create("k", program, input={"child": {"child": {}}})

    asyncio.run(main())
