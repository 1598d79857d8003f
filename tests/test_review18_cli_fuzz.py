"""The operator CLI's inputs, fuzzed through click's CliRunner: store URIs (``sqlite:///``
with odd paths, ``mongodb://`` with odd hosts, options and databases), keys, cursors,
limits, ``--json``, reasons and ``resolve --output`` JSON. Whatever the input: no
traceback, an exit code docs/cli.md gives for it, one ``error:`` line on failure, and
nothing written (or created) by a command that was refused.

Deterministic in CI (``derandomize=True``); ``HYPOTHESIS_PROFILE=deep`` runs 25 times more.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentium_graph.cli import cli
from tests._review18_damage_tasks import KEYS, build_tasks
from tests.test_review18_damage import time_limit

sqlite_store = pytest.importorskip("agentium_graph_sqlite")

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
pytestmark = pytest.mark.timeout(7200 if DEEP else 300)


def fuzz_settings(examples: int) -> settings:
    return settings(derandomize=not DEEP, deadline=None, database=None,
                    max_examples=examples * 25 if DEEP else examples,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


# Text as a shell hands it over: any character, lone surrogates (invalid bytes) included.
ODD_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | \
    st.sampled_from(["", " ", "\x00", "\udcff", "~", "..", "%2F", "a" * 201, "\x1b[2J",
                     "\u202e", "k:1", "done", "rr"])


def invoke(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    with time_limit(repr(args)[:200]):
        result = CliRunner(env=env).invoke(cli, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args!r}: traceback ({result.exception!r})"
                             ) from result.exception
    if result.exit_code:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert "Traceback" not in result.stderr
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "tasks.db"

    async def build() -> None:
        async with sqlite_store.SQLiteDurableTaskStore(path) as store:
            await build_tasks(store)
    asyncio.run(build())
    return path


def dump(path: Path) -> list[Any]:
    with sqlite3.connect(path) as conn:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE "
                                             "type = 'table' ORDER BY name")]
        return [sorted(map(repr, conn.execute(f"SELECT * FROM {t}"))) for t in tables]


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


COMMANDS = st.sampled_from([["list"], ["list", "--json"], ["inspect", "done"],
                            ["timeline", "done", "--json"], ["cancel", "done", "--reason", "r"]])


def test_odd_sqlite_uris_create_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cwd"
    root.mkdir()

    @fuzz_settings(60)
    @given(path=ODD_TEXT, slashes=st.sampled_from(["sqlite:", "sqlite:/", "sqlite://",
                                                   "sqlite:///", "sqlite:////", "SQLITE:///"]),
           command=COMMANDS, suffix=st.sampled_from(["", "?mode=rw", "#x", "/", "/.."]))
    def check(path: str, slashes: str, command: list[str], suffix: str) -> None:
        before = files(root)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            code, _, err = invoke(["--store", slashes + path + suffix, *command])
        finally:
            os.chdir(cwd)
        assert code in (2, 4), (code, err)  # a bad URI, or no task database there
        assert files(root) == before, "a refused command created a file"
    check()


HOSTS = st.sampled_from(["127.0.0.1:1", "localhost:1", "[::1]:1", "", "bad host", "h:99999",
                         "h:0", "a,b", "%zz", "user:pw@127.0.0.1:1", "u:p:q@h:1", "@", ":",
                         "127.0.0.1:1,127.0.0.1:2", "/tmp/mongodb-27017.sock"])
OPTIONS = st.lists(st.sampled_from([
    "serverSelectionTimeoutMS=abc", "serverSelectionTimeoutMS=-1", "tls=maybe", "w=0",
    "replicaSet=", "authSource=", "unknownOption=1", "connectTimeoutMS=1e9", "retryWrites=x",
    "=", "&", "readPreference=nearest", "directConnection=true", "appname=\x1b"]), max_size=3)


def test_odd_mongodb_uris_are_usage_or_store_errors() -> None:
    pytest.importorskip("agentium_graph_mongodb")

    @fuzz_settings(40)
    @given(scheme=st.sampled_from(["mongodb://", "mongodb+srv://", "mongodb:/", "mongo://"]),
           host=HOSTS, database=ODD_TEXT, options=OPTIONS, command=COMMANDS,
           flag=st.sampled_from([[], ["--database", "x.y"], ["--database", ""],
                                 ["--database", "a" * 80]]))
    def check(scheme: str, host: str, database: str, options: list[str],
              command: list[str], flag: list[str]) -> None:
        # Every server here is unreachable: keep the wait short when the URI is accepted.
        query = "&".join([*options, "serverSelectionTimeoutMS=100", "connectTimeoutMS=100"])
        uri = f"{scheme}{host}/{database}?{query}"
        code, _, err = invoke(["--store", uri, *flag, *command])
        assert code in (2, 4), (code, err)
        assert "pw@" not in err and ":pw" not in err  # a password is shown as ***
    check()


LIMITS = st.one_of(st.integers(-3, 1002).map(str), st.sampled_from(
    ["", "x", "1.5", "1e3", "0x10", " 5", "9" * 30, "-0", "\udcff"]))


def test_odd_keys_cursors_limits_and_filters_of_read_commands(db: Path) -> None:
    before = dump(db)
    store = ["--store", f"sqlite:///{db}"]

    @fuzz_settings(80)
    @given(key=ODD_TEXT, limit=LIMITS, cursor=ODD_TEXT, json_flag=st.booleans(),
           which=st.sampled_from(["inspect", "timeline", "list", "timeline-all"]),
           status=st.sampled_from([None, "running", "zombie", ""]))
    def check(key: str, limit: str, cursor: str, json_flag: bool, which: str,
              status: str | None) -> None:
        args = {"inspect": ["inspect", key],
                "timeline": ["timeline", key, "--limit", limit, "--cursor", cursor],
                "timeline-all": ["timeline", key, "--all"],
                "list": ["list", "--limit", limit, "--after", key,
                         *(["--status", status] if status is not None else [])]}[which]
        code, out, _ = invoke([*store, *args, *(["--json"] if json_flag else [])])
        expected = {0, 2, 3} if which != "list" else {0, 2}
        assert code in expected, (args, code)
        if code == 0 and which == "inspect":
            assert key in KEYS
        if code == 0 and json_flag:
            json.loads(out)
    check()
    assert dump(db) == before, "a read command wrote"


JSON_TEXT = st.one_of(
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                 lambda inner: st.lists(inner, max_size=3) |
                 st.dictionaries(st.text(max_size=5), inner, max_size=3),
                 max_leaves=8).map(lambda v: json.dumps(v, allow_nan=True)),
    ODD_TEXT,
    st.integers(1, 5000).map(lambda n: "[" * n + "]" * n),
    st.sampled_from(['{"charge_id": "c", "amount": 500}', "NaN", '{"a": 1e999}',
                     '{"charge_id": "\\ud800", "amount": 1}', "1" * 5000]))


def test_odd_resolutions_and_cancels_write_only_when_accepted(db: Path, tmp_path: Path
                                                              ) -> None:
    with sqlite3.connect(db) as conn:
        [(action_id,)] = conn.execute("SELECT action_id FROM actions WHERE key = 'rr'")

    @fuzz_settings(60)
    @given(output=JSON_TEXT, actor=ODD_TEXT, key=st.sampled_from(["rr", "done", "nope"]) |
           ODD_TEXT, action=st.sampled_from([action_id, "act_nope"]) | ODD_TEXT,
           reason=ODD_TEXT, which=st.sampled_from(["output", "absent", "both", "cancel"]),
           json_flag=st.booleans())
    def check(output: str, actor: str, key: str, action: str, reason: str, which: str,
              json_flag: bool) -> None:
        copy = tmp_path / "copy.db"
        copy.write_bytes(db.read_bytes())
        before = dump(copy)
        if which == "cancel":
            args = ["cancel", key, "--reason", reason]
        else:
            args = ["resolve", key, action, "--actor", actor,
                    *(["--output", output] if which != "absent" else []),
                    *(["--absent"] if which != "output" else [])]
        code, out, _ = invoke(["--store", f"sqlite:///{copy}", *args,
                               *(["--json"] if json_flag else [])])
        assert code in (0, 1, 2, 3), (args, code)
        if code:
            assert dump(copy) == before, f"refused {args!r} wrote"
        elif json_flag:
            json.loads(out)
        if which == "both":
            assert code == 2
    check()


def test_resolve_output_nested_too_deeply_is_a_usage_error(db: Path, tmp_path: Path) -> None:
    # Was a RecursionError traceback (exit 1) from json.loads for about 990 levels and more.
    with sqlite3.connect(db) as conn:
        [(action_id,)] = conn.execute("SELECT action_id FROM actions WHERE key = 'rr'")
    copy = tmp_path / "copy.db"
    copy.write_bytes(db.read_bytes())
    before = dump(copy)
    for depth in (1000, 5000):
        code, _, err = invoke(["--store", f"sqlite:///{copy}", "resolve", "rr", action_id,
                               "--actor", "op", "--output", "[" * depth + "]" * depth])
        assert code == 2 and "nested too deeply" in err
    assert dump(copy) == before
