"""The base of every public config model: frozen, keyword-only, ``ConfigurationError`` on
bad values. Apart from :mod:`agentium_graph._program` so that a store (whose request models
are config models) does not import the plan compiler and the providers with it."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from agentium_graph._canonical import INT64_MAX
from agentium_graph.errors import ConfigurationError, config_error, int_only

_Text = TypeVar("_Text", bound=str | tuple[str, ...])


class ConfigModel(BaseModel):
    """Public configuration: frozen, no unknown fields, and invalid values raise
    :class:`~agentium_graph.errors.ConfigurationError` naming the field (never pydantic's
    ``ValidationError``). Nested use (a dict given for a field of another model) is
    validated, and reported, by the outer model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, /, *args: Any, **data: Any) -> None:
        if args:
            raise ConfigurationError(keywords_only(type(self), len(args)))
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(type(self).__name__, data, exc) from None


def keywords_only(cls: type[BaseModel], given: int) -> str:
    """The message for positional arguments given to a keyword-only public model."""
    name = cls.__name__
    fields = ", ".join(f"{f}=..." for f in cls.model_fields) or ""
    return (f"{name} takes keyword arguments only ({name}({fields})), got {given} "
            "positional argument(s); name each value")


def storable_text(value: _Text) -> _Text:
    """For a ``mode="after"`` validator of public text (or a tuple of texts) that a task
    pins: a lone surrogate has no UTF-8 form, so no store could hold it, and it would fail
    as a bare NotJSONError when digested (at HostCatalog or create) instead of here."""
    texts: tuple[str, ...] = (value,) if isinstance(value, str) else value
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{text!r} holds an unpaired surrogate at position {exc.start}, "
                             "which is not valid Unicode (often bytes that are not UTF-8); "
                             "pass UTF-8 text") from None
    return value


class IntConfigModel(ConfigModel):
    """Config whose fields are all ints: real ints only, never True, 2.0 or "3" (which
    pydantic's lax mode would take and pin with the task as 1, 2 and 3)."""

    @field_validator("*", mode="before")
    @classmethod
    def _ints_only(cls, value: Any) -> Any:
        return int_only(value)


# The largest limit a program takes: a task pins its limits as JSON, and canonical JSON
# refuses integers of thousands of digits, so a larger one would fail every create (and a
# GraphBinding's descriptor) instead of here. int64, which every store holds as a number.
MAX_LIMIT = INT64_MAX
