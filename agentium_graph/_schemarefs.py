"""Refuse JSON Schemas that cannot be used as they are, when they enter (a binding's
schemas, a program's ``input_schema``), instead of failing the first time a value reaches
the bad part, in the middle of a run.

* References: jsonschema resolves them lazily, at validation time: a dangling one is
  accepted when the schema is checked and then fails, with an untyped error, the first time
  a value reaches it; and its default registry would download a remote one. Every reference
  is therefore looked up once, and validators are built on an empty registry
  (:func:`local_registry`), so nothing is ever fetched.
* Reference cycles that never descend into the value (``{"$ref": "#"}``, two ``$defs``
  naming each other, ``{"anyOf": [..., {"$ref": "#"}]}``): validating would recurse until
  Python's limit. Recursive schemas that descend (a tree's ``items``) are fine.
* Regular expressions: the draft 3 and 4 metaschemas do not check ``patternProperties``'
  keys, so an invalid one would raise ``re.error`` at every check of an object.
* A ``$schema`` that is not a string, and a schema nested too deeply to be checked.

The walk follows the schema's own dialect (through ``referencing``): which keywords hold
subschemas, and where ``$id``/``id`` starts a new base URI, so data that merely looks like
a schema (``examples``, ``x-...`` extensions) is never mistaken for one.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator, Mapping
from typing import Any

import referencing.jsonschema
from jsonschema import (
    Draft3Validator,
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft202012Validator,
)
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing import Registry, Resource, Specification
from referencing._core import Resolver  # not re-exported; the type of registry.resolver()
from referencing.exceptions import Unresolvable

from agentium_graph._canonical import json_path
from agentium_graph.errors import ConfigurationError

_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords that apply their subschemas to the very value being checked (not to a part of
# it), each with the validator keyword that implements it in jsonschema.
_IN_PLACE = {"allOf": "allOf", "anyOf": "anyOf", "oneOf": "oneOf", "not": "not", "if": "if",
             "then": "if", "else": "if", "dependentSchemas": "dependentSchemas",
             "dependencies": "dependencies", "extends": "extends", "type": "type",
             "disallow": "disallow"}
# Dialects in which "$ref" overrides its sibling keywords.
_REF_ALONE = (Draft3Validator, Draft4Validator, Draft6Validator, Draft7Validator)

_Located = tuple[tuple[str | int, ...], Resource[Any], Resolver[Any]]


def local_registry() -> Registry[Any]:
    """An empty registry: a validator built on it resolves references only within its own
    schema and never retrieves a document."""
    return Registry()


def checked_validator(schema: dict[str, Any], where: str,
                      root: str = "schema") -> tuple[type[Validator], Validator]:
    """The validator class of ``schema``'s dialect (``$schema``, default 2020-12) and a
    validator of ``schema`` on an empty registry, or :class:`ConfigurationError` saying
    why ``schema`` cannot be used (``where`` names it; ``root`` starts its paths)."""
    dialect = schema.get("$schema")
    if "$schema" in schema and not isinstance(dialect, str):
        raise ConfigurationError(
            f"{where}: $schema must be a string naming a JSON Schema dialect (e.g. "
            f"'https://json-schema.org/draft/2020-12/schema'), not {type(dialect).__name__}; "
            "fix it or leave it out for 2020-12")
    try:
        cls: type[Validator] = validator_for(schema, default=Draft202012Validator)
        try:
            cls.check_schema(schema)
        except SchemaError as exc:
            raise ConfigurationError(
                f"{where} is not a valid JSON Schema: {exc.message} at "
                f"{exc.json_path.replace('$', root, 1)}; fix the schema") from None
        check_refs(schema, cls, where)
    except RecursionError:
        raise ConfigurationError(
            f"{where} nests too deeply to be checked (Python's recursion limit); flatten it, "
            "e.g. name repeated parts under $defs") from None
    return cls, cls(schema, registry=local_registry())


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


def _walk(resolver: Resolver[Any], root: Resource[Any]) -> Iterator[_Located]:
    """Every (sub)schema of ``root`` with its path and the resolver in its scope
    (iterative: a deep schema must not hit the recursion limit here)."""
    stack: list[_Located] = [((), root, resolver)]
    while stack:
        path, resource, scoped = stack.pop()
        yield path, resource, scoped
        subs = [((*path, *_children(resource.contents, sub.contents)), sub,
                 scoped.in_subresource(sub)) for sub in resource.subresources()]
        stack.extend(reversed(subs))


def _resource(contents: Any, spec: Specification[Any]) -> Resource[Any]:
    return Resource.from_contents(contents, default_specification=spec)


def check_refs(schema: Mapping[str, Any], validator_cls: type, where: str) -> None:
    """Raise :class:`ConfigurationError` naming the first reference of ``schema`` that does
    not resolve within it (remote documents are never fetched), the first invalid regular
    expression, or a reference cycle that never descends into the value."""
    meta = getattr(validator_cls, "META_SCHEMA", {})
    dialect = (meta.get("$id") or meta.get("id") or "") if isinstance(meta, Mapping) else ""
    spec = referencing.jsonschema.specification_with(str(dialect),
                                                     default=referencing.jsonschema.DRAFT202012)
    root = spec.create_resource(dict(schema))
    located = list(_walk(local_registry().resolver_with_root(root), root))
    for path, resource, scoped in located:
        contents = resource.contents
        if not isinstance(contents, Mapping):
            continue
        for keyword in _REFERENCES:
            ref = contents.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                scoped.lookup(ref)
            except Unresolvable:
                at = json_path((*path, keyword), "schema")
                raise ConfigurationError(
                    f"{where}: the reference {ref!r} at {at} does not resolve within the "
                    "schema; remote schemas are never fetched, so copy the referenced schema "
                    "under $defs and point at it with '#/$defs/<name>'",
                    details={"ref": ref, "path": at}) from None
        _check_patterns(contents, path, where)
    keywords: Container[str] = getattr(validator_cls, "VALIDATORS", {})
    cycle = _in_place_cycle(located, spec, keywords,
                            ref_alone=validator_cls in _REF_ALONE)
    if cycle is not None:
        shown = json_path(cycle[0], "schema")
        raise ConfigurationError(
            f"{where}: the schema at {shown} leads back to itself through "
            f"{' -> '.join(cycle[1])} without descending into the value (a reference cycle: "
            "validating anything there would recurse forever); make every recursion go "
            "through a keyword that checks a part of the value (properties, items, ...)",
            details={"path": shown, "cycle": cycle[1]})


def _check_patterns(contents: Mapping[str, Any], path: tuple[str | int, ...],
                    where: str) -> None:
    patterns = contents.get("patternProperties")
    found = [(("patternProperties",), p) for p in patterns] \
        if isinstance(patterns, Mapping) else []
    if isinstance(contents.get("pattern"), str):
        found.append((("pattern",), contents["pattern"]))
    for keyword, pattern in found:
        if not isinstance(pattern, str):
            continue
        try:
            re.compile(pattern)
        except re.error as exc:
            at = json_path((*path, *keyword), "schema")
            raise ConfigurationError(
                f"{where}: {pattern!r} at {at} is not a valid regular expression ({exc}); "
                "fix the pattern", details={"pattern": pattern, "path": at}) from None


def _in_place_edges(resource: Resource[Any], resolver: Resolver[Any],
                    spec: Specification[Any], keywords: Container[str], ref_alone: bool
                    ) -> Iterator[tuple[str, Resource[Any], Resolver[Any]]]:
    """(label, subschema, its resolver) for each subschema applied to the same value."""
    contents = resource.contents
    if not isinstance(contents, Mapping):
        return
    for keyword in _REFERENCES:
        ref = contents.get(keyword)
        if isinstance(ref, str) and keyword in keywords:
            try:
                resolved = resolver.lookup(ref)
            except Unresolvable:
                continue
            yield f"{keyword} {ref!r}", _resource(resolved.contents, spec), resolved.resolver
    if ref_alone and "$ref" in contents:
        return  # the other keywords are ignored next to "$ref" in these dialects
    for keyword, implemented_by in _IN_PLACE.items():
        value = contents.get(keyword)
        if value is None or implemented_by not in keywords:
            continue
        if isinstance(value, Mapping) and keyword in ("dependentSchemas", "dependencies"):
            subs = list(value.values())
        else:
            subs = value if isinstance(value, list) else [value]
        for sub in subs:
            if isinstance(sub, Mapping):
                child = _resource(sub, spec)
                yield keyword, child, resolver.in_subresource(child)


def _in_place_cycle(located: list[_Located], spec: Specification[Any],
                    keywords: Container[str], ref_alone: bool
                    ) -> tuple[tuple[str | int, ...], list[str]] | None:
    """A cycle of subschemas each applied to the same value as the one before: where it
    was entered and its chain of keywords, or None (depth-first, iterative, linear)."""
    state: dict[int, bool] = {}  # id(contents) -> still on the current path
    paths = {id(resource.contents): path for path, resource, _ in located}
    for path, resource, resolver in located:
        if id(resource.contents) in state or not isinstance(resource.contents, Mapping):
            continue
        state[id(resource.contents)] = True
        stack = [(resource.contents, "",
                  _in_place_edges(resource, resolver, spec, keywords, ref_alone))]
        while stack:
            contents, _, edges = stack[-1]
            step = next(edges, None)
            if step is None:
                state[id(contents)] = False
                stack.pop()
                continue
            label, sub, sub_resolver = step
            seen = state.get(id(sub.contents))
            if seen:
                start = next(i for i, frame in enumerate(stack) if frame[0] is sub.contents)
                return paths.get(id(sub.contents), path), \
                    [frame[1] for frame in stack[start + 1:]] + [label]
            if seen is None and isinstance(sub.contents, Mapping):
                state[id(sub.contents)] = True
                stack.append((sub.contents, label, _in_place_edges(
                    sub, sub_resolver, spec, keywords, ref_alone)))
    return None
