"""Mutation testing of the store conformance suite: it must catch broken stores.

Each mutant below is the in-memory store with one deliberate protocol violation. The
whole :class:`~agentium_graph.testing.StoreConformanceSuite` runs against every mutant
(and against the unmodified store as a control) in one child pytest process, and each
mutant must fail at least one conformance test. A mutant that survives is a gap in the
suite; the checks that closed such gaps live in ``agentium_graph/testing`` and the mutant
here is their proof.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import TypeVar

import pytest

from agentium_graph.errors import TaskConflictError
from agentium_graph.store import (
    AcquireLeaseRequest,
    CancelTaskRequest,
    CommitRequest,
    CommitResult,
    CreateTaskRequest,
    CreateTaskResult,
    InMemoryDurableTaskStore,
    JournalEntry,
    LeaseGrant,
    LeaseStatus,
    ListTasksRequest,
    ReleaseLeaseRequest,
    RenewLeaseRequest,
    TaskHeader,
    TaskSnapshot,
    TimelineRequest,
)
from agentium_graph.store._memory import _own_header, _Task
from agentium_graph.store._records import record_json, replace
from agentium_graph.store._transitions import (
    Delta,
    apply_commit,
    check_fence,
    creation_entry,
    request_cancel,
)

# The child run (the fixture below) is bounded by its own timeout, not the suite's 120 s.
pytestmark = pytest.mark.timeout(930)

# --- the mutants ---------------------------------------------------------------------

R = TypeVar("R", CommitRequest, RenewLeaseRequest, ReleaseLeaseRequest)


def as_holder(store: InMemoryDurableTaskStore, request: R) -> R:
    """``request`` as if sent by the current lease holder (the fence check skipped)."""
    header = store._task(request.key).header
    if header.lease is None:
        return request
    return request.model_copy(update={"worker_id": header.lease.owner, "fence": header.fence})



class AcceptsStaleFence(InMemoryDurableTaskStore):
    """commit skips the fence check: a stale (worker, fence) commits as the holder."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await super().commit(as_holder(self, request))


class FirstStepOnly(InMemoryDurableTaskStore):
    """commit applies only the first step of a multi-step request."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        return await super().commit(request.model_copy(update={"steps": request.steps[:1]}))


class PersistsStepByStep(InMemoryDurableTaskStore):
    """commit persists each step as it goes: a later step that raises keeps the earlier."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        result: CommitResult | None = None
        for step in request.steps:
            result = await super().commit(request.model_copy(update={"steps": (step,)}))
        if result is None:
            result = await super().commit(request)
        return result


class OverwritesOnCreate(InMemoryDurableTaskStore):
    """create_task replaces an existing task of another identity instead of raising."""

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        task = self._tasks.get(request.header.key)
        if task is not None and task.header.identity_digest != request.header.identity_digest:
            del self._tasks[request.header.key]
        return await super().create_task(request)


class CreateConflictSaysCreated(InMemoryDurableTaskStore):
    """create_task of a different identity answers created=False instead of raising."""

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        try:
            return await super().create_task(request)
        except TaskConflictError:
            task = self._tasks[request.header.key]
            return CreateTaskResult(created=False, header=_own_header(task.header))


class DropsJournalEntries(InMemoryDurableTaskStore):
    """A write that appends several journal entries keeps only the first."""

    def _persist(self, task: _Task, header: TaskHeader, journal: list[JournalEntry],
                 delta: Delta | None, blobs: dict[str, str]) -> None:
        super()._persist(task, header, journal[:1], delta, blobs)


class ReordersJournalEntries(InMemoryDurableTaskStore):
    """A write's journal entries are stored in reverse order."""

    def _persist(self, task: _Task, header: TaskHeader, journal: list[JournalEntry],
                 delta: Delta | None, blobs: dict[str, str]) -> None:
        super()._persist(task, header, journal[::-1], delta, blobs)


class TimelineSkipsAtPageBoundary(InMemoryDurableTaskStore):
    """read_timeline(after_seq>0) skips the first entry after the boundary."""

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        if request.after_seq > 0:
            request = request.model_copy(update={"after_seq": request.after_seq + 1})
        return await super().read_timeline(request)


class TimelineIgnoresLimit(InMemoryDurableTaskStore):
    """read_timeline returns everything after after_seq, whatever the limit."""

    async def read_timeline(self, request: TimelineRequest) -> list[JournalEntry]:
        return await super().read_timeline(request.model_copy(update={"limit": 10**6}))


class CancelClobbersLease(InMemoryDurableTaskStore):
    """request_cancel writes the whole header: it drops the owner's lease."""

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        task = self._task(request.key)
        header = request_cancel(task.header, request)
        if header is None:
            return _own_header(task.header)
        header = replace(header, lease=None)
        task.header = _own_header(header)
        return header


class CancelLastReasonWins(InMemoryDurableTaskStore):
    """A second cancel request overwrites the first one's reason."""

    async def request_cancel(self, request: CancelTaskRequest) -> TaskHeader:
        task = self._task(request.key)
        if task.header.cancel is not None:
            task.header = replace(task.header, cancel=None)
        return await super().request_cancel(request)


class RenewDoesNotExtend(InMemoryDurableTaskStore):
    """renew_lease checks the fence but keeps (and reports) the old expiry."""

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        task = self._task(request.key)
        check_fence(task.header, request.worker_id, request.fence)
        assert task.header.lease is not None
        return LeaseStatus(fence=task.header.fence, expires_at=task.header.lease.expires_at,
                           cancel=task.header.cancel)


class RenewReportsButDoesNotStore(InMemoryDurableTaskStore):
    """renew_lease reports the new expiry but does not store it."""

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        task = self._task(request.key)
        kept = task.header
        status = await super().renew_lease(request)
        task.header = kept
        return status


class RenewSkipsFence(InMemoryDurableTaskStore):
    """renew_lease of a stale holder extends the current lease."""

    async def renew_lease(self, request: RenewLeaseRequest) -> LeaseStatus:
        return await super().renew_lease(as_holder(self, request))


class ChargesTwice(InMemoryDurableTaskStore):
    """commit forgets which admission ids were charged: a retransmission charges again."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        task = self._task(request.key)
        delta = apply_commit(task.header, task.nodes, task.actions, frozenset(), request)
        self._persist(task, delta.header, delta.journal, delta, request.blobs)
        return delta.result()


class LeakyReads(InMemoryDurableTaskStore):
    """Reads hand out the stored objects themselves (no copies)."""

    async def get_header(self, key: str) -> TaskHeader | None:
        task = self._tasks.get(key)
        return None if task is None else task.header

    async def get_task(self, key: str) -> TaskSnapshot | None:
        task = self._tasks.get(key)
        return None if task is None else TaskSnapshot.model_construct(
            header=task.header, nodes=task.nodes, actions=task.actions)


class LeakySnapshotHeader(InMemoryDurableTaskStore):
    """get_task hands out the stored header itself (nodes and actions are copies)."""

    async def get_task(self, key: str) -> TaskSnapshot | None:
        snapshot = await super().get_task(key)
        return None if snapshot is None else TaskSnapshot.model_construct(
            header=self._tasks[key].header, nodes=snapshot.nodes, actions=snapshot.actions)


class LeakyHeaderReads(InMemoryDurableTaskStore):
    """Only get_header hands out the stored header itself."""

    async def get_header(self, key: str) -> TaskHeader | None:
        task = self._tasks.get(key)
        return None if task is None else task.header


class LeakyListTasks(InMemoryDurableTaskStore):
    """list_tasks hands out the stored headers themselves."""

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        listed = await super().list_tasks(request)
        return [self._tasks[header.key].header for header in listed]


class LeakyCommitResult(InMemoryDurableTaskStore):
    """commit stores the header it returns: the caller's result aliases stored state."""

    async def commit(self, request: CommitRequest) -> CommitResult:
        result = await super().commit(request)
        self._task(request.key).header = result.header
        return result


class ListTasksSkipsAtPageBoundary(InMemoryDurableTaskStore):
    """list_tasks(after=k) skips the first key after k."""

    async def list_tasks(self, request: ListTasksRequest) -> list[TaskHeader]:
        listed = await super().list_tasks(request)
        return listed[1:] if request.after is not None else listed


class ReleaseSkipsFence(InMemoryDurableTaskStore):
    """release_lease of a stale holder drops the current lease."""

    async def release_lease(self, request: ReleaseLeaseRequest) -> TaskHeader:
        return await super().release_lease(as_holder(self, request))


class AcquireReusesFence(InMemoryDurableTaskStore):
    """A re-acquisition by the same worker keeps the current fence."""

    async def acquire_lease(self, request: AcquireLeaseRequest) -> LeaseGrant:
        task = self._task(request.key)
        lease = task.header.lease
        if lease is not None and lease.owner == request.worker_id and not request.steps:
            header = replace(task.header, fence=task.header.fence - 1)
            task.header = header
        return await super().acquire_lease(request)


class LeakyCreate(InMemoryDurableTaskStore):
    """create_task stores the request's own header: the caller can change stored state."""

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        key = request.header.key
        if key in self._tasks:
            return await super().create_task(request)
        entry = creation_entry(request)
        self._tasks[key] = _Task(header=request.header,
                                 identity=request.identity.model_dump_json(),
                                 nodes={n.node_id: n for n in request.nodes},
                                 admissions={request.admission_id: {}},
                                 journal=[record_json(entry)])
        self._blobs.update(request.blobs)
        return CreateTaskResult(created=True, header=_own_header(request.header))


class BlobsOverwrite(InMemoryDurableTaskStore):
    """Blobs are overwritten instead of insert-if-absent."""

    def _persist(self, task: _Task, header: TaskHeader, journal: list[JournalEntry],
                 delta: Delta | None, blobs: dict[str, str]) -> None:
        super()._persist(task, header, journal, delta, blobs)
        self._blobs.update(blobs)


MUTANTS: dict[str, type[InMemoryDurableTaskStore]] = {
    cls.__name__: cls for cls in (
        AcceptsStaleFence, FirstStepOnly, PersistsStepByStep, OverwritesOnCreate,
        CreateConflictSaysCreated, DropsJournalEntries, ReordersJournalEntries,
        TimelineSkipsAtPageBoundary, TimelineIgnoresLimit, CancelClobbersLease,
        CancelLastReasonWins, RenewDoesNotExtend, RenewReportsButDoesNotStore,
        RenewSkipsFence, ChargesTwice, LeakyReads, LeakySnapshotHeader, LeakyHeaderReads,
        LeakyListTasks, LeakyCommitResult, LeakyCreate, BlobsOverwrite,
        ListTasksSkipsAtPageBoundary, ReleaseSkipsFence, AcquireReusesFence)}
CONTROL = "Unmodified"

# --- running the suite against them ---------------------------------------------------

_SUITE_MODULE = '''
import importlib.util
import sys

import pytest

from agentium_graph.store import InMemoryDurableTaskStore
from agentium_graph.testing import StoreConformanceSuite, StoreHarness
from agentium_graph.testing.memory import MemoryHarness

_spec = importlib.util.spec_from_file_location("review16_mutants", {path!r})
mutants = importlib.util.module_from_spec(_spec)
sys.modules["review16_mutants"] = mutants
_spec.loader.exec_module(mutants)
STORES = dict(mutants.MUTANTS, {control}=InMemoryDurableTaskStore)


def _suite(store_class):
    class Suite(StoreConformanceSuite):
        @pytest.fixture
        def harness(self) -> StoreHarness:
            return MemoryHarness(store_class())
    return Suite


for _name, _cls in STORES.items():
    globals()["Test" + _name] = _suite(_cls)
'''

# A mutant is caught by its first failing test: the rest of its suite is skipped, which
# makes the child run a fraction of the 26 whole suites (the control still runs whole).
_STOP_AT_FIRST_FAILURE = '''
import pytest

_caught: set[type] = set()  # the mutants' suite classes (each is named "Suite")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if outcome.get_result().failed and item.cls is not None:
        _caught.add(item.cls)


def pytest_runtest_setup(item):
    if item.cls in _caught:
        pytest.skip("this mutant has already failed a conformance test")
'''


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Counter[str]]:
    """Run the conformance suite against every mutant: {mutant: Counter(outcome)}."""
    root = Path(__file__).resolve().parent.parent
    work = tmp_path_factory.mktemp("mutants")
    module = work / "test_suite_against_mutants.py"
    module.write_text(textwrap.dedent(_SUITE_MODULE).format(path=str(Path(__file__).resolve()),
                                                             control=CONTROL))
    (work / "stop_at_first_failure.py").write_text(_STOP_AT_FIRST_FAILURE)
    report = work / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "stop_at_first_failure", "--rootdir", str(root),
         "-c", str(root / "pyproject.toml"), f"--junitxml={report}", str(module)],
        cwd=root, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(work), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Counter[str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        mutant = case.get("classname", "").rsplit(".", 1)[-1].removeprefix("Test")
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result.setdefault(mutant, Counter())[kinds[0] if kinds else "passed"] += 1
    return result


def _failed(counts: Counter[str]) -> int:
    return counts["failure"] + counts["error"]


def test_the_unmodified_store_passes_in_the_same_run(
        outcomes: dict[str, Counter[str]]) -> None:
    control = outcomes[CONTROL]
    assert _failed(control) == 0 and control["passed"] > 100, control


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_suite_catches_the_mutant(mutant: str, outcomes: dict[str, Counter[str]]) -> None:
    counts = outcomes[mutant]
    assert _failed(counts) > 0, f"{mutant} survived the conformance suite: {counts}"
    # caught by a test that ran and failed (not only by a harness that could not set it up),
    # after which the rest of its suite was skipped (a teardown error may come with it)
    assert counts["failure"] == 1, f"{mutant}: {counts}"
    assert counts["skipped"] > 0, f"{mutant}: {counts}"


def test_every_mutant_differs_from_the_store() -> None:
    # Each mutant overrides something: none is the store under another name.
    for cls in MUTANTS.values():
        assert any(name in vars(cls) for name in (
            "commit", "create_task", "_persist", "read_timeline", "request_cancel",
            "renew_lease", "get_header", "get_task", "list_tasks", "release_lease",
            "acquire_lease")), cls

