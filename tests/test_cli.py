"""The ``agentium-graph`` operator CLI against a real SQLite file, through click's CliRunner."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from agentium_graph import (
    BudgetExhaustedError,
    ExecutionGraphRuntime,
    InMemoryDurableTaskStore,
    InvalidTransitionError,
    NodeFailedError,
    StoreUnavailableError,
    TaskCanceledError,
    TaskView,
    ToolBinding,
)
from agentium_graph import cli as cli_module
from agentium_graph._store_uri import open_store_uri, parse_store_uri, redact
from agentium_graph.cli import EXIT_NOT_FOUND, EXIT_STORE, EXIT_USAGE, cli
from agentium_graph.errors import ConfigurationError, StoreError
from agentium_graph.store import AcquireLeaseRequest, TaskHeader
from tests.conftest import INT_OUT, Calls, chain_plan, make_catalog, program

sqlite = pytest.importorskip("agentium_graph_sqlite")

ODD_KEY = "odd[bold]key"


def _boom(args: dict[str, Any]) -> Any:
    raise RuntimeError("disk on fire")


def _catalog() -> Any:
    return make_catalog(Calls(), [ToolBinding(
        id="boom", version="1", execute=_boom, recovery="pure",
        input_schema={"type": "object"}, output_schema=INT_OUT)])


async def _populate(path: Path) -> None:
    failing = {"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "inc", "version": "1", "args": {"x": 1}},
        {"id": "b", "binding": "boom", "version": "1", "args": {}, "dependsOn": ["a"]}]}
    async with sqlite.SQLiteDurableTaskStore(path) as store:
        rt = ExecutionGraphRuntime(catalog=_catalog(), store=store)
        await rt.create("done", program(chain_plan(3)))
        await rt.run("done", worker_id="w1")
        await rt.create("failed", program(failing))
        with pytest.raises(NodeFailedError):
            await rt.run("failed", worker_id="w1")
        await rt.create("idle", program(chain_plan(2)))
        await rt.create(ODD_KEY, program(chain_plan(1)))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.db"
    asyncio.run(_populate(path))
    return path


def invoke(db: Path | str, *args: str, env: dict[str, str] | None = None) -> Result:
    store = db if isinstance(db, str) else f"sqlite:///{db}"
    return CliRunner().invoke(cli, ["--store", store, *args],
                              env={"COLUMNS": "200", **(env or {})})


def ok_json(db: Path, *args: str) -> Any:
    result = invoke(db, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


# --- list ---------------------------------------------------------------------------------

def test_list_json_and_table(db: Path) -> None:
    data = ok_json(db, "list")
    assert set(data) == {"tasks", "next_after"} and data["next_after"] is None
    by_key = {t["key"]: t for t in data["tasks"]}
    assert [t["key"] for t in data["tasks"]] == sorted(by_key)
    assert {k: t["status"] for k, t in by_key.items()} == {
        "done": "completed", "failed": "failed", "idle": "pending", ODD_KEY: "pending"}
    assert set(by_key["done"]) == set(TaskHeader.model_fields)
    assert by_key["done"]["counters"]["work_attempts"] == 3

    table = invoke(db, "list")
    assert table.exit_code == 0, table.output
    for key in ("done", "failed", "idle", ODD_KEY, "completed", "pending"):
        assert key in table.stdout  # rich markup in a key is printed literally


def test_list_filters_by_status_and_pages(db: Path) -> None:
    assert [t["key"] for t in ok_json(db, "list", "--status", "pending")["tasks"]] == [
        "idle", ODD_KEY]
    first = ok_json(db, "list", "--limit", "2")
    assert [t["key"] for t in first["tasks"]] == ["done", "failed"]
    assert first["next_after"] == "failed"
    rest = ok_json(db, "list", "--limit", "2", "--after", first["next_after"])
    assert [t["key"] for t in rest["tasks"]] == ["idle", ODD_KEY]
    assert rest["next_after"] is None
    assert "--after failed" in invoke(db, "list", "--limit", "2").stdout
    empty = invoke(db, "list", "--status", "canceled")
    assert empty.exit_code == 0 and "no tasks with status canceled" in empty.stdout


def test_list_rejects_unknown_status_as_usage_error(db: Path) -> None:
    assert invoke(db, "list", "--status", "bogus").exit_code == EXIT_USAGE


# --- inspect ------------------------------------------------------------------------------

def test_inspect_json_is_the_task_view(db: Path) -> None:
    data = ok_json(db, "inspect", "done")
    assert set(data) == set(TaskView.model_fields)
    view = TaskView.model_validate(data)
    assert view.key == "done" and view.status == "completed" and view.verified
    assert view.planner is None  # a static plan has no planner
    assert view.counters["work_attempts"] == 3 and view.limits["work_attempts"] is not None
    assert [view.nodes[n].output for n in ("n0", "n1", "n2")] == [
        {"value": 1}, {"value": 2}, {"value": 3}]
    for node in view.nodes.values():
        assert node.state == "completed" and [a.fence for a in node.attempts] == [1]
        assert node.output_digest and node.output_digest.startswith("sha256:")


def test_inspect_table_shows_summary_nodes_and_errors(db: Path) -> None:
    result = invoke(db, "inspect", "failed")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for fragment in ("task failed", "status", "failed", "verified", "yes", "work_attempts",
                     "inc@1", "boom@1", "#1 fence 1 completed", "#1 fence 1 failed",
                     "tool_error", "disk on fire", "counters"):
        assert fragment in out, fragment
    digest = ok_json(db, "inspect", "failed")["nodes"]["a"]["output_digest"]
    short = digest[:len("sha256:") + 12]
    assert short + "…" in out and digest not in out


def test_inspect_shows_what_the_planner_did(tmp_path: Path) -> None:
    from agentium_graph import ExecutionGraphProgram, PlannerConfig, PlanValidationError
    from agentium_graph.providers import ScriptedProvider, ScriptedTurn

    path = tmp_path / "planned.db"
    unknown = json.dumps({"schemaVersion": 1, "revision": 1, "nodes": [
        {"id": "a", "binding": "teleport", "version": "1", "args": {}}]})

    async def populate() -> None:
        provider = ScriptedProvider([ScriptedTurn(text=unknown), ScriptedTurn(text=unknown)])
        planned = ExecutionGraphProgram(id="planned", version="1", planner=PlannerConfig(
            provider=provider, host_instructions="Plan.", max_corrections=1))
        async with sqlite.SQLiteDurableTaskStore(path) as store:
            rt = ExecutionGraphRuntime(catalog=_catalog(), store=store)
            await rt.create("p", planned)
            with pytest.raises(PlanValidationError):
                await rt.run("p", worker_id="w1")

    asyncio.run(populate())
    planner = ok_json(path, "inspect", "p")["planner"]
    assert planner["state"] == "failed" and planner["mode"] == "complete"
    assert (planner["proposals"], planner["rejected"], planner["max_corrections"]) == (2, 2, 1)
    assert planner["provider"]["id"] == "scripted"
    assert any("teleport" in d["message"] for d in planner["last_diagnostics"])
    table = invoke(path, "inspect", "p")
    assert table.exit_code == 0, table.output
    for fragment in ("planner", "failed: 2 proposal(s), 2 rejected", "last rejection",
                     "teleport"):
        assert fragment in table.stdout, fragment


def test_inspect_never_writes(db: Path) -> None:
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for args in (("inspect", "done"), ("inspect", "idle", "--json"), ("list",),
                 ("timeline", "done", "--all")):
        assert invoke(db, *args).exit_code == 0
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert ok_json(db, "inspect", "idle")["lease"] is None


# --- timeline -----------------------------------------------------------------------------

def test_timeline_pages_with_cursor_and_all(db: Path) -> None:
    first = ok_json(db, "timeline", "done", "--limit", "3")
    assert set(first) == {"key", "events", "next_cursor", "total"}
    assert [e["seq"] for e in first["events"]] == [1, 2, 3]
    assert first["events"][0]["kind"] == "task_created"
    total = first["total"]
    second = ok_json(db, "timeline", "done", "--limit", "3", "--cursor", first["next_cursor"])
    assert [e["seq"] for e in second["events"]] == [4, 5, 6]
    everything = ok_json(db, "timeline", "done", "--all", "--limit", "2")
    assert [e["seq"] for e in everything["events"]] == list(range(1, total + 1))
    assert everything["next_cursor"] is None

    table = invoke(db, "timeline", "done", "--limit", "3")
    assert table.exit_code == 0
    assert "task_created" in table.stdout and f"3 of {total} event(s)" in table.stdout
    assert f"--cursor {first['next_cursor']}" in table.stdout


def test_timeline_rejects_a_foreign_cursor(db: Path) -> None:
    cursor = ok_json(db, "timeline", "done", "--limit", "1")["next_cursor"]
    assert_one_line_error(invoke(db, "timeline", "idle", "--cursor", cursor), EXIT_USAGE,
                          "invalid timeline cursor")
    assert_one_line_error(invoke(db, "timeline", "done", "--cursor", "garbage"), EXIT_USAGE)


# --- cancel -------------------------------------------------------------------------------

def test_cancel_idle_task_is_applied_by_the_next_run(db: Path) -> None:
    result = invoke(db, "cancel", "idle", "--reason", "operator said stop")
    assert result.exit_code == 0, result.output
    assert "recorded" in result.stdout and "next run" in result.stdout
    again = ok_json(db, "cancel", "idle", "--reason", "second thoughts")
    assert again["recorded"] is False and again["observed_by"] is None
    assert again["header"]["cancel"]["reason"] == "operator said stop"
    assert again["header"]["status"] == "pending"  # the CLI never runs the task

    async def run_it() -> str:
        async with sqlite.SQLiteDurableTaskStore(db) as store:
            rt = ExecutionGraphRuntime(catalog=_catalog(), store=store)
            with pytest.raises(TaskCanceledError):
                await rt.run("idle", worker_id="w2")
            return (await rt.inspect("idle")).status

    assert asyncio.run(run_it()) == "canceled"


def test_cancel_names_the_worker_holding_the_lease(db: Path) -> None:
    async def lease() -> None:
        async with sqlite.SQLiteDurableTaskStore(db) as store:
            await store.acquire_lease(AcquireLeaseRequest(
                key="idle", worker_id="w9", ttl_seconds=30, now=datetime.now(UTC)))

    asyncio.run(lease())
    first = invoke(db, "cancel", "idle", "--reason", "stop")
    # The worker may be gone (SIGKILLed): the message says when its lease lets a run apply it.
    assert "worker 'w9' holds the lease (fence 1, until " in first.stdout
    assert "if that worker is gone, the next run of the task after the lease expires" in \
        first.stdout.replace("\n", " ")
    data = ok_json(db, "cancel", "idle", "--reason", "stop")
    assert data == {**data, "key": "idle", "recorded": False, "observed_by": "w9"}
    assert data["header"]["cancel"]["reason"] == "stop"
    assert data["header"]["lease"]["owner"] == "w9"
    human = invoke(db, "cancel", "idle", "--reason", "stop")
    assert "already requested" in human.stdout
    assert "w9" in invoke(db, "inspect", "idle").stdout


def test_cancel_of_a_budget_stopped_task_is_applied_at_once(db: Path) -> None:
    """A run would stop at the same pinned budget again, so nothing would apply the cancel
    (found by review 26's user journey: such a task stayed pending for good)."""
    async def stopped() -> None:
        async with sqlite.SQLiteDurableTaskStore(db) as store:
            rt = ExecutionGraphRuntime(catalog=_catalog(), store=store)
            await rt.create("broke", program(chain_plan(3)), budgets={"tool_calls": 1})
            with pytest.raises(BudgetExhaustedError):
                await rt.run("broke", worker_id="w1")

    asyncio.run(stopped())
    assert ok_json(db, "inspect", "broke")["status"] == "pending"
    listed = invoke(db, "list").stdout
    assert "pending (budget)" in listed and listed.count("(budget)") == 1
    data = ok_json(db, "cancel", "broke", "--reason", "out of budget")
    assert data["applied"] is True and data["header"]["status"] == "canceled"
    view = ok_json(db, "inspect", "broke")
    assert view["status"] == "canceled"
    assert {n["state"] for n in view["nodes"].values()} <= {"completed", "canceled"}
    # An idle task that is not budget-stopped is still left to the next run.
    assert ok_json(db, "cancel", "idle", "--reason", "later")["applied"] is False


def test_cancel_of_a_finished_task_changes_nothing(db: Path) -> None:
    result = invoke(db, "cancel", "done", "--reason", "too late")
    assert result.exit_code == 0 and "already completed" in result.stdout
    data = ok_json(db, "cancel", "done", "--reason", "too late")
    assert data["recorded"] is False and data["header"]["cancel"] is None


def test_cancel_needs_a_reason(db: Path) -> None:
    assert invoke(db, "cancel", "idle").exit_code == EXIT_USAGE
    assert invoke(db, "cancel", "idle", "--reason", " ").exit_code == EXIT_USAGE


# --- errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("inspect", "nope"), ("timeline", "nope"),
                                  ("cancel", "nope", "--reason", "x"),
                                  ("inspect", "nope", "--json")])
def test_unknown_key_exits_3_with_one_line(db: Path, args: tuple[str, ...]) -> None:
    assert_one_line_error(invoke(db, *args), EXIT_NOT_FOUND, "no task with key 'nope'")


@pytest.mark.parametrize("uri", ["sqlte:///x.db", "sqlite:/x.db", "sqlite://x.db",
                                 "sqlite:///", "sqlite:///:memory:", "tasks.db",
                                 "mongodb://", "mongodb:/host"])
def test_bad_store_uri_is_a_one_line_usage_error(uri: str) -> None:
    assert_one_line_error(invoke(uri, "list"), EXIT_USAGE, "accepted forms")


def test_missing_directory_exits_4_and_creates_nothing(tmp_path: Path) -> None:
    result = invoke(tmp_path / "no-such-dir" / "x.db", "list")
    assert_one_line_error(result, EXIT_STORE, "directory does not exist")
    assert not (tmp_path / "no-such-dir").exists()
    assert_one_line_error(invoke(tmp_path / "absent.db", "inspect", "k"), EXIT_STORE,
                          "no SQLite task database")
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.parametrize("content", [b"this is not a database\n" * 100,
                                     b"SQLite format 3\x00" + b"\xff" * 4000])
def test_corrupt_file_exits_4_and_is_left_unchanged(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(content)
    for args in (("list",), ("inspect", "k", "--json"), ("cancel", "k", "--reason", "x")):
        assert_one_line_error(invoke(path, *args), EXIT_STORE)
    assert path.read_bytes() == content


def test_mongodb_without_its_package_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulate a machine without the package: None in sys.modules makes the import fail.
    monkeypatch.setitem(sys.modules, "agentium_graph_mongodb", None)
    assert_one_line_error(invoke("mongodb://localhost:27017/ops", "list"), EXIT_STORE,
                          "pip install agentium-graph-mongodb")


def test_store_uri_from_environment(db: Path) -> None:
    result = CliRunner().invoke(cli, ["list", "--json"],
                                env={"AGENTIUM_STORE": f"sqlite:///{db}"})
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["tasks"]) == 4


class _TrackedStore(InMemoryDurableTaskStore):
    def __init__(self, fail_with: Exception | None = None) -> None:
        super().__init__()
        self.closed = 0
        self.fail_with = fail_with

    async def get_header(self, key: str) -> TaskHeader | None:
        if self.fail_with is not None:
            raise self.fail_with
        return await super().get_header(key)

    async def close(self) -> None:
        self.closed += 1
        await super().close()


@pytest.mark.parametrize(("error", "code"), [
    (None, EXIT_NOT_FOUND),
    (StoreUnavailableError("the store stayed locked; retry later"), EXIT_STORE),
    (InvalidTransitionError("something odd"), 1),
])
def test_store_is_always_closed_and_errors_map_to_exit_codes(
        monkeypatch: pytest.MonkeyPatch, error: Exception | None, code: int) -> None:
    store = _TrackedStore(error)
    monkeypatch.setattr(cli_module, "open_store_uri", lambda *a, **k: store)
    assert_one_line_error(invoke("sqlite:///unused.db", "timeline", "k"), code)
    assert store.closed == 1


def test_multi_line_messages_are_folded_to_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    store = _TrackedStore(StoreError("first line\nsecond line"))
    monkeypatch.setattr(cli_module, "open_store_uri", lambda *a, **k: store)
    assert_one_line_error(invoke("sqlite:///unused.db", "cancel", "k", "--reason", "r"),
                          EXIT_STORE, "first line second line")


def test_python_m_agentium_graph_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "agentium_graph", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("list", "inspect", "cancel", "timeline", "--store"):
        assert command in proc.stdout


# --- store URIs ---------------------------------------------------------------------------

def test_parse_store_uri_forms(tmp_path: Path) -> None:
    assert parse_store_uri("sqlite:///data/t.db").path == Path("data/t.db")
    assert parse_store_uri("sqlite:////abs/t.db").path == Path("/abs/t.db")
    assert parse_store_uri("SQLite:///t.db").scheme == "sqlite"
    assert parse_store_uri("mongodb://h:27017/ops?w=majority").database == "ops"
    assert parse_store_uri("mongodb://h").database == "agentium"
    assert parse_store_uri("mongodb+srv://u:p@h/ops", database="other").database == "other"
    with pytest.raises(ConfigurationError, match="--database applies only"):
        parse_store_uri("sqlite:///t.db", database="x")
    with pytest.raises(ConfigurationError, match=r"did you mean sqlite:///t\.db"):
        parse_store_uri("t.db")
    with pytest.raises(ConfigurationError) as info:
        parse_store_uri("nosql://u:secret@h/db")
    assert "secret" not in str(info.value)
    assert redact("mongodb://u:secret@h/db") == "mongodb://u:***@h/db"
    assert redact("mongodb://h/db") == "mongodb://h/db"


def test_open_store_uri_builds_a_lazy_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    store = open_store_uri(f"sqlite:///{path}")
    assert isinstance(store, sqlite.SQLiteDurableTaskStore)
    assert store.capabilities.durable and not path.exists()  # constructing does no I/O
    with pytest.raises(StoreError, match="no SQLite task database"):
        open_store_uri(f"sqlite:///{path}", must_exist=True)
