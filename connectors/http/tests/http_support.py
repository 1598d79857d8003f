"""Helpers shared by the HTTP connector tests."""

from __future__ import annotations

import itertools
from typing import Any

from agentium_graph import ActionRequest

_ids = itertools.count(1)


def make_request(key: str | None = None, *, args: dict[str, Any] | None = None,
                 destination: str = "/charges", result_ref: str | None = None) -> ActionRequest:
    action_id = key or f"act_{next(_ids):024x}"
    return ActionRequest(action_id=action_id, result_ref=result_ref or action_id,
                         binding_id="charge", binding_version="1",
                         args={"amount": 500, "currency": "eur"} if args is None else args,
                         destination=destination, caller={"user": "u1"})
