"""Refuse JSON Schemas whose references cannot be resolved from the schema itself.

jsonschema resolves references lazily, at validation time: a schema with a dangling
reference is accepted when it is checked and then fails, with an untyped error, the first
time a value reaches that part of it, in the middle of a run; and its default registry
would download a remote one. Every reference is therefore looked up once, when the schema
enters (a binding, a program's ``input_schema``), and validators are built on an empty
registry (:func:`local_registry`), so nothing is ever fetched.

The walk follows the schema's own dialect (through ``referencing``): which keywords hold
subschemas, and where ``$id``/``id`` starts a new base URI, so data that merely looks like
a schema (``examples``, ``x-...`` extensions) is never mistaken for one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import referencing.jsonschema
from referencing import Registry, Resource
from referencing._core import Resolver  # not re-exported; the type of registry.resolver()
from referencing.exceptions import Unresolvable

from agentium_graph._canonical import json_path
from agentium_graph.errors import ConfigurationError

_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


def local_registry() -> Registry[Any]:
    """An empty registry: a validator built on it resolves references only within its own
    schema and never retrieves a document."""
    return Registry()


def _children(parent: Any, child: Any) -> tuple[str | int, ...]:
    """Where ``child`` (an object inside ``parent``) sits, found by identity."""
    if isinstance(parent, Mapping):
        for key, value in parent.items():
            if value is child:
                return (key,)
            if isinstance(value, Mapping | list):
                items = value.items() if isinstance(value, Mapping) else enumerate(value)
                for inner, sub in items:
                    if sub is child:
                        return (key, inner)
    return ("?",)


def _walk(resolver: Resolver[Any], resource: Resource[Any],
          path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str,
                                                         Resolver[Any]]]:
    contents = resource.contents
    if isinstance(contents, Mapping):
        for keyword in _REFERENCES:
            ref = contents.get(keyword)
            if isinstance(ref, str):
                yield (*path, keyword), ref, resolver
    for sub in resource.subresources():
        yield from _walk(resolver.in_subresource(sub), sub,
                         (*path, *_children(contents, sub.contents)))


def check_refs(schema: Mapping[str, Any], validator_cls: type, where: str) -> None:
    """Raise :class:`ConfigurationError` naming the first reference of ``schema`` that does
    not resolve within it (remote documents are never fetched)."""
    meta = getattr(validator_cls, "META_SCHEMA", {})
    dialect = (meta.get("$id") or meta.get("id") or "") if isinstance(meta, Mapping) else ""
    spec = referencing.jsonschema.specification_with(str(dialect),
                                                     default=referencing.jsonschema.DRAFT202012)
    root = spec.create_resource(dict(schema))
    resolver = local_registry().resolver_with_root(root)
    for path, ref, scoped in _walk(resolver, root, ()):
        try:
            scoped.lookup(ref)
        except Unresolvable:
            at = json_path(path, "schema")
            raise ConfigurationError(
                f"{where}: the reference {ref!r} at {at} does not resolve within the schema; "
                "remote schemas are never fetched, so copy the referenced schema under "
                "$defs and point at it with '#/$defs/<name>'",
                details={"ref": ref, "path": at}) from None
