"""Task documents of the MongoDB store, read and written: parsing the records a document
holds (every error names the task and the damaged field), the ``$set`` fields a delta
changes, the lease grant a compare-and-set returns, and the size check of a new task."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypeVar

import bson
from bson.errors import BSONError

from agentium_graph.errors import StoreError
from agentium_graph.store import (
    ActionRecord,
    Delta,
    LeaseGrant,
    Needs,
    NodeRecord,
    TaskHeader,
    TaskIdentity,
    TaskSnapshot,
    missing_persisted,
)
from agentium_graph_mongodb._codec import (
    bounded_repr,
    charges_text,
    check_version,
    damaged,
    decode_key,
    encode_key,
    header_from_doc,
    schema_errors,
    stored_node,
)
from agentium_graph_mongodb._doc import TaskDoc
from agentium_graph_mongodb._errors import DOCUMENT_LIMIT_MIB

#: Room a new task document leaves under MongoDB's 16 MiB limit for the node and action
#: records it gains as it runs; a larger one is refused at create (it could never progress).
CREATE_HEADROOM_BYTES = 1024 * 1024
MAX_CREATE_BYTES = DOCUMENT_LIMIT_MIB * 1024 * 1024 - CREATE_HEADROOM_BYTES


def check_create_size(raw: dict[str, Any]) -> None:
    """Refuse a new task document that leaves its node and action records no room to grow
    under MongoDB's document limit: it could be created but never progress."""
    rough = len(raw["identity"]) + len(raw["first_entry"]) + sum(
        len(text) for text in raw["nodes"].values())
    if rough <= MAX_CREATE_BYTES // 4:  # UTF-8 takes at most 4 bytes a character
        return
    try:
        size = len(bson.encode(raw))
    except (BSONError, OverflowError):
        return  # the insert reports it, typed
    if size > MAX_CREATE_BYTES:
        key = raw["_id"]
        raise StoreError(
            f"MongoDB store: task {key!r} cannot be created: its task document would take "
            f"{size:,} bytes, more than the {MAX_CREATE_BYTES:,} a new task may take "
            f"(MongoDB's {DOCUMENT_LIMIT_MIB} MiB document limit less "
            f"{CREATE_HEADROOM_BYTES // 1024 // 1024} MiB kept for the records of its nodes "
            "and actions as it runs), so nothing was written. The task's input and plan are "
            "kept in it: keep them smaller (store large payloads elsewhere and pass "
            "references), or use a store without this limit",
            details={"key": key, "reason": "document_too_large", "size_bytes": size,
                     "limit_bytes": MAX_CREATE_BYTES})


def parse_header(raw: dict[str, Any], key: str) -> TaskHeader:
    # Errors name the task (details["key"]): a lister (the CLI's list) reports it and goes on.
    where = f"task document {key!r}"
    check_version(raw, where, key)
    return header_from_doc(raw.get("header"), where, key)


def parse_identity(raw: dict[str, Any], key: str) -> TaskIdentity:
    where = f"identity of task {key!r}"
    check_version(raw, where, key)
    with schema_errors(where, "identity", key):
        return TaskIdentity.model_validate_json(raw["identity"])


M = TypeVar("M", NodeRecord, ActionRecord)


def parse_records(doc: TaskDoc, model: type[M], name: str, texts: dict[str, str],
             only: Iterable[str] | None = None) -> dict[str, M]:
    """The records ``texts`` (a part ``name`` of the task document, by encoded id; only
    the encoded ids ``only`` when given), parsed; an error names the damaged one."""
    where = f"task document {doc.key!r}"
    out: dict[str, M] = {}
    for field_name in texts if only is None else (i for i in only if i in texts):
        with schema_errors(where, f"{name}.{field_name}", doc.key):
            rec = model.model_validate_json(texts[field_name])
        gap = missing_persisted(rec)
        if gap is not None:  # it would read as its default (a completed node as pending)
            raise damaged(where, f"{name}.{field_name}.{gap} is missing, which every store "
                          "writes", doc.key)
        own = rec.node_id if isinstance(rec, NodeRecord) else rec.action_id
        if encode_key(own) != field_name:  # filed under another id: every lookup misses it
            id_name = "node_id" if isinstance(rec, NodeRecord) else "action_id"
            raise damaged(where, f"{name}.{field_name}.{id_name} is {bounded_repr(own)}, not "
                          f"the field's {bounded_repr(decode_key(field_name))}", doc.key)
        out[field_name] = rec
    return out


def loaded(doc: TaskDoc, need: Needs) -> tuple[dict[str, NodeRecord],
                                               dict[str, ActionRecord], set[str]]:
    """The node and action records and charged admission ids a transition needs."""
    nodes = parse_records(doc, NodeRecord, "nodes", doc.nodes, map(encode_key, need.node_ids))
    actions = parse_records(doc, ActionRecord, "actions", doc.actions,
                            map(encode_key, need.action_ids))
    return ({n.node_id: n for n in nodes.values()}, {a.action_id: a for a in actions.values()},
            {i for i in need.admission_ids if encode_key(i) in doc.admissions})


def record_sets(delta: Delta) -> dict[str, Any]:
    """The ``$set`` fields of every node, action and admission a delta changed."""
    sets: dict[str, Any] = {}
    for node in delta.nodes.values():
        sets[f"nodes.{encode_key(node.node_id)}"] = stored_node(node).model_dump_json()
    for action in delta.actions.values():
        sets[f"actions.{encode_key(action.action_id)}"] = action.model_dump_json()
    for admission, amounts in delta.charges.items():
        sets[f"admissions.{encode_key(admission)}"] = charges_text(amounts)
    return sets


def grant_of(post: TaskHeader, expires_at: datetime, doc: TaskDoc | None = None,
             delta: Delta | None = None) -> LeaseGrant:
    """The grant; with ``doc`` (the document the CAS was decided on) also the snapshot,
    with ``delta`` (the request's steps) also their commit result.

    The CAS matched that document's ``header.seq`` and only commits change nodes and
    actions (each moves ``seq``), so its records, updated by the delta, are exactly those
    under the new fence."""
    snapshot = None
    if doc is not None:
        nodes = {n.node_id: n for n in
                 parse_records(doc, NodeRecord, "nodes", doc.nodes).values()}
        actions = {a.action_id: a for a in
                   parse_records(doc, ActionRecord, "actions", doc.actions).values()}
        if delta is not None:
            for n in delta.nodes.values():
                nodes[n.node_id] = NodeRecord.model_validate_json(
                    stored_node(n).model_dump_json())
            for a in delta.actions.values():
                actions[a.action_id] = ActionRecord.model_validate_json(a.model_dump_json())
        snapshot = TaskSnapshot(header=post, nodes=nodes, actions=actions)
    return LeaseGrant(fence=post.fence, expires_at=expires_at, header=post, snapshot=snapshot,
                      commit=None if delta is None else delta.result(post))
