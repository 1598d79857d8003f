"""The exception tree of agentium-graph.

Every error the SDK raises on purpose derives from :class:`AgentiumGraphError`, carries a
stable ``code`` string and structured fields, and says what to do next::

    AgentiumGraphError
    ├── ConfigurationError            bad catalog, binding, limits or runtime arguments
    │   └── StoreNotDurableError      require_durable=True with a non-durable store
    ├── PlanValidationError           a plan failed validation; carries every diagnostic
    ├── TaskNotFoundError             no task under that key
    ├── TaskConflictError             create() with different content under an existing key
    ├── DescriptorMismatchError       the catalog no longer matches what the task pinned
    ├── LeaseHeldError                another worker holds the task's lease
    ├── StaleFenceError               a write under a fence that is no longer current
    ├── InvalidTransitionError        a state transition the state machine does not allow
    │   └── ResolutionConflictError   a second, different resolution of the same action
    ├── BudgetExhaustedError          a root limit or budget would be exceeded
    ├── TaskCanceledError             the task was canceled
    ├── DeadlineExceededError         the task's absolute deadline passed
    ├── NestedDispatchError           controlled dispatch attempted from inside a leaf
    ├── NodeFailedError               a node failed; ``cause`` is the journaled ErrorInfo
    │   ├── NodeInputError            resolved args violate the binding's input schema
    │   └── NodeOutputError           output is not JSON or violates the output schema
    ├── DurableRecoveryRequiredError  an effect's outcome is unknown; an operator must resolve it
    ├── DataIntegrityError            stored data failed digest verification
    ├── PlannerFailedError            a planner program's provider failed
    └── StoreError                    a store operation failed
        ├── StoreUnavailableError     transient failure that outlived its bounded retries
        └── StoreSchemaError          the store's data was written by an incompatible schema

Errors that are journaled are stored as :class:`ErrorInfo` data, never as pickles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

__all__ = [
    "AgentiumGraphError",
    "BudgetExhaustedError",
    "ConfigurationError",
    "DataIntegrityError",
    "DeadlineExceededError",
    "DescriptorMismatchError",
    "Diagnostic",
    "DurableRecoveryRequiredError",
    "ErrorInfo",
    "InvalidTransitionError",
    "LeaseHeldError",
    "NestedDispatchError",
    "NodeFailedError",
    "NodeInputError",
    "NodeOutputError",
    "PlanValidationError",
    "ResolutionConflictError",
    "StaleFenceError",
    "StoreError",
    "StoreNotDurableError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "TaskCanceledError",
    "TaskConflictError",
    "TaskNotFoundError",
]


class ErrorInfo(BaseModel):
    """A journaled error: plain data that always serializes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    message: str
    node_id: str | None = None
    details: dict[str, Any] = {}

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str) -> str:
        # Journaled with the node and the task: an exception (or a schema error quoting a
        # huge value) must not turn one failure into megabytes of journal, or exceed what a
        # store can keep in a record.
        return bound_text(valid_text(value), MAX_ERROR_MESSAGE)

    @field_validator("details")
    @classmethod
    def _valid_details(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _valid_strings(value)  # type: ignore[no-any-return]

    @classmethod
    def from_exception(cls, exc: BaseException, *, node_id: str | None = None) -> ErrorInfo:
        if isinstance(exc, AgentiumGraphError):
            return cls(code=exc.code, message=str(exc), node_id=node_id or exc.node_id,
                       details=_safe_details(exc.details))
        return cls(code="tool_error", message=f"{type(exc).__name__}: {exception_text(exc)}",
                   node_id=node_id, details={"exception_type": type(exc).__qualname__})


def exception_text(exc: BaseException) -> str:
    """``str(exc)`` (its class name when empty), or what went wrong when its ``__str__``
    raises: the node fails with the exception it raised, never with the formatting one."""
    try:
        return str(exc) or type(exc).__name__
    except Exception as inner:
        return f"<its str() raised {type(inner).__name__}>"


def described(exc: BaseException) -> str:
    """``"ValueError: text"`` (``"ValueError"`` when it has no text) for messages about a
    host's exception; a ``__str__`` that raises is said, not raised."""
    name = type(exc).__name__
    text = exception_text(exc)
    return name if text == name else f"{name}: {text}"


MAX_ERROR_MESSAGE = 4000   # characters of a journaled error message
MAX_DETAIL_TEXT = 1000     # characters of one text detail
MAX_DETAIL_ITEMS = 100     # items of one list detail


def valid_text(text: str) -> str:
    """``text`` with any lone surrogate written as its escape (``\\udcff``): such strings
    (from ``os.fsdecode`` or ``errors="surrogateescape"``) cannot be encoded as UTF-8, so no
    store could journal an error quoting one."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _valid_strings(value: Any) -> Any:
    """``value`` (JSON-like data) with :func:`valid_text` applied to every string in it."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {_valid_strings(k): _valid_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_valid_strings(v) for v in value]
    return value


def bound_text(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def _safe_details(details: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only JSON-representable detail values, bounded, so an ErrorInfo can always be
    stored."""
    out: dict[str, Any] = {}
    for key, value in details.items():
        if isinstance(value, str):
            out[key] = bound_text(value, MAX_DETAIL_TEXT)
        elif isinstance(value, int | float | bool) or value is None:
            out[key] = value
        elif isinstance(value, list | tuple) and all(
                isinstance(v, str | int | float) for v in value):
            out[key] = [bound_text(v, MAX_DETAIL_TEXT) if isinstance(v, str) else v
                        for v in value[:MAX_DETAIL_ITEMS]]
        else:
            out[key] = bound_text(repr(value), MAX_DETAIL_TEXT)
    return out


class AgentiumGraphError(Exception):
    """Root of every error raised by agentium-graph."""

    code = "agentium_graph_error"

    def __init__(self, message: str, *, node_id: str | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.details: dict[str, Any] = dict(details or {})

    def to_info(self) -> ErrorInfo:
        return ErrorInfo.from_exception(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses' constructors take their fields (key, holder, fence, ...), not the
        # message that Exception keeps in ``args``, so the default reduction (``cls(*args)``)
        # cannot rebuild them: copy, deepcopy and pickle (process pools, task queues) would
        # raise TypeError. Rebuild from the message and the instance's fields instead.
        return (_rebuild_error, (type(self), self.args, self.__dict__))


def _rebuild_error(cls: type[AgentiumGraphError], args: tuple[Any, ...],
                   state: dict[str, Any]) -> AgentiumGraphError:
    """An error equal to the one reduced: its ``args``, fields and class, no ``__init__``."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ConfigurationError(AgentiumGraphError):
    code = "configuration_error"


class StoreNotDurableError(ConfigurationError):
    code = "store_not_durable"


MAX_DIAGNOSTIC_MESSAGE = 1000  # characters of one diagnostic's message


class Diagnostic(BaseModel):
    """One finding of plan validation: where (a JSON path), what (a stable code), and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    code: str
    message: str
    node_id: str | None = None

    @field_validator("message")
    @classmethod
    def _bounded(cls, value: str, info: ValidationInfo) -> str:
        # Journaled with the verdict and fed back to a planner: a schema error quoting a
        # huge rejected value (a 300 KB answer) must not be journaled and billed again. A
        # verdict replayed from the journal (context {"journaled": True}) is kept as it was
        # sent, whatever bound the version that wrote it applied.
        if info.context and info.context.get("journaled"):
            return value
        return bound_text(value, MAX_DIAGNOSTIC_MESSAGE)

    def __str__(self) -> str:
        return f"{self.path}: [{self.code}] {self.message}"


class PlanValidationError(AgentiumGraphError):
    code = "plan_invalid"

    def __init__(self, diagnostics: Sequence[Diagnostic], *, subject: str = "plan",
                 advice: str = "fix every listed problem and submit it again") -> None:
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        lines = "\n".join(f"  - {d}" for d in self.diagnostics)
        super().__init__(
            f"{subject} is invalid ({len(self.diagnostics)} problem(s)); {advice}:\n{lines}",
            details={"codes": [d.code for d in self.diagnostics]},
        )


class TaskNotFoundError(AgentiumGraphError):
    code = "task_not_found"

    def __init__(self, key: str) -> None:
        super().__init__(f"no task with key {key!r}; create it first with runtime.create()",
                         details={"key": key})
        self.key = key


class TaskConflictError(AgentiumGraphError):
    code = "task_conflict"

    def __init__(self, key: str, differing: Sequence[str]) -> None:
        fields = ", ".join(differing) or "identity"
        super().__init__(
            f"task {key!r} already exists with different content ({fields}); use a new key "
            "for a different task or re-send exactly the original request",
            details={"key": key, "differing": list(differing)})
        self.key = key
        self.differing = tuple(differing)


class DescriptorMismatchError(AgentiumGraphError):
    code = "descriptor_mismatch"


class LeaseHeldError(AgentiumGraphError):
    code = "lease_held"

    def __init__(self, key: str, holder: str, expires_at: datetime, *,
                 same_runtime: bool = False) -> None:
        details: dict[str, Any] = {"key": key, "holder": holder,
                                   "expires_at": expires_at.isoformat()}
        if same_runtime:
            details["same_runtime"] = True
            message = (f"task {key!r} is already being run by this runtime (worker {holder!r},"
                       " another run() call); await that call, or call run(..., wait=True) "
                       "to wait for it to end")
        else:
            message = (f"task {key!r} is leased by worker {holder!r} until "
                       f"{expires_at.isoformat()}; retry after that, or call "
                       "run(..., wait=True) to wait for the lease")
        super().__init__(message, details=details)
        self.key = key
        self.holder = holder
        self.expires_at = expires_at
        #: True when the holder is another run() call of the same runtime object.
        self.same_runtime = same_runtime


class StaleFenceError(AgentiumGraphError):
    code = "stale_fence"

    def __init__(self, key: str, fence: int, current: int) -> None:
        why = f"fence {current} is current, so another worker owns the task now" \
            if current != fence else \
            f"the lease of fence {fence} was released (the task ended or its run let it go)"
        super().__init__(
            f"write to task {key!r} under fence {fence} rejected: {why}; stop this worker's run",
            details={"key": key, "fence": fence, "current": current})
        self.key = key
        self.fence = fence
        self.current = current


class InvalidTransitionError(AgentiumGraphError):
    code = "invalid_transition"


class ResolutionConflictError(InvalidTransitionError):
    code = "resolution_conflict"


class BudgetExhaustedError(AgentiumGraphError):
    code = "budget_exhausted"

    def __init__(self, key: str, counter: str, used: int, requested: int, limit: int,
                 *, node_id: str | None = None) -> None:
        super().__init__(
            f"task {key!r}: {counter} would reach {used + requested} but its limit is {limit}; "
            "the work was not dispatched. The task stays pending, but its budgets and "
            "limits are pinned and nothing is refunded, so running it again stops here "
            "again: cancel it, or create a new task with a larger limit (a new task has "
            "action ids of its own: effects this one confirmed would be dispatched again, "
            "see inspect)",
            node_id=node_id,
            details={"key": key, "counter": counter, "used": used, "requested": requested,
                     "limit": limit})
        self.counter = counter
        self.used = used
        self.requested = requested
        self.limit = limit


class TaskCanceledError(AgentiumGraphError):
    code = "task_canceled"


class DeadlineExceededError(AgentiumGraphError):
    code = "deadline_exceeded"


class NestedDispatchError(AgentiumGraphError):
    code = "nested_dispatch"


class NodeFailedError(AgentiumGraphError):
    code = "node_failed"

    def __init__(self, message: str, *, node_id: str | None = None,
                 details: Mapping[str, Any] | None = None,
                 cause: ErrorInfo | None = None) -> None:
        super().__init__(message, node_id=node_id, details=details)
        self.cause = cause


class NodeInputError(NodeFailedError):
    code = "node_input_invalid"


class NodeOutputError(NodeFailedError):
    code = "node_output_invalid"


class DurableRecoveryRequiredError(AgentiumGraphError):
    code = "recovery_required"

    def __init__(self, key: str, action_ids: Sequence[str], reason: str = "") -> None:
        ids = ", ".join(action_ids)
        super().__init__(
            f"task {key!r} cannot continue: the outcome of action(s) {ids} is unknown"
            f"{' (' + reason + ')' if reason else ''}; check the destination and record the "
            "outcome with runtime.resolve_action(key, action_id, outcome_or_Absent, actor=...)",
            details={"key": key, "action_ids": list(action_ids)})
        self.key = key
        self.action_ids = tuple(action_ids)


class DataIntegrityError(AgentiumGraphError):
    code = "data_integrity"


class PlannerFailedError(AgentiumGraphError):
    """A planner program's provider failed (not its proposals: those raise
    :class:`PlanValidationError` once corrections are exhausted)."""

    code = "planner_failed"


class StoreError(AgentiumGraphError):
    code = "store_error"


class StoreUnavailableError(StoreError):
    code = "store_unavailable"


class StoreSchemaError(StoreError):
    code = "store_schema"


def positional(kind: str, names: tuple[str, ...], args: tuple[Any, ...],
               data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the leading positional ``args`` stored under ``names`` (the public
    constructors also take the positional forms the documentation writes)."""
    if len(args) > len(names):
        raise ConfigurationError(f"{kind} takes at most {len(names)} positional arguments "
                                 f"({', '.join(names)}), got {len(args)}")
    for name, value in zip(names, args, strict=False):
        if name in data:
            raise ConfigurationError(f"{kind}: {name} is given both by position and by name")
        data[name] = value
    return data


def config_error(kind: str, data: Mapping[str, Any], exc: ValidationError) -> ConfigurationError:
    """Turn a pydantic validation failure of public config into a ConfigurationError."""
    def one(e: Any) -> str:
        where = ".".join(str(p) for p in e["loc"])
        message: str = e["msg"].removeprefix("Value error, ")
        return f"{where}: {message}" if where else message  # the kind is named once, below

    problems = "; ".join(one(e) for e in exc.errors())
    name = data.get("id") or data.get("name")
    return ConfigurationError(f"invalid {kind}{' ' + repr(name) if name else ''}: {problems}")


def shown(value: object) -> str:
    """A wrong config value for an error message: its type and a bounded repr."""
    return f"{type(value).__name__} {bound_text(repr(value), 40)}"


def int_only(value: Any) -> Any:
    """For a ``mode="before"`` validator of a public int field: ``value`` itself when it is
    an int (or None, which the field's own type accepts or refuses). A bool, a float or a
    string, which pydantic's lax mode would turn into an int (``True`` into 1, ``"3"`` into
    3), raises ValueError saying what it is: config errs loudly rather than guess."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ValueError(f"must be an int, not {shown(value)}")


def bool_only(value: Any) -> Any:
    """For a ``mode="before"`` validator of a public bool field: ``value`` itself when it is
    a bool (or None, which the field's own type accepts or refuses). An int, a float or a
    string, which pydantic's lax mode would turn into a bool (``1`` into True, ``"no"`` or
    ``"false"`` into False), raises ValueError saying what it is: config errs loudly rather
    than guess."""
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"must be a bool (True or False), not {shown(value)}")


def check_flags(**flags: object) -> None:
    """For a constructor's bool arguments (a store's ``read_only=``, ``create=``): raise
    :class:`ConfigurationError` naming the first that is not a real bool (``details``
    ``argument``), rather than take ``1``, ``"yes"`` or ``"false"`` for one."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ConfigurationError(
                f"{' and '.join(flags)} must be True or False; {name} is {shown(flag)} "
                "(1, 'yes' or 'false' are refused rather than guessed at)",
                details={"argument": name})


def number_only(value: Any) -> Any:
    """For a ``mode="before"`` validator of a public float field: ``value`` itself when it
    is an int or a float (or None, which the field's own type accepts or refuses). A bool or
    a string, which pydantic's lax mode would turn into a float (``True`` into 1.0, ``"10"``
    into 10.0), raises ValueError saying what it is: config errs loudly rather than guess."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise ValueError(f"must be a number (an int or a float), not {shown(value)}")
