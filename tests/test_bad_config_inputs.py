"""Bad configuration and arguments: every one is a ConfigurationError naming what is wrong.

Never a raw TypeError, AttributeError or pydantic ValidationError: each case below used to
leak one (or to be accepted and fail later, at run time).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from agentium_graph import (
    Absent,
    ActionOutcome,
    ActionRequest,
    Agent,
    AgentBinding,
    Budgets,
    ConfigurationError,
    DurableRecoveryRequiredError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    PlanLimits,
    PlannerConfig,
    RepeatBinding,
    RootLimits,
    StoreCapabilities,
    StreamLimits,
    TaskCanceledError,
    ToolBinding,
    Unknown,
)
from agentium_graph.providers import ScriptedProvider
from tests.conftest import Calls, chain_plan, make_catalog, program


def _runtime(**kw: Any) -> ExecutionGraphRuntime:
    return ExecutionGraphRuntime(catalog=make_catalog(Calls()), **kw)


def _config_error(exc: pytest.ExceptionInfo[ConfigurationError]) -> str:
    # The error is ours, and no pydantic / Python error hides behind it.
    assert type(exc.value) is ConfigurationError
    assert not isinstance(exc.value.__cause__, ValidationError | TypeError | AttributeError)
    return str(exc.value)


# --- 1. runtime constructor and create() arguments ----------------------------------------

@pytest.mark.parametrize("grants", [5, 1.5, object()])
async def test_create_refuses_grants_that_are_not_a_list(grants: Any) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(1)), grants=grants)
    message = _config_error(info)
    assert "grants" in message and "list of binding ids" in message


async def test_create_refuses_a_bare_string_of_grants() -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(1)), grants="inc")
    message = _config_error(info)
    assert "grants" in message and "list of binding ids" in message
    assert "['inc']" in message  # says what to pass instead


@pytest.mark.parametrize("grants", [[1, "a"], [["x"]], ["inc", None], ["inc", ""]])
async def test_create_refuses_grants_that_are_not_binding_ids(grants: Any) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(1)), grants=grants)
    message = _config_error(info)
    assert "grants" in message and "non-empty string" in message


async def test_create_accepts_grants_from_any_iterable_of_ids() -> None:
    rt = _runtime()
    view = await rt.create("k", program(chain_plan(1)), grants=(g for g in ["inc", "inc"]))
    assert view.status == "pending"
    assert (await rt.run("k")).output["n0"] == {"value": 1}


@pytest.mark.parametrize("budgets", [5, "tool_calls=1", RootLimits()])
async def test_create_refuses_budgets_of_the_wrong_type(budgets: Any) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(1)), budgets=budgets)
    message = _config_error(info)
    assert "budgets" in message and "Budgets(" in message


async def test_create_accepts_budgets_as_a_dict_and_validates_it() -> None:
    rt = _runtime()
    view = await rt.create("k", program(chain_plan(1)), budgets={"tool_calls": 1})
    assert view.limits["tool_calls"] == 1
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k2", program(chain_plan(1)), budgets={"tool_calls": -1})
    assert "tool_calls" in _config_error(info)
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k3", program(chain_plan(1)), budgets={"tools": 1})
    assert "tools" in _config_error(info)


@pytest.mark.parametrize("limits", [5, Budgets(), "max_concurrent_work=1"])
async def test_create_refuses_limits_of_the_wrong_type(limits: Any) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(1)), limits=limits)
    message = _config_error(info)
    assert "limits" in message and "RootLimits(" in message


async def test_create_and_constructor_accept_limits_as_a_dict() -> None:
    rt = _runtime(limits={"max_expanded_nodes": 5})
    assert rt.limits == RootLimits(max_expanded_nodes=5)
    view = await rt.create("k", program(chain_plan(2)), limits={"max_work_attempts": 7})
    assert view.limits["work_attempts"] == 7
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k2", program(chain_plan(1)), limits={"max_concurrent_work": 0})
    assert "max_concurrent_work" in _config_error(info)


@pytest.mark.parametrize("limits", [5, Budgets(), {"max_concurrent_work": 0}, {"nope": 1}])
def test_constructor_refuses_bad_limits_at_once(limits: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _runtime(limits=limits)
    assert "limits" in _config_error(info) or "max_concurrent_work" in str(info.value)


@pytest.mark.parametrize("revision", [2, 2.0, b"2", ["2"], ""])
async def test_create_refuses_a_policy_revision_that_is_not_a_string(revision: Any) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError) as info:
        await rt.create("k", program(chain_plan(1)), policy_revision=revision)
    message = _config_error(info)
    assert "policy_revision" in message and "non-empty string" in message


@pytest.mark.parametrize("revision", [2, None, ""])
def test_constructor_refuses_a_policy_revision_that_is_not_a_string(revision: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _runtime(policy_revision=revision)
    assert "policy_revision" in _config_error(info)


@pytest.mark.parametrize("store", [object(), "memory", InMemoryDurableTaskStore])
def test_constructor_refuses_a_store_that_is_not_a_durable_task_store(store: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _runtime(store=store)
    message = _config_error(info)
    assert "store" in message and "DurableTaskStore" in message


@pytest.mark.parametrize(("name", "value"), [
    ("lease_ttl", "10"), ("lease_ttl", True), ("poll_interval", None),
    ("effect_timeout", "1"), ("lookup_timeout", [1]), ("lookup_attempts", 2.5),
    ("lookup_attempts", "3"), ("clock", 5), ("on_admission", "print"), ("programs", 5),
    ("require_durable", "no"),
])
def test_constructor_refuses_mistyped_arguments(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _runtime(**{name: value})
    assert name in _config_error(info)


@pytest.mark.parametrize("deadline", [timedelta(days=3_000_000), timedelta.max])
async def test_create_refuses_a_relative_deadline_beyond_year_9999(deadline: Any) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError, match="after the year 9999"):
        await rt.create("k", program(chain_plan(1)), deadline=deadline)
    assert await rt.store.get_header("k") is None  # nothing stored


@pytest.mark.parametrize("limit", [None, 2.5, "10", True, 0, 1001])
async def test_timeline_refuses_a_limit_that_is_not_an_int_in_range(limit: Any) -> None:
    rt = _runtime()
    await rt.create("k", program(chain_plan(1)))
    with pytest.raises(ConfigurationError, match="limit must be an int between 1 and 1000"):
        await rt.timeline("k", limit=limit)


async def _async_observer(event: Any) -> None:
    return None


class _AsyncClock:
    async def __call__(self) -> Any:
        return None


@pytest.mark.parametrize(("name", "value"), [
    ("on_admission", _async_observer), ("clock", _AsyncClock())])
def test_constructor_refuses_async_callbacks_it_would_never_await(name: str,
                                                                   value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _runtime(**{name: value})
    message = _config_error(info)
    assert name in message and "async" in message


def test_a_binding_refuses_an_async_validate_template() -> None:
    async def check(args: Any) -> None:
        raise ValueError("never seen")

    with pytest.raises(ConfigurationError) as info:
        ToolBinding(id="t", version="1", execute=lambda a: a, recovery="pure",
                    validate_template=check)
    message = _config_error(info)
    assert "validate_template" in message and "async" in message and "'t'" in message
    assert ToolBinding(id="t", version="1", execute=lambda a: a, recovery="pure",
                       validate_template=lambda args: None).validate_template is not None


@pytest.mark.parametrize("bindings", [5, None, "abc", {"inc": 1}])
def test_host_catalog_refuses_what_is_not_a_list_of_bindings(bindings: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        HostCatalog(bindings)
    assert "HostCatalog" in _config_error(info) and "list of bindings" in str(info.value)


def test_host_catalog_says_to_wrap_a_single_binding() -> None:
    tool = ToolBinding(id="t", version="1", execute=lambda a: a, recovery="pure")
    with pytest.raises(ConfigurationError) as info:
        HostCatalog(tool)  # type: ignore[arg-type]
    assert "HostCatalog([binding])" in _config_error(info)


# --- 2. public models raise ConfigurationError, not pydantic's ValidationError ------------

@pytest.mark.parametrize(("make", "field"), [
    (lambda: PlanLimits(max_nodes=0), "max_nodes"),
    (lambda: PlanLimits(foo=1), "foo"),
    (lambda: PlanLimits(max_bytes="big"), "max_bytes"),
    (lambda: StreamLimits(max_frames=0), "max_frames"),
    (lambda: StreamLimits(bar=1), "bar"),
    (lambda: ActionOutcome(output=1), "result_ref"),
    (lambda: ActionOutcome(1, 2), "result_ref"),
    (lambda: ActionOutcome(output=1, result_ref="r", extra=1), "extra"),
    (lambda: Unknown(5), "reason"),
    (lambda: Unknown(reason=None), "reason"),
    (lambda: StoreCapabilities(), "durable"),
    (lambda: StoreCapabilities(durable="maybe"), "durable"),
    (lambda: StoreCapabilities(durable=True, shards=3), "shards"),
])
def test_public_models_raise_configuration_errors(make: Any, field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert field in _config_error(info)


def test_public_models_keep_their_forms_and_nested_validation() -> None:
    assert ActionOutcome({"a": 1}, "ref") == ActionOutcome(output={"a": 1}, result_ref="ref")
    assert Unknown("down").reason == "down" and Unknown().reason == ""
    assert PlanLimits(max_nodes=3).max_nodes == 3
    assert StoreCapabilities(durable=True).durable is True
    assert StreamLimits(max_frames=2).max_frames == 2
    # Limits given as dicts inside a program are validated (and wrapped) by the program.
    prog = ExecutionGraphProgram(id="p", version="1", plan=chain_plan(1),
                                 limits={"max_nodes": 4})
    assert prog.limits == PlanLimits(max_nodes=4)
    with pytest.raises(ConfigurationError, match="max_nodes"):
        ExecutionGraphProgram(id="p", version="1", plan=chain_plan(1), limits={"max_nodes": 0})
    # Limits stay hashable (compiled plans are cached by them).
    assert hash(PlanLimits()) == hash(PlanLimits())


# --- 3. Agent checks its provider at construction ----------------------------------------

@pytest.mark.parametrize("provider", [None, object(), "scripted"])
def test_agent_refuses_an_object_that_is_not_a_model_provider(provider: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        Agent(provider=provider, instructions="hi", name="helper")
    message = _config_error(info)
    assert "provider" in message and "complete()" in message and "'helper'" in message


def test_a_streaming_agent_needs_a_provider_with_stream() -> None:
    class CompleteOnly:
        id, version = "c", "1"

        async def complete(self, request: Any) -> Any:
            raise AssertionError

    Agent(CompleteOnly(), "hi")
    with pytest.raises(ConfigurationError, match=r"stream\(\)"):
        Agent(CompleteOnly(), "hi", stream=True)
    Agent(ScriptedProvider([]), "hi", stream=True)


# --- 4. RepeatBinding's condition is a plain (sync) callable ------------------------------

def _repeat(condition: Any) -> RepeatBinding:
    inner = ExecutionGraphProgram(id="body", version="1", plan=chain_plan(1))
    return RepeatBinding(inner, 3, id="loop", version="1", condition=condition)


def test_repeat_refuses_an_async_condition() -> None:
    async def again(*_: Any) -> bool:
        return False

    class AsyncCall:
        async def __call__(self, *_: Any) -> bool:
            return False

    for condition in (again, AsyncCall()):
        with pytest.raises(ConfigurationError) as info:
            _repeat(condition)
        message = _config_error(info)
        assert "condition" in message and "'loop'" in message and "async" in message


@pytest.mark.parametrize("condition", [None, True, "x > 1"])
def test_repeat_refuses_a_condition_that_is_not_callable(condition: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        _repeat(condition)
    assert "condition" in _config_error(info)


def test_repeat_accepts_a_sync_condition() -> None:
    class Until:
        def __call__(self, *_: Any) -> bool:
            return False

    assert _repeat(lambda *_: False).max_iterations == 3
    assert _repeat(Until()).kind == "repeat"


# --- 5. connectors must have async dispatch and resolve_result ----------------------------

class _Connector:
    id = "sync-pay"
    version = "1"
    idempotent_destination = False

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        return ActionOutcome(output={}, result_ref=request.result_ref)

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        return Absent()


class _SyncDispatch(_Connector):
    def dispatch(self, request: ActionRequest) -> ActionOutcome:  # type: ignore[override]
        return ActionOutcome(output={}, result_ref=request.result_ref)


class _SyncResolve(_Connector):
    def resolve_result(self, result_ref: str) -> Absent:  # type: ignore[override]
        return Absent()


class _NotCallable(_Connector):
    dispatch = None  # type: ignore[assignment]


@pytest.mark.parametrize(("connector", "method"), [
    (_SyncDispatch(), "dispatch"), (_SyncResolve(), "resolve_result"),
    (_NotCallable(), "dispatch"),
])
def test_connector_methods_must_be_coroutine_functions(connector: Any, method: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ToolBinding(id="pay", version="1", connector=connector, destination="payments")
    message = _config_error(info)
    assert "'sync-pay'" in message and f"{method}" in message and "async def" in message


def test_connector_with_async_methods_is_accepted() -> None:
    tool = ToolBinding(id="pay", version="1", connector=_Connector(), destination="payments")
    assert HostCatalog([tool]).get("pay", "1") is tool


# --- 7. cancel of a task that needs recovery ----------------------------------------------

class _LostReceipt(_Connector):
    """Accepts, then loses the response; lookups cannot tell: the action is uncertain."""

    id = "lossy"

    def __init__(self) -> None:
        self.dispatched = 0
        self.resolved = 0

    async def dispatch(self, request: ActionRequest) -> ActionOutcome:
        self.dispatched += 1
        raise ConnectionResetError("response lost")

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown:
        self.resolved += 1
        return Unknown("lookup service down")


async def test_cancel_of_a_recovery_required_task_cancels_it_at_once() -> None:
    connector = _LostReceipt()
    catalog = HostCatalog([
        ToolBinding(id="pay", version="1", connector=connector, destination="payments"),
        *make_catalog(Calls())])
    rt = ExecutionGraphRuntime(catalog=catalog, lookup_timeout=0.2)
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "charge", "binding": "pay", "version": "1", "args": {}},
        {"id": "after", "binding": "inc", "version": "1", "args": {"x": 1},
         "dependsOn": ["charge"]}]}
    await rt.create("t", program(plan))
    with pytest.raises(DurableRecoveryRequiredError) as info:
        await rt.run("t")
    action_id = info.value.action_ids[0]
    assert (await rt.inspect("t")).status == "recovery_required"
    calls = (connector.dispatched, connector.resolved)

    view = await rt.cancel("t", reason="operator gave up")
    assert view.status == "canceled"
    assert view.cancel is not None and view.cancel.reason == "operator gave up"
    assert view.nodes["charge"].state == "canceled" and view.nodes["after"].state == "canceled"
    # The uncertain action stays uncertain in the ledger: append-only evidence.
    assert [(a.action_id, a.state) for a in view.actions] == [(action_id, "uncertain")]
    assert view.error is not None and view.error.details["uncertain_actions"] == [action_id]
    assert view.lease is None and view.verified
    assert (connector.dispatched, connector.resolved) == calls  # nothing dispatched/looked up
    with pytest.raises(TaskCanceledError, match="operator gave up"):
        await rt.run("t")
    # A second cancel is a no-op that returns the view.
    assert (await rt.cancel("t", reason="again")).status == "canceled"


# --- 6. the HTTP connector's lookup never raises -------------------------------------------

@pytest.mark.parametrize("ref", [None, 5, b"key", ""])
async def test_http_resolve_result_of_a_non_string_is_unknown(ref: Any) -> None:
    from agentium_graph_http import HttpActionConnector

    connector = HttpActionConnector("http://127.0.0.1:9")
    result = await connector.resolve_result(ref)
    assert isinstance(result, Unknown) and "result_ref" in result.reason


def test_planner_config_still_checks_its_provider() -> None:
    # The Agent check mirrors this one; keep both saying the same thing.
    with pytest.raises(ConfigurationError, match=r"complete\(\)"):
        PlannerConfig(provider=object(), host_instructions="x")
    with pytest.raises(ConfigurationError, match=r"complete\(\)"):
        AgentBinding(id="a", version="1", agent=Agent(provider=object(), instructions="x"))


def test_a_model_level_problem_names_the_kind_once() -> None:
    with pytest.raises(ConfigurationError) as info:
        Agent(provider=None, instructions="x")
    message = _config_error(info)
    assert message.startswith("invalid Agent: provider") and "Agent: Agent" not in message


# --- text no store can hold ----------------------------------------------------------------

BAD_TEXT = "x\udcff"  # what undecodable bytes of a command line argument become


async def test_text_that_is_not_unicode_is_refused_by_name() -> None:
    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()))
    await rt.create("k", program(chain_plan(1)))
    for call, what in [
            (lambda: rt.create(BAD_TEXT, program(chain_plan(1))), "task key"),
            (lambda: rt.inspect(BAD_TEXT), "task key"),
            (lambda: rt.timeline(BAD_TEXT), "task key"),
            (lambda: rt.run("k", worker_id=BAD_TEXT), "worker_id"),
            (lambda: rt.cancel("k", reason=BAD_TEXT), "cancel reason"),
            (lambda: rt.resolve_action("k", BAD_TEXT, Absent(), actor="op"), "action_id"),
            (lambda: rt.resolve_action("k", "a", Absent(), actor=BAD_TEXT), "actor")]:
        with pytest.raises(ConfigurationError, match=f"{what} .* not valid Unicode") as info:
            await call()
        _config_error(info)
    view = await rt.inspect("k")
    assert (view.status, view.cancel) == ("pending", None)  # nothing was written


async def test_a_forged_cursor_beyond_any_sequence_is_refused() -> None:
    import base64

    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()))
    await rt.create("k", program(chain_plan(2)))
    await rt.run("k")
    good = (await rt.timeline("k", limit=1)).next_cursor
    assert good is not None
    prefix, tag, seq = base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)).decode() \
        .rsplit(":", 2)
    assert seq == "1"
    forged = base64.urlsafe_b64encode(f"{prefix}:{tag}:{10 ** 20}".encode()).decode()
    with pytest.raises(ConfigurationError, match="invalid timeline cursor"):
        await rt.timeline("k", cursor=forged)


def test_a_store_wrapper_with_the_operations_the_runtime_calls_is_accepted() -> None:
    class Wrapper:  # delegates; no list_tasks, close or async with
        def __init__(self, inner: InMemoryDurableTaskStore) -> None:
            self._inner = inner
            self.capabilities = inner.capabilities

        def __getattr__(self, name: str) -> Any:
            if name in ("list_tasks", "close", "__aenter__", "__aexit__"):
                raise AttributeError(name)
            return getattr(self._inner, name)

    rt = ExecutionGraphRuntime(catalog=make_catalog(Calls()),
                               store=Wrapper(InMemoryDurableTaskStore()))  # type: ignore[arg-type]
    assert rt.store is not None

    class Half:
        capabilities = InMemoryDurableTaskStore().capabilities

        async def commit(self, request: Any) -> Any:
            raise NotImplementedError

    with pytest.raises(ConfigurationError, match=r"lacks create_task\(\), get_header\(\)"):
        ExecutionGraphRuntime(catalog=make_catalog(Calls()), store=Half())  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["a\x00b", "line\nbreak", "tab\there", "\x1b[2Jx", "x\x85",
                                 " ", "\t \n"])
async def test_create_refuses_a_key_with_control_characters_or_only_whitespace(
        key: str) -> None:
    rt = _runtime()
    with pytest.raises(ConfigurationError, match="task key") as info:
        await rt.create(key, program(chain_plan(1)))
    assert "control character" in str(info.value) or "only whitespace" in str(info.value)
    assert await rt.store.get_header(key) is None


async def test_a_key_with_spaces_and_any_language_is_fine() -> None:
    rt = _runtime()
    for key in ("order 42", "заказ-7", "注文/8", " padded "):
        await rt.create(key, program(chain_plan(1)))
        assert (await rt.run(key)).status == "completed"
