"""The public facade is exactly the SPEC's names plus documented additions."""

from __future__ import annotations

import agentium_graph

SPEC_NAMES = {
    "ExecutionGraphRuntime", "ExecutionGraphProgram", "HostCatalog",
    "ToolBinding", "AgentBinding", "GraphBinding", "RepeatBinding", "Agent",
    "RootLimits", "PlanLimits", "Budgets", "PlannerConfig",
    "DurableTaskStore", "StoreCapabilities", "InMemoryDurableTaskStore",
    "DurableActionConnector", "ActionRequest", "ActionOutcome", "Absent", "Unknown",
    "tool_context", "TaskView", "TaskResult", "AdmissionEvent",
    "AgentiumGraphError", "PlanValidationError", "DurableRecoveryRequiredError",
    "StaleFenceError", "TaskConflictError", "LeaseHeldError", "BudgetExhaustedError",
    "TaskCanceledError", "DeadlineExceededError", "StoreNotDurableError",
    "DescriptorMismatchError", "StoreError", "StoreUnavailableError",
}


def test_every_spec_name_is_exported() -> None:
    missing = SPEC_NAMES - set(agentium_graph.__all__)
    assert not missing


def test_all_has_no_duplicates_and_resolves() -> None:
    names = agentium_graph.__all__
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(agentium_graph, name), name


def test_every_error_derives_from_the_root() -> None:
    for name in agentium_graph.__all__:
        obj = getattr(agentium_graph, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, agentium_graph.AgentiumGraphError), name
            assert isinstance(obj.code, str) and obj.code


def test_error_codes_are_unique() -> None:
    codes: dict[str, str] = {}
    for name in agentium_graph.__all__:
        obj = getattr(agentium_graph, name)
        if isinstance(obj, type) and issubclass(obj, agentium_graph.AgentiumGraphError):
            assert obj.code not in codes, (name, codes.get(obj.code))
            codes[obj.code] = name


def test_every_public_name_is_in_the_api_reference() -> None:
    from pathlib import Path

    import agentium_graph

    reference = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    missing = [name for name in agentium_graph.__all__
               if name != "__version__" and f"`{name}`" not in reference]
    assert missing == [], f"document these in docs/api.md: {missing}"
