"""The connector protocol: how effects reach the outside world and are reconciled.

A connector-backed tool never runs an arbitrary callback: the runtime records the action's
intent (with its admission) before calling :meth:`DurableActionConnector.dispatch` with the
actual parsed args, and after a crash asks :meth:`DurableActionConnector.resolve_result`
what happened before it would ever dispatch again.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from agentium_graph.errors import ConfigurationError, config_error, positional


class ActionRequest(BaseModel):
    """What a connector receives. ``result_ref`` is set (to the action id) before dispatch.

    ``fence``: the lease fence of the run dispatching it, and ``dispatch``: which dispatch
    of the action this is (1, and one more for each dispatch again: after a lookup proved it
    absent, or could not tell for an idempotent destination, or after an operator attested
    it absent), both set by the runtime (None in a request built by hand). A destination
    that keeps the highest fence it saw per action id can refuse a late dispatch from a
    worker that lost its lease (paused past its TTL) after a newer one already dispatched
    again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action_id: str
    result_ref: str
    binding_id: str
    binding_version: str
    args: dict[str, Any]
    destination: str
    caller: dict[str, Any]
    fence: int | None = None
    dispatch: int | None = None


class ActionOutcome(BaseModel):
    """A confirmed result: JSON ``output`` and the ``result_ref`` that can look it up again."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: Any
    result_ref: str

    def __init__(self, /, *args: Any, **data: Any) -> None:
        """``ActionOutcome(output, result_ref)``, by position or by name."""
        positional("ActionOutcome", ("output", "result_ref"), args, data)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error("ActionOutcome", data, exc) from None


class Absent(BaseModel):
    """The connector proves the action never took effect (safe to dispatch again)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, /, *args: Any, **data: Any) -> None:
        if args or data:
            raise ConfigurationError(f"Absent() takes no arguments, got {len(args)} "
                                     f"positional and {sorted(data)}; to say why the outcome "
                                     "is not known use Unknown(reason)")
        super().__init__()


class Unknown(BaseModel):
    """The connector cannot tell whether the action took effect: ``Unknown(reason)``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: str = ""

    def __init__(self, /, *args: Any, **data: Any) -> None:
        positional("Unknown", ("reason",), args, data)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error("Unknown", data, exc) from None


@runtime_checkable
class DurableActionConnector(Protocol):
    """An effect connector. ``idempotent_destination``: the destination dedupes by action id."""

    id: str
    version: str
    idempotent_destination: bool

    async def dispatch(self, request: ActionRequest) -> ActionOutcome: ...

    async def resolve_result(self, result_ref: str) -> ActionOutcome | Absent | Unknown: ...
