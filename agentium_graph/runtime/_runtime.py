"""ExecutionGraphRuntime: create and run tasks (the operator API is its base, _operator)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from agentium_graph._canonical import (
    admission_id,
    checked_json,
    digest,
    digest_text,
    json_copy,
    task_id,
)
from agentium_graph._program import ExecutionGraphProgram, PlanLimits
from agentium_graph.catalog._bindings import GraphBinding, RepeatBinding
from agentium_graph.catalog._catalog import HostCatalog
from agentium_graph.errors import (
    ConfigurationError,
    DataIntegrityError,
    DeadlineExceededError,
    DescriptorMismatchError,
    Diagnostic,
    DurableRecoveryRequiredError,
    InvalidTransitionError,
    LeaseHeldError,
    NestedDispatchError,
    NodeFailedError,
    PlanValidationError,
    StaleFenceError,
    StoreError,
    StoreNotDurableError,
    TaskCanceledError,
    TaskConflictError,
    check_flags,
)
from agentium_graph.plan._validate import CompiledPlan, pseudo_ref_problems, validate_plan
from agentium_graph.runtime._admission import AdmissionController
from agentium_graph.runtime._args import (
    budgets_arg,
    check_key,
    check_new_key,
    check_policy_revision,
    check_runtime_args,
    check_text,
    deadline_arg,
    grants_arg,
    kind,
    root_limits,
)
from agentium_graph.runtime._blobs import read_verified
from agentium_graph.runtime._config import (
    DEFAULT_LEASE_TTL,
    Budgets,
    RootLimits,
    counter_limits,
)
from agentium_graph.runtime._containers import node_record
from agentium_graph.runtime._context import current_context
from agentium_graph.runtime._create_checks import check_input, check_sizes
from agentium_graph.runtime._inspect import (
    build_view,
    check_journal,
    check_snapshot,
    verified_identity,
)
from agentium_graph.runtime._operator import OperatorAPI, run_sync
from agentium_graph.runtime._planner import (
    committed_plan,
    empty_plan,
    find_program,
)
from agentium_graph.runtime._reach import pinned_keys_used, ungranted_by_node, used_bindings
from agentium_graph.runtime._resolve import cancel_stopped
from agentium_graph.runtime._run import FastStartRefused, RunState, TaskRun
from agentium_graph.runtime._terminal import raise_terminal
from agentium_graph.runtime._views import (
    AdmissionEvent,
    TaskResult,
    TaskView,
)
from agentium_graph.store._memory import InMemoryDurableTaskStore
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import (
    COUNTERS,
    TERMINAL_TASK,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    identity_digest_of,
)
from agentium_graph.store._requests import (
    AcquireLeaseRequest,
    CreateTaskRequest,
    LeaseGrant,
    ReleaseLeaseRequest,
)

log = logging.getLogger("agentium_graph.runtime")
# The longest a failed run waits to release its lease (it expires by itself).
RELEASE_WAIT_S = 5.0
T = TypeVar("T")
L = TypeVar("L", RootLimits, PlanLimits)

# How much a runtime remembers of tasks it created (identities; header and nodes as written)
# so that running them right after costs no reads: a bounded convenience, never required.
_REMEMBERED_TASKS = 256
# How a run ends on purpose: the lease was released with the final status, or is no longer
# ours. Anything else leaves our lease behind, so it is released before re-raising.
_RUN_OUTCOMES = (StaleFenceError, TaskCanceledError, DeadlineExceededError, NodeFailedError,
                 DurableRecoveryRequiredError)
_REMEMBERED_NODES = 20_000


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _checked_clock(clock: Callable[[], datetime]) -> Callable[[], datetime]:
    """``clock``, checked on every call: its times are written into records and compared
    with deadlines and lease expiries, so anything but an aware datetime (a naive one, a
    string or a number the store's models would coerce) is refused before it is used."""
    def now() -> datetime:
        value = clock()
        if isinstance(value, datetime) and value.utcoffset() is not None:
            return value
        what = "a naive datetime (no UTC offset)" if isinstance(value, datetime) else kind(value)
        raise ConfigurationError(
            f"clock returned {what}: it must return a timezone-aware datetime, such as "
            "datetime.now(UTC); nothing was written with it",
            details={"returned": type(value).__name__,
                     "value": repr(value)})
    return now


class ExecutionGraphRuntime(OperatorAPI):
    """Runs validated JSON DAG plans durably against a host catalog and a task store.

    ``lease_ttl``: seconds a lease lasts without renewal (default 15, at most 30).
    ``poll_interval``: seconds between lease renewals, which also observe cancel requests.
    ``clock``: injectable source of aware UTC datetimes; a call that returns anything else
    (a naive datetime, a string, a number) raises ConfigurationError before it is used.
    ``programs``: planner programs this runtime may run without having created their tasks
    (a worker recovering a planned task after a crash); ``create`` registers its program too.
    """

    def __init__(self, *, catalog: HostCatalog, store: DurableTaskStore | None = None,
                 require_durable: bool = False,
                 limits: RootLimits | Mapping[str, int] | None = None,
                 on_admission: Callable[[AdmissionEvent], None] | None = None,
                 lease_ttl: float = DEFAULT_LEASE_TTL, poll_interval: float = 1.0,
                 clock: Callable[[], datetime] | None = None,
                 policy_revision: str = "1", effect_timeout: float = 30.0,
                 lookup_timeout: float = 10.0, lookup_attempts: int = 3,
                 programs: Iterable[ExecutionGraphProgram] = ()) -> None:
        if not isinstance(catalog, HostCatalog):
            raise ConfigurationError(f"catalog must be a HostCatalog, not "
                                     f"{type(catalog).__name__}; pass HostCatalog([...])")
        self.catalog = catalog
        check_runtime_args(store=store, require_durable=require_durable,
                           lease_ttl=lease_ttl, poll_interval=poll_interval,
                           effect_timeout=effect_timeout, lookup_timeout=lookup_timeout,
                           lookup_attempts=lookup_attempts, clock=clock,
                           on_admission=on_admission, policy_revision=policy_revision,
                           programs=programs)
        # Planner programs this runtime can run, by (id, version): a planner's provider is
        # code, so a worker that recovers a planned task must be given its program.
        self._programs: dict[tuple[str, str], ExecutionGraphProgram] = {}
        for program in programs:
            self.register_program(program)
        self.store: DurableTaskStore = store if store is not None else InMemoryDurableTaskStore()
        if require_durable and not self.store.capabilities.durable:
            raise StoreNotDurableError(
                f"require_durable=True but the {self.store.capabilities.name} store is not "
                "durable; use SQLiteDurableTaskStore or MongoDBDurableTaskStore")
        if not 0 < lease_ttl <= 30:
            raise ConfigurationError("lease_ttl must be in (0, 30] seconds")
        if not 0 < poll_interval < lease_ttl:
            raise ConfigurationError("poll_interval must be positive and below lease_ttl")
        self.limits = root_limits(limits, RootLimits())
        self.on_admission = on_admission
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.clock: Callable[[], datetime] = _utcnow if clock is None else \
            _checked_clock(clock)
        self.policy_revision = policy_revision
        for name, seconds in (("effect_timeout", effect_timeout),
                              ("lookup_timeout", lookup_timeout)):
            if not seconds > 0:  # NaN too: every comparison with it is false
                raise ConfigurationError(f"{name} must be a positive number of seconds, got "
                                         f"{seconds!r}")
        if not 1 <= lookup_attempts <= 10:
            raise ConfigurationError(f"lookup_attempts must be between 1 and 10, got "
                                     f"{lookup_attempts!r}")
        self.effect_timeout = effect_timeout
        self.lookup_timeout = lookup_timeout
        self.lookup_attempts = lookup_attempts
        self._active: dict[str, TaskRun] = {}
        # Keys a run() call of this runtime is running, with its worker id: from the
        # moment it starts (before any await), so two calls never both take the lease.
        self._claimed: dict[str, str] = {}
        # Admission of tasks whose last run here ended while work it abandoned (a tool that
        # ignored its cancellation, a sync tool's thread) still holds permits: the task's
        # next run in this runtime counts them, so max_concurrent_work holds across runs.
        self._lingering: dict[str, AdmissionController] = {}
        self._limits_made: dict[tuple[type[Any], tuple[tuple[str, int], ...]], Any] = {}
        self._nested: dict[tuple[str, str, tuple[str, ...] | None], CompiledPlan] = {}
        self._compiled: dict[tuple[str, PlanLimits, tuple[str, ...] | None], CompiledPlan] = {}
        # Pinned identities by task key, each with its digest: an identity never changes
        # once created, and a run checks the digest against the header before using one.
        self._identities: dict[str, tuple[str, TaskIdentity]] = {}
        # Tasks created here and not run yet: their header and node records as written.
        # Bounded by tasks and by node records held, so creating many large tasks that
        # are run elsewhere (or never) does not grow memory.
        self._fresh: dict[str, tuple[TaskHeader, tuple[NodeRecord, ...]]] = {}
        self._fresh_nodes = 0

    # --- create ---------------------------------------------------------------------
    async def create(self, key: str, program: ExecutionGraphProgram, *, input: Any = None,
                     budgets: Budgets | Mapping[str, int | None] | None = None,
                     grants: Iterable[str] | None = None,
                     deadline: datetime | timedelta | None = None,
                     limits: RootLimits | Mapping[str, int] | None = None,
                     policy_revision: str | None = None) -> TaskView:
        """Validate the whole plan, pin the task's identity and store it (idempotently).

        ``budgets`` and ``limits`` may be given as dicts of their fields; ``grants`` is a
        list of binding ids (``None``: every binding of the catalog)."""
        check_new_key(key)
        if not isinstance(program, ExecutionGraphProgram):
            raise ConfigurationError(f"program must be an ExecutionGraphProgram, not "
                                     f"{kind(program)}")
        limits = root_limits(limits, self.limits)
        budgets = budgets_arg(budgets)
        grant_list = grants_arg(grants)
        if grant_list is not None:
            unknown = [g for g in grant_list if not self.catalog.versions(g)]
            if unknown:
                raise ConfigurationError(
                    f"task {key!r}: grants name binding id(s) this catalog does not register: "
                    f"{', '.join(repr(g) for g in unknown[:10])}; grant registered binding ids "
                    "only (a typo would leave the binding it meant ungranted)",
                    details={"argument": "grants", "unknown": unknown[:10]})
        if policy_revision is not None:
            check_policy_revision(policy_revision)
        # One checked canonical encoding of the plan gives both its digest and the
        # identity's private copy of it.
        plan_text, plan_copy = (None, None) if program.plan is None else \
            checked_json(program.plan)
        descriptor = program.descriptor(
            plan_digest=None if plan_text is None else digest_text(plan_text))
        plan: CompiledPlan | None = None
        if program.plan is not None:
            plan = self.compile_plan(program.plan, program.limits, grant_list,
                                     str(descriptor["plan_digest"]))
        check_input(program, input)
        check_sizes(self.store, plan_text, input)
        if plan is not None:
            problems = pseudo_ref_problems(plan, repeat=False, input_known=True,
                                           input_value=input)
            if problems:
                raise PlanValidationError(problems)
            used = used_bindings(plan, self.catalog)
        else:
            # A planner may propose any granted binding: the task pins them all, and its
            # proposals are checked against exactly these.
            used = [b for b in self.catalog if grant_list is None or b.id in grant_list]
            if not used:
                raise PlanValidationError([Diagnostic(
                    path="$", code="nothing_to_plan",
                    message="the planner could use no binding: the catalog has none the "
                            "task's grants allow")])
        if grant_list is not None:
            ungranted = sorted({b.id for b in used} - set(grant_list))
            if ungranted:
                named = [] if plan is None else ungranted_by_node(plan, self.catalog,
                                                                   set(grant_list))
                raise PlanValidationError([Diagnostic(
                    path=f"$.nodes[{index}].binding", code="binding_not_granted",
                    node_id=node_id,
                    message=f"node {node_id!r} uses binding(s) {missing} through its nested "
                            "program or agent tools, and the task's grants leave them out; "
                            "grant them too") for index, node_id, missing in named] or [
                    Diagnostic(path="$", code="binding_not_granted",
                               message=f"nested programs or agents use bindings {ungranted} "
                                       "that are not among the task's grants")])
        nodes = () if plan is None else \
            tuple(node_record(key, plan, "", node_id, None) for node_id in plan.order)
        if len(nodes) > limits.max_expanded_nodes:
            raise PlanValidationError([Diagnostic(
                path="$.nodes", code="expansion_limit",
                message=f"{len(nodes)} nodes exceed max_expanded_nodes="
                        f"{limits.max_expanded_nodes}")])
        now = self.clock()
        absolute, after = deadline_arg(deadline, now)
        if plan is None:
            # What the planner is shown is pinned with the task, so every process builds the
            # same requests and recorded responses replay (descriptions are not part of a
            # binding's descriptor).
            descriptor = {**descriptor, "offered": [
                {"binding": b.id, "version": b.version, "kind": b.kind,
                 "description": b.description} for b in
                sorted(used, key=lambda b: (b.id, b.version))]}
        identity = TaskIdentity(
            key=key, catalog_digest=self.catalog.digest, program=descriptor,
            plan=plan_copy,
            descriptors={f"{b.id}@{b.version}": b.descriptor().model_dump(mode="json")
                         for b in used},
            # check_input walked the input above; it is not walked again.
            input=json_copy(input, trusted=True), input_digest=digest(input, trusted=True),
            policy_revision=policy_revision or self.policy_revision, grants=grant_list,
            budgets=budgets.model_dump(), root_limits=limits.model_dump(),
            plan_limits=program.limits.model_dump(), deadline=absolute,
            deadline_after_seconds=after)
        identity_digest = identity_digest_of(identity)
        counters = dict.fromkeys(COUNTERS, 0)
        counters["expanded_nodes"] = len(nodes)
        counters["plan_revisions"] = 0 if plan is None else 1
        header = TaskHeader(
            key=key, task_id=task_id(key), identity_digest=identity_digest, created_at=now,
            updated_at=now, counters=counters, limits=counter_limits(limits, budgets),
            deadline=absolute if absolute is not None else (
                now + timedelta(seconds=after) if after is not None else None),
            revision=0 if plan is None else 1, journal_seq=1)
        # A planner program is known from here on, before the store is awaited: a create
        # of other content under its id and version meanwhile is refused, not swapped in.
        # It stays known if this create fails (as register_program's would): the host
        # meant it, and a program of other content under its id and version is refused.
        if program.planner is not None:
            self.register_program(program)
        try:
            created = await self.store.create_task(CreateTaskRequest(
                header=header, identity=identity, nodes=nodes,
                admission_id=admission_id(header.task_id, "create")))
        except TaskConflictError as exc:
            if set(exc.differing) == {"catalog_digest"}:
                # The same request after a deploy that changed only bindings this task does
                # not use (their pinned descriptors are equal, or they would differ too): the
                # task runs on this catalog, so this is a re-delivery, not another task.
                return await self.inspect(key)
            raise
        if not created.created:
            return await self.inspect(key)  # a re-delivery: show what is stored
        self._remember_identity(identity_digest, identity)
        if plan is not None:
            # What was just written is the whole state a first run starts from. (A planned
            # task's first commit comes after a provider call, which must hold the lease.)
            self._remember_fresh(key, created.header, nodes)
        snapshot = TaskSnapshot(header=created.header, nodes={n.node_id: n for n in nodes},
                                actions={})
        return await build_view(self.store, snapshot, identity, identity_digest=identity_digest)

    def register_program(self, program: ExecutionGraphProgram) -> None:
        """Let this runtime run tasks of ``program`` (needed for planner programs only)."""
        if not isinstance(program, ExecutionGraphProgram):
            raise ConfigurationError("programs must be ExecutionGraphProgram instances")
        self._check_program(program)
        self._programs[(program.id, program.version)] = program

    def _check_program(self, program: ExecutionGraphProgram) -> None:
        """Refuse a program whose id and version this runtime knows with other content (by
        ``programs=``, ``register_program`` or an earlier ``create``): the tasks of the one
        it knows could no longer run here."""
        known = self._programs.get((program.id, program.version))
        if known is not None and known is not program and \
                known.descriptor() != program.descriptor():
            raise ConfigurationError(
                f"program {program.id!r} version {program.version!r} is registered with "
                "different content; bump the version of the changed program")

    async def _planned_root(self, identity: TaskIdentity, header: TaskHeader) -> CompiledPlan:
        """A planned task's root plan: the committed one, or an empty revision 0."""
        limits = PlanLimits(**identity.plan_limits)
        if header.revision == 0:
            return empty_plan(limits)
        plan, plan_digest = await committed_plan(self.store, header)
        return self.compile_plan(plan, limits, identity.grants, plan_digest)

    # --- run ------------------------------------------------------------------------
    async def run(self, key: str, worker_id: str = "worker", *, wait: bool = False) -> TaskResult:
        """Acquire the task's fenced lease and execute or recover it to the end."""
        if current_context() is not None:
            raise NestedDispatchError(
                "run() called from inside a running tool; nested controlled dispatch is "
                "rejected: model the work as a node of the plan instead")
        check_key(key)
        if not isinstance(worker_id, str) or not worker_id.strip() or len(worker_id) > 200:
            # Journaled as the lease owner with every grant: bounded like a task key.
            raise ConfigurationError("worker_id must be a non-blank string of at most 200 "
                                     "characters")
        check_text("worker_id", worker_id)
        check_flags(wait=wait)
        while key in self._claimed:
            # Another run() call of this runtime has the task. Taking its lease over (as a
            # restarted worker of the same id may) would fence out a live run: its
            # confirmed effects would never reach the journal and its nodes would run
            # twice. Wait for that call to end, or refuse as for another worker's lease.
            if not wait:
                raise await self._held_here(key, self._claimed[key])
            await asyncio.sleep(min(self.poll_interval, 0.05))
        self._claimed[key] = worker_id
        try:
            return await self._run_claimed(key, worker_id, wait)
        finally:
            del self._claimed[key]

    async def _held_here(self, key: str, worker_id: str) -> LeaseHeldError:
        """The LeaseHeldError for a task that another run() call of this runtime runs."""
        header = await self.store.get_header(key)
        lease = None if header is None else header.lease
        expires = lease.expires_at if lease is not None else \
            self.clock() + timedelta(seconds=self.lease_ttl)
        return LeaseHeldError(key, worker_id if lease is None else lease.owner, expires,
                              same_runtime=True)

    async def _run_claimed(self, key: str, worker_id: str, wait: bool) -> TaskResult:
        fresh = self._forget_fresh(key)
        if fresh is not None:
            result = await self._run_fresh(key, worker_id, fresh)
            if result is not None:
                return result
        header = await self._header(key)
        if header.status == "completed":
            return await self._retained_result(key)
        if header.status == "recovery_required" and header.cancel is not None and \
                await cancel_stopped(self.store, key, lease_ttl=self.lease_ttl,
                                     clock=self.clock):
            # A cancel recorded without a runtime (the CLI, another process) is applied by
            # the next run, as for any task nobody runs.
            header = await self._header(key)
        raise_terminal(header)
        identity = await self._pinned_identity(header)
        planned = identity.plan is None
        program: ExecutionGraphProgram | None = None
        plan: CompiledPlan | None = None
        if planned:
            # Applying a pending cancel needs no planner, so no program either.
            program = find_program(self._programs, identity, required=header.cancel is None)
        else:
            self._check_descriptors(identity)
            plan = self._compile(identity)
        # Before the lease: taking it appends to the journal, past a damaged end.
        await check_journal(self.store, header)
        try:
            lease = await self._acquire(key, worker_id, wait, header.deadline)
        except (LeaseHeldError, DeadlineExceededError, InvalidTransitionError):
            raise  # refused: nothing was taken
        except BaseException:
            # The acquisition may have landed though its answer never came back (run()
            # canceled meanwhile, a lost reply): give back a lease it left us.
            await self._release_if_ours(key, worker_id, header.fence)
            raise
        if lease is None:
            # The task ended while this call waited (another worker finished, failed or
            # canceled it): answer as a run on an ended task does.
            header = await self._header(key)
            if header.status == "completed":
                return await self._retained_result(key)
            raise_terminal(header)
            raise AssertionError(f"task {key!r} is {header.status}")  # pragma: no cover
        grant = lease.fence
        try:
            snapshot = lease.snapshot or await self.store.get_task(key)
            assert snapshot is not None
            check_snapshot(snapshot, identity)
            if plan is None:
                plan = await self._planned_root(identity, snapshot.header)
                # Before planning every pinned binding may be proposed; after it, only the
                # ones the committed plan reaches matter (as for a static plan).
                self._check_descriptors(identity, None if snapshot.header.revision == 0 else
                                        pinned_keys_used(plan, self.catalog,
                                                         identity.descriptors))
            state = RunState(header=snapshot.header, nodes=dict(snapshot.nodes),
                             actions=dict(snapshot.actions), identity=identity,
                             outputs=await self._load_outputs(snapshot))
            run = TaskRun(self, key, worker_id, grant, state, plan, program=program)
            if snapshot.header.cancel is not None:
                run.request_cancel(snapshot.header.cancel.reason)
            self._active[key] = run
            try:
                return await run.execute()
            finally:
                self._run_ended(key, run)
        except _RUN_OUTCOMES:
            raise
        except BaseException:
            await self._release_quietly(key, worker_id, grant)
            raise

    async def _run_fresh(self, key: str, worker_id: str,
                         fresh: tuple[TaskHeader, tuple[NodeRecord, ...]]) -> TaskResult | None:
        """Run a task this runtime just created, from the state it wrote: no reads, and the
        lease is taken by the first commit. None when the store refused that start (another
        worker got there first): the caller then starts the ordinary way."""
        header, nodes = fresh
        known = self._identities.get(key)
        if known is None or known[0] != header.identity_digest:
            return None
        identity = known[1]
        self._check_descriptors(identity)
        plan = self._compile(identity)
        state = RunState(header=header, nodes={n.node_id: n for n in nodes}, actions={},
                         identity=identity)
        run = TaskRun(self, key, worker_id, header.fence + 1, state, plan,
                      acquire=AcquireLeaseRequest(key=key, worker_id=worker_id,
                                                  ttl_seconds=self.lease_ttl, now=self.clock()))
        self._active[key] = run
        try:
            return await run.execute()
        except FastStartRefused as exc:
            log.debug("task %s: combined lease + first commit refused (%s)", key, exc)
            if run.pending_acquire is None:  # the lease was taken on its own first
                await self._release_quietly(key, worker_id, run.fence)
            return None
        except _RUN_OUTCOMES:
            raise
        except BaseException:
            # Also when the combined acquisition may have landed unanswered: a release
            # under a fence this worker was never granted changes nothing.
            await self._release_quietly(key, worker_id, run.fence)
            raise
        finally:
            self._run_ended(key, run)

    def _run_ended(self, key: str, run: TaskRun) -> None:
        if self._active.get(key) is run:
            del self._active[key]
        admission = run.admission
        if admission.active > 0:
            self._lingering[key] = admission

            def idle() -> None:
                if self._lingering.get(key) is admission:
                    del self._lingering[key]
            admission.on_idle = idle

    def admission_for(self, key: str, capacity: int) -> AdmissionController:
        """The admission controller of a run of ``key`` starting now (on the running loop):
        the one of its last run here while work that run abandoned still holds permits."""
        lingering = self._lingering.pop(key, None)
        if lingering is not None and lingering.active > 0 and lingering.capacity == capacity \
                and lingering.loop is asyncio.get_running_loop():
            lingering.reopen()
            return lingering
        return AdmissionController(key, capacity, self.clock, self.on_admission)

    async def _acquire(self, key: str, worker_id: str, wait: bool,
                       deadline: datetime | None) -> LeaseGrant | None:
        """The lease, waiting for another holder's to end when ``wait``; None when the task
        ended meanwhile. A deadline that passes while waiting ends the wait."""
        while True:
            try:
                return await self.store.acquire_lease(AcquireLeaseRequest(
                    key=key, worker_id=worker_id, ttl_seconds=self.lease_ttl,
                    now=self.clock(), snapshot=True))
            except InvalidTransitionError:
                header = await self.store.get_header(key)
                if header is not None and header.status in TERMINAL_TASK:
                    return None
                raise
            except LeaseHeldError as exc:
                if not wait:
                    raise
                now = self.clock()
                if deadline is not None and now >= deadline:
                    raise DeadlineExceededError(
                        f"task {key!r} passed its deadline {deadline.isoformat()} while "
                        f"waiting for worker {exc.holder!r}'s lease; recovery never extends "
                        "a deadline, so create a new task to retry",
                        details={"deadline": deadline.isoformat()}) from None
                delay = (exc.expires_at - now).total_seconds()
                if deadline is not None:
                    delay = min(delay, (deadline - now).total_seconds())
                await asyncio.sleep(min(max(delay, 0.01), self.poll_interval))

    async def _release_if_ours(self, key: str, worker_id: str, before: int) -> None:
        """Release the lease ``worker_id`` holds under a fence newer than ``before`` (the
        task's fence before an acquisition whose outcome is unknown), unless a live run of
        this runtime holds it."""
        try:
            now = await self.store.get_header(key)
        except StoreError as exc:
            log.info("task %s: lease not checked (%s); it will expire", key, exc)
            return
        live = self._active.get(key)
        if now is not None and now.lease is not None and now.lease.owner == worker_id and \
                now.fence > before and (live is None or live.fence != now.fence):
            await self._release_quietly(key, worker_id, now.fence)

    async def _release_quietly(self, key: str, worker_id: str, fence: int) -> None:
        """Release a lease after a run that failed; never raises for the store. Bounded:
        after a store outage the store's own retries would add their whole budget again
        to the failed run's, and the lease expires by itself anyway."""
        try:
            async with asyncio.timeout(min(self.lease_ttl, RELEASE_WAIT_S)):
                await self.store.release_lease(ReleaseLeaseRequest(
                    key=key, worker_id=worker_id, fence=fence, now=self.clock()))
        except (StaleFenceError, StoreError, TimeoutError) as exc:
            log.info("task %s: lease not released (%s); it expires within %g s", key,
                     exc or "the store did not answer in time", self.lease_ttl)

    def nested_plan(self, binding: GraphBinding | RepeatBinding,
                    grants: tuple[str, ...] | None) -> CompiledPlan:
        """The compiled program of a graph/repeat binding (validated once, then cached)."""
        key = (binding.id, binding.version, grants)
        plan = self._nested.get(key)
        if plan is None:
            nested = binding.program.checked_plan()
            assert nested is not None
            plan = validate_plan(nested, self.catalog,
                                 limits=binding.program.limits, grants=grants,
                                 subject=f"program of {binding.kind} binding {binding.id!r}")
            self._nested[key] = plan
        return plan

    def limits_for(self, identity: TaskIdentity) -> RootLimits:
        """The root limits the task pinned at create (one object per distinct value)."""
        return self._pinned_limits(RootLimits, identity.root_limits)

    # --- sync wrappers --------------------------------------------------------------
    def create_sync(self, key: str, program: ExecutionGraphProgram, **kw: Any) -> TaskView:
        return run_sync(self.create(key, program, **kw))

    def run_sync(self, key: str, worker_id: str = "worker", *, wait: bool = False) -> TaskResult:
        """``run`` for code without an event loop (it runs one); not from inside a loop."""
        return run_sync(self.run(key, worker_id, wait=wait))


    # --- helpers --------------------------------------------------------------------
    async def _pinned_identity(self, header: TaskHeader) -> TaskIdentity:
        """The task's identity: remembered from create/run when its digest still matches
        the header's, else read from the store, checked against the header's digest (a
        run follows its plan, descriptors and input) and remembered."""
        known = self._identities.get(header.key)
        if known is not None and known[0] == header.identity_digest:
            return known[1]
        identity = await verified_identity(self.store, header.key, header.identity_digest)
        self._remember_identity(header.identity_digest, identity)
        return identity

    def _remember_identity(self, identity_digest: str, identity: TaskIdentity) -> None:
        if len(self._identities) >= _REMEMBERED_TASKS and identity.key not in self._identities:
            self._identities.pop(next(iter(self._identities)))
        self._identities[identity.key] = (identity_digest, identity)

    def _remember_fresh(self, key: str, header: TaskHeader,
                        nodes: tuple[NodeRecord, ...]) -> None:
        self._forget_fresh(key)
        if len(nodes) > _REMEMBERED_NODES:
            return
        while self._fresh and (len(self._fresh) >= _REMEMBERED_TASKS or
                               self._fresh_nodes + len(nodes) > _REMEMBERED_NODES):
            self._forget_fresh(next(iter(self._fresh)))
        self._fresh[key] = (header, nodes)
        self._fresh_nodes += len(nodes)

    def _forget_fresh(self, key: str) -> tuple[TaskHeader, tuple[NodeRecord, ...]] | None:
        """Drop what is remembered of ``key`` and return it (None if nothing was)."""
        dropped = self._fresh.pop(key, None)
        if dropped is not None:
            self._fresh_nodes -= len(dropped[1])
        return dropped

    def _check_descriptors(self, identity: TaskIdentity, only: set[str] | None = None) -> None:
        for name, pinned in sorted(identity.descriptors.items()):
            if only is not None and name not in only:
                continue
            binding_id, _, version = name.rpartition("@")
            same = self.catalog.pins_same_descriptor(binding_id, version, pinned)
            if same is None:
                raise DescriptorMismatchError(
                    f"task {identity.key!r} pinned binding {binding_id!r} version "
                    f"{version!r}, which this catalog no longer registers; register it again "
                    "to recover the task", details={"binding": binding_id, "version": version})
            if not same:
                raise DescriptorMismatchError(
                    f"task {identity.key!r} pinned a different descriptor for binding "
                    f"{binding_id!r} version {version!r}; behavior changes need a new version, "
                    "so restore the original binding to recover this task",
                    details={"binding": binding_id, "version": version})

    def _compile(self, identity: TaskIdentity) -> CompiledPlan:
        assert identity.plan is not None
        return self.compile_plan(identity.plan,
                                 self._pinned_limits(PlanLimits, identity.plan_limits),
                                 identity.grants, str(identity.program.get("plan_digest")))

    def _pinned_limits(self, cls: type[L], pinned: dict[str, int]) -> L:
        """``cls(**pinned)``, made once per distinct pinned value (tasks of one program pin
        the same limits; validating them again on every run is wasted work)."""
        key = (cls, tuple(sorted(pinned.items())))
        made = self._limits_made.get(key)
        if made is None:
            made = cls(**pinned)
            if len(self._limits_made) >= 256:
                self._limits_made.pop(next(iter(self._limits_made)))
            self._limits_made[key] = made
        assert isinstance(made, cls)
        return made

    def compile_plan(self, plan: dict[str, Any], limits: PlanLimits, grants: tuple[str, ...] | None,
              plan_digest: str) -> CompiledPlan:
        """Validate and compile a plan once per (plan, limits, grants); runs reuse it."""
        key = (plan_digest, limits, grants)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = validate_plan(plan, self.catalog, limits=limits, grants=grants)
            if len(self._compiled) >= 256:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = compiled
        return compiled

    async def _load_outputs(self, snapshot: TaskSnapshot) -> dict[str, Any]:
        wanted: dict[str, str] = {n.node_id: n.output_digest for n in snapshot.nodes.values()
                                  if n.state == "completed" and n.output_digest}
        for node_id, rec in sorted(snapshot.nodes.items()):
            if rec.state == "completed" and not rec.output_digest:
                # A store refuses such a completion: its dependents would read no output.
                raise DataIntegrityError(
                    f"task {snapshot.header.key!r}: node {node_id!r} is completed but its "
                    "stored record has no output digest; the store was damaged, restore it "
                    "from a backup", node_id=node_id, details={"problem": "no_output_digest"})
        blobs = await read_verified(self.store, wanted.values())
        outputs: dict[str, Any] = {}
        for node_id, want in sorted(wanted.items()):
            problem = blobs.problem(want)
            if problem is not None:
                raise DataIntegrityError(
                    f"task {snapshot.header.key!r}: the stored output of node {node_id!r} is "
                    f"{problem} (blob {want}); the store was damaged, restore it from a backup",
                    node_id=node_id, details={"blob": want, "problem": problem})
            outputs[node_id] = json.loads(blobs.texts[want])
        return outputs

    async def _retained_result(self, key: str) -> TaskResult:
        snapshot = await self.store.get_task(key)
        assert snapshot is not None
        outputs = await self._load_outputs(snapshot)
        # In node-id order, as a live run returns it: the same on every store and run.
        top = {n: outputs[n] for n, rec in sorted(snapshot.nodes.items())
               if rec.parent is None and n in outputs}
        return TaskResult(key=key, status="completed", output=top,
                          revision=snapshot.header.revision,
                          counters=dict(snapshot.header.counters))

