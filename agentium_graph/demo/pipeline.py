"""An order-review pipeline built only from pure tools (no model provider needed).

``load_order`` fans out to four independent checks (pricing, stock, risk, shipping) that a
``decide`` node joins; ``invoice`` renders the result. Each tool pretends to do a little
work (``delay`` seconds) so a crash can land in the middle of the graph. Every execution is
appended to an optional call log, which is how the demo proves nothing completed re-ran.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from agentium_graph import (
    ExecutionGraphProgram,
    HostCatalog,
    ToolBinding,
    tool_context,
)

_ORDERS: dict[str, dict[str, Any]] = {
    "ord-1042": {
        "customer": "cus-77", "region": "EU",
        "items": [{"sku": "KB-01", "qty": 2}, {"sku": "MS-07", "qty": 1},
                  {"sku": "HD-33", "qty": 1}],
    },
}
_PRICES = {"KB-01": 4900, "MS-07": 2500, "HD-33": 8900}
_STOCK = {"KB-01": 12, "MS-07": 0, "HD-33": 4}
_WEIGHT_G = {"KB-01": 900, "MS-07": 120, "HD-33": 350}
_HISTORY = {"cus-77": {"orders": 14, "chargebacks": 1}}

_ORDER_SCHEMA = {
    "type": "object",
    "required": ["order_id", "customer", "region", "items"],
    "properties": {"order_id": {"type": "string"}, "customer": {"type": "string"},
                   "region": {"type": "string"},
                   "items": {"type": "array", "items": {
                       "type": "object", "required": ["sku", "qty"],
                       "properties": {"sku": {"type": "string"},
                                      "qty": {"type": "integer", "minimum": 1}}}}},
}


class _CallLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path

    def record(self) -> None:
        if self.path is None:
            return
        ctx = tool_context()
        line = json.dumps({"node": ctx.node_id, "attempt": ctx.attempt, "fence": ctx.fence,
                           "pid": os.getpid()}) + "\n"
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())


def read_call_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def build_catalog(*, delay: float = 0.0, call_log: Path | None = None) -> HostCatalog:
    log = _CallLog(call_log)

    async def work() -> None:
        log.record()
        if delay:
            await asyncio.sleep(delay)

    async def load_order(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        order = _ORDERS.get(args["order_id"])
        if order is None:
            raise LookupError(f"unknown order {args['order_id']!r}")
        return {"order_id": args["order_id"], **order}

    async def price_items(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        lines = [{"sku": i["sku"], "qty": i["qty"], "cents": _PRICES[i["sku"]] * i["qty"]}
                 for i in args["items"]]
        return {"lines": lines, "subtotal_cents": sum(x["cents"] for x in lines)}

    async def check_stock(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        short = [i["sku"] for i in args["items"] if _STOCK.get(i["sku"], 0) < i["qty"]]
        return {"all_in_stock": not short, "backordered": short}

    async def score_risk(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        hist = _HISTORY.get(args["customer"], {"orders": 0, "chargebacks": 0})
        score = round(min(1.0, 0.1 + 0.3 * hist["chargebacks"] / max(1, hist["orders"])), 3)
        return {"score": score, "review": score > 0.5}

    async def quote_shipping(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        grams = sum(_WEIGHT_G[i["sku"]] * i["qty"] for i in args["items"])
        base = {"EU": 590, "US": 890}.get(args["region"], 1490)
        return {"grams": grams, "cents": base + 100 * (grams // 500)}

    async def decide(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        status = "approved"
        if args["risk"]["review"]:
            status = "manual_review"
        elif not args["stock"]["all_in_stock"]:
            status = "partial_shipment"
        total = args["pricing"]["subtotal_cents"] + args["shipping"]["cents"]
        return {"status": status, "total_cents": total,
                "backordered": args["stock"]["backordered"]}

    async def invoice(args: dict[str, Any]) -> dict[str, Any]:
        await work()
        d = args["decision"]
        lines = [f"order {args['order_id']}: {d['status']}",
                 f"total EUR {d['total_cents'] / 100:.2f}"]
        if d["backordered"]:
            lines.append("backordered: " + ", ".join(d["backordered"]))
        return {"text": "\n".join(lines)}

    def tool(id_: str, fn: Any, inp: dict[str, Any], out: dict[str, Any]) -> ToolBinding:
        return ToolBinding(id=id_, version="1", execute=fn, recovery="pure",
                           input_schema=inp, output_schema=out)

    items = {"type": "object", "required": ["items"]}
    return HostCatalog([
        tool("load_order", load_order, {"type": "object", "required": ["order_id"]},
             _ORDER_SCHEMA),
        tool("price_items", price_items, items,
             {"type": "object", "required": ["subtotal_cents"],
              "properties": {"subtotal_cents": {"type": "integer"}}}),
        tool("check_stock", check_stock, items,
             {"type": "object", "required": ["all_in_stock", "backordered"]}),
        tool("score_risk", score_risk, {"type": "object", "required": ["customer"]},
             {"type": "object", "required": ["score", "review"]}),
        tool("quote_shipping", quote_shipping,
             {"type": "object", "required": ["items", "region"]},
             {"type": "object", "required": ["cents"],
              "properties": {"cents": {"type": "integer"}}}),
        tool("decide", decide, {"type": "object",
                                "required": ["pricing", "stock", "risk", "shipping"]},
             {"type": "object", "required": ["status", "total_cents"]}),
        tool("invoice", invoice, {"type": "object", "required": ["decision", "order_id"]},
             {"type": "object", "required": ["text"],
              "properties": {"text": {"type": "string"}}}),
    ])


def _ref(node: str, *path: str) -> dict[str, Any]:
    return {"$ref": {"node": node, "path": list(path)}}


def build_program(order_id: str = "ord-1042") -> ExecutionGraphProgram:
    plan = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "order", "binding": "load_order", "version": "1",
         "args": {"order_id": order_id}},
        {"id": "pricing", "binding": "price_items", "version": "1",
         "args": {"items": _ref("order", "items")}},
        {"id": "stock", "binding": "check_stock", "version": "1",
         "args": {"items": _ref("order", "items")}},
        {"id": "risk", "binding": "score_risk", "version": "1",
         "args": {"customer": _ref("order", "customer")}},
        {"id": "shipping", "binding": "quote_shipping", "version": "1",
         "args": {"items": _ref("order", "items"), "region": _ref("order", "region")}},
        {"id": "decision", "binding": "decide", "version": "1",
         "args": {"pricing": _ref("pricing"), "stock": _ref("stock"), "risk": _ref("risk"),
                  "shipping": _ref("shipping")}},
        {"id": "invoice", "binding": "invoice", "version": "1",
         "args": {"decision": _ref("decision"), "order_id": _ref("order", "order_id")}},
    ]}
    return ExecutionGraphProgram(id="order-review", version="1", plan=plan)


