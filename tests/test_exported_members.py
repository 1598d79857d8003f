"""The public facade is exactly the SPEC's names plus documented additions."""

from __future__ import annotations

import pytest

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


# --- the facade imports lazily ------------------------------------------------------------

def _type_checking_names() -> dict[str, str]:
    """name -> module, as the package's TYPE_CHECKING block imports them (what mypy sees)."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(agentium_graph.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.name: str(node.module) for node in block.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_each_public_name_is_the_object_its_type_checking_import_names() -> None:
    import importlib

    names = _type_checking_names()
    assert set(names) == set(agentium_graph.__all__) - {"__version__"}
    for name, module in names.items():
        assert getattr(agentium_graph, name) is getattr(importlib.import_module(module), name), \
            name


def _fresh(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def test_importing_the_package_errors_or_a_store_does_not_load_the_runtime() -> None:
    code = ("import sys, agentium_graph, agentium_graph.errors, agentium_graph_sqlite; "
            "print(sorted(m for m in ('agentium_graph.runtime', 'agentium_graph._program')"
            " if m in sys.modules))")
    assert _fresh(code) == "[]"
    # ... and the first use of a runtime name loads it
    code = ("import sys; from agentium_graph import ExecutionGraphRuntime; "
            "print('agentium_graph.runtime' in sys.modules)")
    assert _fresh(code) == "True"


def test_the_facade_still_behaves_like_a_module() -> None:
    import agentium_graph.store

    namespace: dict[str, object] = {}
    exec("from agentium_graph import *", namespace)  # every name of __all__, imported lazily
    assert set(agentium_graph.__all__) <= set(namespace)
    assert set(agentium_graph.__all__) <= set(dir(agentium_graph))
    assert agentium_graph.store is agentium_graph.store  # a subpackage is an attribute
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        agentium_graph.NoSuchName  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute '_private'"):
        agentium_graph._private  # noqa: B018
