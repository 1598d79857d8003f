"""Acceptance fixtures: one durable store spec per parameter, a case runner for workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from acceptance._graph import CallLog
from acceptance._stores import open_store
from agentium_graph import DurableTaskStore
from agentium_graph.providers import read_call_log
from agentium_graph.store import TaskSnapshot
from agentium_graph_mongodb import pytest_plugin

ROOT = Path(__file__).resolve().parent.parent
DURABLE_STORES = ["sqlite", "mongodb"]

# The MongoDB server fixtures (one server per session, one database per test) and the
# pytest header line naming which server was used.
mongodb_server = pytest_plugin.mongodb_server
mongodb_uri = pytest_plugin.mongodb_uri
mongodb_database = pytest_plugin.mongodb_database
pytest_report_header = pytest_plugin.pytest_report_header


def store_spec(kind: str, tmp: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "sqlite":
        return {"factory": "acceptance._stores:sqlite_store",
                "kwargs": {"path": str(tmp / "tasks.db")}}
    if kind == "mongodb":
        return {"factory": "acceptance._stores:mongodb_store",
                "kwargs": {"uri": request.getfixturevalue("mongodb_uri"),
                           "database": request.getfixturevalue("mongodb_database")}}
    raise AssertionError(kind)


@dataclass
class Case:
    """One acceptance case: a store, a call log, and fresh worker processes."""

    spec: dict[str, Any]
    log: CallLog
    key: str = "task-1"

    def config(self, **kw: Any) -> dict[str, Any]:
        return {"store": self.spec, "log": str(self.log.path), "key": self.key,
                "worker": "w1", **kw}

    def start(self, **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "acceptance._worker", json.dumps(self.config(**kw))],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})

    def run(self, **kw: Any) -> tuple[int, dict[str, Any] | None, str]:
        proc = self.start(**kw)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, _last_json(out), err

    def run_killed(self, **kw: Any) -> None:
        code, out, err = self.run(**kw)
        assert code == -signal.SIGKILL, f"worker was not killed (exit {code}): {out} {err}"

    def starts(self, node: str) -> int:
        return sum(1 for e in self.log.entries() if e["node"] == node and e["event"] == "start")

    @property
    def provider_log(self) -> Path:
        """The scripted provider's call log, shared by every process of the case."""
        return self.log.path.with_name("provider.log")

    def provider_calls(self) -> Counter[str]:
        """Provider calls so far, by request digest."""
        log = self.provider_log
        return Counter(r.request_digest for r in read_call_log(log)) if log.exists() \
            else Counter()

    def open(self) -> DurableTaskStore:
        return open_store(self.spec)


async def snapshot(store: DurableTaskStore, key: str) -> TaskSnapshot:
    snap = await store.get_task(key)
    assert snap is not None
    return snap


def check_books(before: TaskSnapshot, after: TaskSnapshot) -> None:
    """What every recovery must keep: counters never refunded (against the snapshot taken
    after the kill) and never past their limits, completed nodes' attempts untouched, and
    each node's attempts under strictly increasing fences."""
    for name, value in before.header.counters.items():
        assert after.header.counters[name] >= value, f"{name} refunded"
    for name, value in after.header.counters.items():
        limit = after.header.limits.get(name)
        assert limit is None or value <= limit, f"{name} {value} past its limit {limit}"
    for node_id, rec in before.nodes.items():
        if rec.state == "completed":
            assert after.nodes[node_id].attempts == rec.attempts, f"{node_id} re-ran"
    for node_id, rec in after.nodes.items():
        fences = [a.fence for a in rec.attempts]
        assert fences == sorted(set(fences)), f"{node_id} fences not increasing: {fences}"


def _last_json(out: str) -> dict[str, Any] | None:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    return None


@pytest.fixture(params=DURABLE_STORES)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    yield Case(spec=store_spec(request.param, tmp_path, request),
               log=CallLog(tmp_path / "calls.log"))


@pytest.fixture
async def store_of(case: Case) -> AsyncIterator[DurableTaskStore]:
    store = case.open()
    yield store
    await store.close()
