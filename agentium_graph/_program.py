"""Programs, plan limits and planner configuration (public config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

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

from agentium_graph._canonical import NotJSONError, digest, json_copy
from agentium_graph._config_base import MAX_LIMIT, IntConfigModel, keywords_only, storable_text
from agentium_graph._schemarefs import checked_validator
from agentium_graph.errors import ConfigurationError, config_error, int_only, positional
from agentium_graph.providers._protocol import shape_problem


class PlanLimits(IntConfigModel):
    """Bounds on one plan; the host sets them, a planner's proposals never change them."""

    max_bytes: int = Field(default=128_000, ge=64, le=MAX_LIMIT)
    max_nodes: int = Field(default=100, ge=1, le=MAX_LIMIT)
    max_depth: int = Field(default=32, ge=1, le=MAX_LIMIT)
    max_concurrency: int = Field(default=5, ge=1, le=MAX_LIMIT)


class StreamLimits(IntConfigModel):
    """Bounds on a streaming planner's output (``PlannerConfig(mode="stream", stream=...)``)."""

    max_frame_bytes: int = Field(default=64_000, ge=64, le=MAX_LIMIT)
    max_total_bytes: int = Field(default=512_000, ge=64, le=MAX_LIMIT)
    max_frames: int = Field(default=64, ge=1, le=MAX_LIMIT)
    max_latency_ms: int = Field(default=30_000, ge=1, le=MAX_LIMIT)


class PlannerConfig(BaseModel):
    """A bounded model planner that proposes the plan instead of a static one."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    provider: Any
    host_instructions: str
    max_corrections: int = Field(default=2, ge=0, le=16)
    max_output_tokens: int = Field(default=4_000, ge=1, le=MAX_LIMIT)
    mode: Literal["complete", "stream"] = "complete"
    stream: StreamLimits = StreamLimits()

    def __init__(self, /, *args: Any, **data: Any) -> None:
        """``PlannerConfig(provider, host_instructions, max_corrections, max_output_tokens,
        mode=..., stream=...)``: the first four may be given by position."""
        positional("PlannerConfig", ("provider", "host_instructions", "max_corrections",
                                     "max_output_tokens"), args, data)
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error("PlannerConfig", data, exc) from None

    @field_validator("max_corrections", "max_output_tokens", mode="before")
    @classmethod
    def _ints_only(cls, value: Any) -> Any:
        return int_only(value)

    @field_validator("host_instructions")
    @classmethod
    def _storable(cls, value: str) -> str:
        return storable_text(value)

    @model_validator(mode="after")
    def _provider_shape(self) -> PlannerConfig:
        problem = shape_problem(self.provider, stream=self.mode == "stream")
        if problem is not None:
            raise ValueError(f"{problem}; mode={self.mode!r} needs a ModelProvider")
        for name in ("id", "version"):
            if not isinstance(getattr(self.provider, name, None), str):
                raise ValueError(f"provider {type(self.provider).__name__} needs a string "
                                 f"{name!r}: it is part of what a recorded plan means")
        return self

    def descriptor(self) -> dict[str, Any]:
        """Plain JSON that identifies the planner (its provider by id and version)."""
        return {"mode": self.mode, "host_instructions": digest(self.host_instructions),
                "max_corrections": self.max_corrections,
                "max_output_tokens": self.max_output_tokens,
                "provider": {"id": self.provider.id, "version": self.provider.version},
                "stream": self.stream.model_dump()}


def _plan_digest(plan: Any) -> str | None:
    if plan is None:
        return None
    try:
        return digest(plan)
    except (NotJSONError, TypeError, ValueError):
        return None  # not JSON: refused wherever it is used (checked_plan, create)


class ExecutionGraphProgram(BaseModel):
    """A versioned program: exactly one of a static JSON ``plan`` or a ``planner``.

    The plan and ``input_schema`` are deep-copied (as JSON) at construction, so later
    changes to the caller's dicts cannot alter the program; non-JSON values and an invalid
    ``input_schema`` raise :class:`~agentium_graph.errors.ConfigurationError`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    id: str = Field(min_length=1, max_length=200)
    version: str = Field(min_length=1, max_length=100)
    plan: dict[str, Any] | None = None
    planner: PlannerConfig | None = None
    limits: PlanLimits = PlanLimits()
    input_schema: dict[str, Any] | None = None

    _input_validator: Validator | None = PrivateAttr(default=None)
    _plan_digest: str | None = PrivateAttr(default=None)
    _schema_digest: str | None = PrivateAttr(default=None)

    def __init__(self, /, *args: Any, **data: Any) -> None:
        if args:
            raise ConfigurationError(keywords_only(type(self), len(args)))
        for name in ("plan", "input_schema"):
            if isinstance(data.get(name), dict):
                try:
                    data[name] = json_copy(data[name])
                except NotJSONError as exc:
                    raise ConfigurationError(
                        f"program {data.get('id')!r}: {name} is not JSON data "
                        f"({exc.path.replace('$', name, 1)}: {exc.reason}); use plain JSON "
                        "values") from None
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error("ExecutionGraphProgram", data, exc) from None
        self._compile_schema()

    def _compile_schema(self) -> None:
        """The validator and digest of ``input_schema`` as it is now (None without one)."""
        self._input_validator = self._schema_digest = None
        if self.input_schema is not None:
            _, self._input_validator = checked_validator(
                self.input_schema, f"program {self.id!r}: input_schema", root="input_schema")
            self._schema_digest = digest(self.input_schema)

    def model_post_init(self, context: Any, /) -> None:
        # Also run by model_construct: the digest of the plan the program holds.
        self._plan_digest = _plan_digest(self.plan)

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Self:
        """As pydantic's; a copy given another ``plan`` pins that plan's digest, one given
        another ``input_schema`` compiles it."""
        copy = super().model_copy(update=update, deep=deep)
        if update and "plan" in update:
            copy._plan_digest = _plan_digest(copy.plan)
        if update and "input_schema" in update:  # its own validator and digest
            copy._compile_schema()
        return copy

    def checked_plan(self, plan_digest: str | None = None) -> dict[str, Any] | None:
        """The plan, once it is known to be the one the program was built with.

        The model is frozen, but ``plan`` is a dict a caller could still change in place
        (``program.plan["nodes"][0]["args"] = ...``) after a catalog pinned its digest: that
        is refused here, where a plan is compiled or digested, instead of running what no
        descriptor describes. ``plan_digest``: the plan's digest when the caller has it."""
        if self.plan is None:
            return None
        if plan_digest is None:
            plan_digest = _plan_digest(self.plan)
        if plan_digest != self._plan_digest:
            raise ConfigurationError(
                f"program {self.id!r} version {self.version!r}: its plan was changed in place "
                "after the program was built; a program is immutable: build a new "
                "ExecutionGraphProgram (and the catalog that uses it) instead",
                details={"program": self.id, "version": self.version})
        return self.plan

    @property
    def input_validator(self) -> Validator | None:
        """The compiled validator of ``input_schema`` (``None`` when there is none)."""
        return self._input_validator

    @model_validator(mode="after")
    def _one_source(self) -> ExecutionGraphProgram:
        if (self.plan is None) == (self.planner is None):
            raise ValueError("give exactly one of plan={...} or planner=PlannerConfig(...)")
        return self

    def descriptor(self, *, plan_digest: str | None = None) -> dict[str, Any]:
        """Plain JSON that identifies the program; part of descriptor and task digests.

        ``plan_digest``: the plan's digest when the caller already has it (computed from
        the plan's canonical JSON), so the plan is not walked and encoded again."""
        if self.plan is not None:
            self.checked_plan(plan_digest)
            plan_digest = self._plan_digest
        if self._schema_digest is not None and digest(self.input_schema) != self._schema_digest:
            # The validator was compiled from the schema as built: a task would pin one
            # schema and have its input checked against another.
            raise ConfigurationError(
                f"program {self.id!r} version {self.version!r}: its input_schema was changed "
                "in place after the program was built; a program is immutable: build a new "
                "ExecutionGraphProgram instead",
                details={"program": self.id, "version": self.version})
        return {
            "id": self.id,
            "version": self.version,
            "plan_digest": plan_digest,
            "planner": None if self.planner is None else self.planner.descriptor(),
            "limits": self.limits.model_dump(),
            "input_schema": self.input_schema,
        }
