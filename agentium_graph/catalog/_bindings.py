"""Bindings: the versioned, host-owned executable behavior a plan may select."""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from jsonschema.exceptions import ValidationError as SchemaViolation
from jsonschema.protocols import Validator
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from agentium_graph._canonical import NotJSONError, check_json, json_copy
from agentium_graph._config_base import keywords_only, storable_text
from agentium_graph._fastschema import Predicate, compile_fast
from agentium_graph._program import ExecutionGraphProgram
from agentium_graph._schemarefs import checked_validator
from agentium_graph.errors import (
    ConfigurationError,
    bool_only,
    config_error,
    int_only,
    positional,
)
from agentium_graph.providers._protocol import shape_problem

if TYPE_CHECKING:
    from agentium_graph.connectors import DurableActionConnector

JSONSchema = dict[str, Any]
ANY_SCHEMA: JSONSchema = {}

BindingKind = Literal["tool", "agent", "graph", "repeat"]


class BindingDescriptor(BaseModel):
    """What a task pins about a binding: everything but the code, attested by version."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: BindingKind
    id: str
    version: str
    input_schema: JSONSchema
    output_schema: JSONSchema
    recovery: str | None = None
    destination: str | None = None
    connector_id: str | None = None
    connector_version: str | None = None
    idempotent_destination: bool | None = None
    reference_inputs: tuple[str, ...] = ()
    reference_outputs: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    program: dict[str, Any] | None = None
    max_iterations: int | None = None
    extra: dict[str, Any] = {}


def _compile(schema: Mapping[str, Any], where: str) -> tuple[Validator, Predicate | None]:
    """Check ``schema`` once and build its validator (the ``$schema`` draft, default 2020-12)
    plus, when the schema allows it, the compiled fast-path predicate of :mod:`_fastschema`
    that spares the hot path jsonschema's cost for values it proves valid."""
    try:
        check_json(schema)
    except NotJSONError as exc:
        raise ConfigurationError(f"{where} is not JSON data ({exc}); use plain JSON values") \
            from None
    own = copy.deepcopy(dict(schema))
    # The validator owns a private copy, so nothing outside can change what it checks.
    cls, validator = checked_validator(own, where)
    # Built from the validator's own copy and format checker, so both decide alike (an
    # unknown checker counts as asserting, which leaves "format" to jsonschema).
    checker = getattr(validator, "format_checker", validator)
    return validator, compile_fast(own, cls, format_checker=checker)


def _errors(validator: Validator, value: Any) -> list[SchemaViolation]:
    try:
        return sorted(validator.iter_errors(value), key=_path_key)
    except RecursionError:
        # A recursive schema checks each level of the value through several frames, so
        # data within the JSON nesting bound can still exhaust Python's stack.
        return [SchemaViolation(
            "the value nests too deeply to be checked against this recursive schema; send "
            "flatter data")]


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` gives an awaitable by declaration: an ``async def`` function
    or method (also through ``functools.partial``), or an object with ``async def
    __call__``."""
    if inspect.iscoroutinefunction(fn):
        return True
    if not callable(fn) or inspect.isroutine(fn) or isinstance(fn, type):
        return False
    return inspect.iscoroutinefunction(type(fn).__call__)  # a callable object


def _path_key(error: SchemaViolation) -> list[str | int]:
    return list(error.absolute_path)


class _BindingBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    id: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+$")
    version: str = Field(min_length=1, max_length=100)
    input_schema: JSONSchema = Field(default_factory=dict)
    output_schema: JSONSchema = Field(default_factory=dict)
    description: str = ""
    reference_inputs: tuple[str, ...] = ()
    reference_outputs: tuple[str, ...] = ()
    validate_template: Callable[[dict[str, Any]], None] | None = None

    _input_validator: Validator = PrivateAttr()
    _output_validator: Validator = PrivateAttr()
    _input_fast: Predicate | None = PrivateAttr(default=None)
    _output_fast: Predicate | None = PrivateAttr(default=None)
    _descriptor: BindingDescriptor | None = PrivateAttr(default=None)

    def __init__(self, /, *args: Any, **data: Any) -> None:
        if args:
            raise ConfigurationError(keywords_only(type(self), len(args)))
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(type(self).__name__, data, exc) from None

    @model_validator(mode="before")
    @classmethod
    def _copy_schemas(cls, data: Any) -> Any:
        # Schemas are deep-copied so a host mutating its dict later cannot change a binding.
        if isinstance(data, dict):
            data = dict(data)
            for name in ("input_schema", "output_schema"):
                if isinstance(data.get(name), Mapping):
                    # Too deep to copy is too deep to be JSON: _compile says so, with where.
                    with contextlib.suppress(RecursionError):
                        data[name] = copy.deepcopy(dict(data[name]))
        return data

    @field_validator("description", "reference_inputs", "reference_outputs")
    @classmethod
    def _storable(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        return storable_text(value)

    @field_validator("validate_template")
    @classmethod
    def _sync_template_check(cls, fn: Callable[[dict[str, Any]], None] | None
                             ) -> Callable[[dict[str, Any]], None] | None:
        # Called without await while a plan is validated: an async check would be a
        # coroutine dropped unseen, and every template would pass.
        if fn is not None and (is_async_callable(fn) or inspect.isasyncgenfunction(fn)):
            raise ValueError("validate_template is an async function; it must be a plain "
                             "'def validate_template(args) -> None' that raises to reject")
        return fn

    def model_post_init(self, context: Any, /) -> None:
        self._input_validator, self._input_fast = _compile(
            self.input_schema, f"binding {self.id!r} input_schema")
        self._output_validator, self._output_fast = _compile(
            self.output_schema, f"binding {self.id!r} output_schema")

    @property
    def input_validator(self) -> Validator:
        return self._input_validator

    @property
    def output_validator(self) -> Validator:
        return self._output_validator

    # These two run per node. They read pydantic's private-value dict directly (as
    # BaseModel.__getattr__ itself does; it is never None once private attributes are set):
    # a plain ``self._input_fast`` goes through __getattr__ and costs more than the check.

    def input_errors(self, value: Any) -> list[SchemaViolation]:
        """The input schema's errors for ``value``, ordered by instance path; ``[]`` at
        once when the compiled fast path proves it valid (jsonschema decides otherwise)."""
        private: dict[str, Any] = self.__pydantic_private__  # type: ignore[assignment]
        fast: Predicate | None = private["_input_fast"]
        if fast is not None and fast(value):
            return []
        return _errors(private["_input_validator"], value)

    def output_errors(self, value: Any) -> list[SchemaViolation]:
        """As :meth:`input_errors`, for the output schema."""
        private: dict[str, Any] = self.__pydantic_private__  # type: ignore[assignment]
        fast: Predicate | None = private["_output_fast"]
        if fast is not None and fast(value):
            return []
        return _errors(private["_output_validator"], value)

    kind: ClassVar[BindingKind]  # each binding class sets its own kind

    def descriptor(self) -> BindingDescriptor:
        """What a task pins, computed once (from JSON copies), so the catalog's digest and
        a task's pinned descriptors cannot drift apart if a schema dict is mutated later."""
        if self._descriptor is None:
            self._descriptor = BindingDescriptor.model_validate(json_copy(BindingDescriptor(
                kind=self.kind, id=self.id, version=self.version,
                input_schema=self.input_schema, output_schema=self.output_schema,
                reference_inputs=self.reference_inputs,
                reference_outputs=self.reference_outputs,
                **self._descriptor_extra()).model_dump(mode="json")))
        return self._descriptor

    def _descriptor_extra(self) -> dict[str, Any]:
        return {}


class ToolBinding(_BindingBase):
    """A tool: either a pure callback (``recovery="pure"``) or an effect routed through a
    :class:`~agentium_graph.DurableActionConnector` to a host-bound ``destination``.

    ``execute`` receives the validated args dict as its one positional argument and may be
    sync or async. Sync callbacks run in a worker thread unless ``run_in_thread=False``.
    """

    execute: Callable[[dict[str, Any]], Any] | None = None
    recovery: Literal["pure"] | None = None
    connector: Any = None  # DurableActionConnector; typed loosely so pydantic accepts protocols
    destination: str | None = None
    run_in_thread: bool = True

    @field_validator("run_in_thread", mode="before")
    @classmethod
    def _bools_only(cls, value: Any) -> Any:
        return bool_only(value)  # not 1, 0 or "false" (pydantic's lax mode takes those)

    @model_validator(mode="after")
    def _check_recovery(self) -> ToolBinding:
        if self.connector is None:
            if self.recovery != "pure":
                raise ValueError(
                    f"tool {self.id!r} must declare recovery='pure' (the host asserts it makes "
                    "no external change) or route its effect through connector=... with "
                    "destination=...")
            if self.execute is None:
                raise ValueError(f"pure tool {self.id!r} needs execute=callable")
            if self.destination is not None:
                raise ValueError(f"tool {self.id!r}: destination= needs connector=")
        else:
            if self.recovery == "pure":
                raise ValueError(f"tool {self.id!r}: a connector-backed tool is not pure; "
                                 "drop recovery='pure'")
            if not self.destination:
                raise ValueError(f"tool {self.id!r}: connector= needs a host-bound "
                                 "destination='...'")
            if isinstance(self.connector, type):
                # The class has every attribute, and its methods are plain functions, so
                # each dispatch would fail for want of ``self`` and the effect end uncertain.
                raise ValueError(
                    f"tool {self.id!r}: connector {self.connector.__name__} is a class; pass "
                    f"an instance of it (connector={self.connector.__name__}(...))")
            for attr in ("id", "version", "idempotent_destination", "dispatch",
                         "resolve_result"):
                if not hasattr(self.connector, attr):
                    raise ValueError(f"tool {self.id!r}: connector lacks {attr!r}; it must "
                                     "implement DurableActionConnector")
            for attr in ("id", "version"):
                value = getattr(self.connector, attr)
                if not isinstance(value, str) or not value:
                    raise ValueError(f"tool {self.id!r}: connector {attr} must be a non-empty "
                                     f"string, not {value!r}")
            flag = self.connector.idempotent_destination
            if not isinstance(flag, bool):
                # Tested for truth when an effect's outcome is unknown: a string "false"
                # would be true, and the effect dispatched again to a destination that does
                # not deduplicate.
                raise ValueError(
                    f"tool {self.id!r}: connector {self.connector.id!r} has "
                    f"idempotent_destination={flag!r} ({type(flag).__name__}); it must be "
                    "True or False (convert a setting read from text, e.g. == 'true')")
            for method in ("dispatch", "resolve_result"):
                # The runtime awaits both: a plain def would run the effect and then fail
                # the node (after the fact) instead of being refused here.
                if not is_async_callable(getattr(self.connector, method)):
                    raise ValueError(
                        f"tool {self.id!r}: connector {getattr(self.connector, 'id', None)!r} "
                        f"({type(self.connector).__name__}) has a {method} that is not a "
                        f"coroutine function; declare it 'async def {method}(...)' as "
                        "DurableActionConnector requires")
            if self.execute is not None:
                raise ValueError(f"tool {self.id!r}: effects go through the connector; "
                                 "an execute= callback cannot be combined with connector=")
        return self

    kind: ClassVar[BindingKind] = "tool"

    @property
    def typed_connector(self) -> DurableActionConnector:
        return self.connector  # type: ignore[no-any-return]

    def _descriptor_extra(self) -> dict[str, Any]:
        if self.connector is None:
            return {"recovery": "pure"}
        return {"recovery": "connector", "destination": self.destination,
                "connector_id": str(self.connector.id),
                "connector_version": str(self.connector.version),
                "idempotent_destination": bool(self.connector.idempotent_destination)}


class Agent(BaseModel):
    """A restricted, stateless agent: a provider, host instructions and catalog tool ids.

    Opaque features that cannot be recovered (result caches, dynamic tool resolvers,
    handoffs, mutable memory, hooks) are rejected when the catalog is built.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    provider: Any
    instructions: str
    tools: tuple[str, ...] = ()
    name: str = "agent"
    max_turns: int = Field(default=8, ge=1, le=256)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    max_tool_errors: int = Field(default=0, ge=0, le=256)
    result_cache: Any = None
    tool_resolver: Any = None
    handoffs: tuple[Any, ...] = ()
    memory: Any = None
    hooks: tuple[Any, ...] = ()

    def __init__(self, /, *args: Any, **data: Any) -> None:
        """``Agent(provider, instructions, tools=[...], ...)``: the first three may be
        given by position."""
        positional("Agent", ("provider", "instructions", "tools"), args, data)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error("Agent", data, exc) from None

    @field_validator("max_turns", "max_output_tokens", "max_tool_errors", mode="before")
    @classmethod
    def _ints_only(cls, value: Any) -> Any:
        return int_only(value)  # not True, 2.0 or "3" (pydantic's lax mode takes those)

    @field_validator("stream", mode="before")
    @classmethod
    def _bools_only(cls, value: Any) -> Any:
        return bool_only(value)  # not 1, 0 or "false" (pydantic's lax mode takes those)

    @field_validator("instructions", "name")
    @classmethod
    def _storable(cls, value: str) -> str:
        return storable_text(value)

    @model_validator(mode="after")
    def _reject_opaque(self) -> Agent:
        for name in ("result_cache", "tool_resolver", "memory"):
            if getattr(self, name) is not None:
                raise ValueError(f"agent {self.name!r}: {name} is opaque state that a "
                                 "durable graph cannot recover; remove it and keep such "
                                 "state outside the graph")
        for name in ("handoffs", "hooks"):
            if getattr(self, name):
                raise ValueError(f"agent {self.name!r}: {name} are not supported in durable "
                                 "graphs; remove them")
        # As PlannerConfig does: the method the agent will call must exist (and be of the
        # right kind) now, not fail the node at run time.
        problem = shape_problem(self.provider, stream=self.stream)
        if problem is not None:
            raise ValueError(f"{problem}; stream={self.stream} needs a ModelProvider (e.g. "
                             "agentium_graph.providers.ScriptedProvider, or an object with "
                             "async complete() and stream())")
        # The provider's id and version say which model answered: part of what a recorded
        # response means, as for a planner.
        for attr in ("id", "version"):
            value = getattr(self.provider, attr, None)
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"provider {type(self.provider).__name__} needs a non-empty string "
                    f"{attr!r} (it has {value!r}): it names the model whose answers an agent "
                    "conversation records; give the provider one")
        return self


class AgentBinding(_BindingBase):
    """A model-calling agent node; output ``{"text": str, "usage": {...}}``."""

    agent: Agent

    kind: ClassVar[BindingKind] = "agent"

    def _descriptor_extra(self) -> dict[str, Any]:
        return {"tools": tuple(self.agent.tools),
                "extra": {"instructions": self.agent.instructions, "name": self.agent.name,
                          "max_turns": self.agent.max_turns,
                          "max_output_tokens": self.agent.max_output_tokens,
                          "stream": self.agent.stream,
                          # Only when set: descriptors pinned before it existed stay equal.
                          **({"max_tool_errors": self.agent.max_tool_errors}
                             if self.agent.max_tool_errors else {})}}


def _nodes_to_run(program: ExecutionGraphProgram) -> None:
    """A container's program must run something: an empty one settled at once, and could
    not be told apart from one not yet entered when a crashed run was recovered."""
    plan = program.plan
    if isinstance(plan, dict) and isinstance(plan.get("nodes"), list) and not plan["nodes"]:
        raise ValueError(f"program {program.id!r} has no nodes; a nested graph or repeat "
                         "must run at least one node (drop the node that uses it instead)")


def _with_program_input(binding: GraphBinding | RepeatBinding,
                        errors: list[SchemaViolation], value: Any) -> list[SchemaViolation]:
    """``errors`` and those of the nested program's own ``input_schema`` (its ``$input``)."""
    validator = binding.program.input_validator
    if validator is None:
        return errors
    return sorted([*errors, *_errors(validator, value)], key=_path_key)


def program_only(value: Any) -> Any:
    """A plan dict given as a nested program: pydantic would try to build the program from
    it and fail as 'invalid ExecutionGraphProgram: id: Field required; schemaVersion: Extra
    inputs...', naming neither the binding nor the field."""
    if isinstance(value, dict) and ("nodes" in value or "schemaVersion" in value) and \
            "plan" not in value:
        raise ValueError("must be an ExecutionGraphProgram(id=..., version=..., plan={...}), "
                         "not a plan dict (the plan goes in the program's plan=)")
    return value


class GraphBinding(_BindingBase):
    """A nested program; output is the map of its node ids to their outputs.

    The args are the program's ``$input``: they must satisfy the binding's
    ``input_schema`` and the program's own, when it has one."""

    program: ExecutionGraphProgram

    kind: ClassVar[BindingKind] = "graph"

    def input_errors(self, value: Any) -> list[SchemaViolation]:
        return _with_program_input(self, super().input_errors(value), value)

    @field_validator("program", mode="before")
    @classmethod
    def _a_program(cls, value: Any) -> Any:
        return program_only(value)

    @model_validator(mode="after")
    def _not_empty(self) -> GraphBinding:
        _nodes_to_run(self.program)
        return self

    def _descriptor_extra(self) -> dict[str, Any]:
        return {"program": self.program.descriptor()}


class RepeatBinding(_BindingBase):
    """A bounded loop of a nested program guarded by a pure ``condition`` callable; its args
    are every iteration's ``$input`` (checked as :class:`GraphBinding`'s are)."""

    program: ExecutionGraphProgram
    max_iterations: int = Field(ge=1, le=10_000)
    condition: Callable[..., bool]

    def input_errors(self, value: Any) -> list[SchemaViolation]:
        return _with_program_input(self, super().input_errors(value), value)

    kind: ClassVar[BindingKind] = "repeat"

    def __init__(self, /, *args: Any, **data: Any) -> None:
        """``RepeatBinding(program, max_iterations, condition=..., id=..., version=...)``."""
        super().__init__(**positional("RepeatBinding", ("program", "max_iterations"), args,
                                      data))

    @field_validator("program", mode="before")
    @classmethod
    def _a_program(cls, value: Any) -> Any:
        return program_only(value)

    @field_validator("max_iterations", mode="before")
    @classmethod
    def _ints_only(cls, value: Any) -> Any:
        return int_only(value)  # not True, 2.0 or "3" (pydantic's lax mode takes those)

    @model_validator(mode="after")
    def _not_empty(self) -> RepeatBinding:
        _nodes_to_run(self.program)
        return self

    @model_validator(mode="after")
    def _sync_condition(self) -> RepeatBinding:
        # An async condition's coroutine would never be awaited and would count as true.
        if is_async_callable(self.condition) or \
                inspect.isasyncgenfunction(self.condition):
            raise ValueError(
                "condition is an async function; the guard must be a "
                "plain, pure 'def condition(...) -> bool' (do async work in a node of the "
                "repeated program instead)")
        try:
            # The callable as it is called: a functools.wraps wrapper, not what it wraps.
            signature = inspect.signature(self.condition, follow_wrapped=False)
        except (TypeError, ValueError):  # a builtin without one: called as it is
            return self
        try:
            signature.bind({})
        except TypeError:
            # Found here, not after iteration 0 has spent its tool calls and expansion.
            raise ValueError(
                f"condition {getattr(self.condition, '__name__', self.condition)!r} cannot "
                f"be called with one positional argument (its signature is {signature}); "
                "the guard is called as condition(state), state a dict with 'iteration', "
                "'outputs' (the iteration's node outputs) and 'input'") from None
        return self

    def _descriptor_extra(self) -> dict[str, Any]:
        return {"program": self.program.descriptor(), "max_iterations": self.max_iterations}


Binding = ToolBinding | AgentBinding | GraphBinding | RepeatBinding
BINDING_TYPES: Sequence[type[_BindingBase]] = (ToolBinding, AgentBinding, GraphBinding,
                                               RepeatBinding)
