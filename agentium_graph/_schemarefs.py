"""Refuse JSON Schemas whose ``$ref`` cannot be resolved from the schema itself.

jsonschema resolves references lazily, at validation time, and never fetches remote
documents by default: a schema with a remote or dangling ``$ref`` is accepted when it is
checked and then fails, with an untyped error, the first time a value reaches that part of
it, in the middle of a run. Every reference is therefore looked up once, when the schema
enters (a binding, a program's ``input_schema``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import referencing.jsonschema
from referencing import Registry
from referencing.exceptions import Unresolvable

from agentium_graph._canonical import json_path
from agentium_graph.errors import ConfigurationError

# Keywords whose value maps names to subschemas (the names are not keywords), and keywords
# whose value is data, not a schema.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas", "dependencies"})
_DATA = frozenset({"enum", "const", "default", "examples"})


def _refs(schema: Any, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...],
                                                                      str]]:
    if not isinstance(schema, Mapping):
        return
    if path and "$id" in schema:
        return  # an embedded resource: its references resolve against its own base URI
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str):
            yield (*path, key), value
        elif key in _DATA:
            continue
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                yield from _refs(sub, (*path, key, name))
        elif isinstance(value, Mapping):
            yield from _refs(value, (*path, key))
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _refs(sub, (*path, key, i))


def check_refs(schema: Mapping[str, Any], validator_cls: type, where: str) -> None:
    """Raise :class:`ConfigurationError` naming the first ``$ref`` of ``schema`` that does not
    resolve within it (remote documents are never fetched)."""
    found = list(_refs(schema, ()))
    if not found:
        return
    meta = getattr(validator_cls, "META_SCHEMA", {})
    dialect = (meta.get("$id") or meta.get("id") or "") if isinstance(meta, Mapping) else ""
    spec = referencing.jsonschema.specification_with(str(dialect),
                                                     default=referencing.jsonschema.DRAFT202012)
    resolver = Registry().resolver_with_root(spec.create_resource(dict(schema)))
    for path, ref in found:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            at = json_path(path, "schema")
            raise ConfigurationError(
                f"{where}: the $ref {ref!r} at {at} does not resolve within the schema; "
                "remote schemas are never fetched, so copy the referenced schema under "
                "$defs and point at it with '#/$defs/<name>'",
                details={"ref": ref, "path": at}) from None
