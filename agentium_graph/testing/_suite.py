"""StoreConformanceSuite: every group of conformance tests in one base class."""

from __future__ import annotations

import pytest

from agentium_graph.testing._suite_admission import AdmissionTests
from agentium_graph.testing._suite_durable import (
    DurabilityTests,
    HandleTests,
    LifecycleTests,
    MultiProcessTests,
)
from agentium_graph.testing._suite_journal import JournalTests
from agentium_graph.testing._suite_lease import CancelTests, LeaseTests
from agentium_graph.testing._suite_nodes import NodeTests
from agentium_graph.testing._suite_plan import ActionTests, PlanTests, StatusTests
from agentium_graph.testing._suite_tasks import TaskTests


class StoreConformanceSuite(
    TaskTests,
    LeaseTests,
    CancelTests,
    NodeTests,
    PlanTests,
    ActionTests,
    StatusTests,
    AdmissionTests,
    JournalTests,
    LifecycleTests,
    HandleTests,
    DurabilityTests,
    MultiProcessTests,
):
    """Subclass as ``Test<YourStore>Conformance`` and override the ``harness`` fixture.

    Its name does not start with ``Test``, so pytest collects it only through your
    subclass. Every test is an ``async`` method run by pytest-asyncio.
    """

    pytestmark = [pytest.mark.asyncio]
