"""``agentium-graph demo``: run the order pipeline in a worker process, SIGKILL that worker
mid-graph, recover in a fresh process, and report what was reused and what restarted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentium_graph import DurableTaskStore, ExecutionGraphRuntime, TaskView
from agentium_graph._store_uri import open_store_uri, redact
from agentium_graph.demo.pipeline import build_catalog, build_program, read_call_log
from agentium_graph.errors import AgentiumGraphError, ConfigurationError
from agentium_graph.store._forwarding import ForwardingStore
from agentium_graph.store._requests import CreateTaskRequest, CreateTaskResult

KEY = "order-review:ord-1042"
WORKER = "demo-worker"


class DemoFailedError(AgentiumGraphError):
    """The demo's own run went wrong (a worker exited early, made no progress or failed to
    recover, or no temporary directory could be made): reported by the CLI as one
    ``error:`` line. A worker's failure is named by the last line of its stderr (the
    exception); the whole stderr is in ``details["stderr"]``."""

    code = "demo_failed"


def _worker_failed(what: str, stderr: str) -> DemoFailedError:
    """``what`` and the last meaningful line of a worker's ``stderr``: a traceback ends with
    its exception's line, and the ``error:`` line of the CLI holds one line, not a
    traceback."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "it wrote nothing to stderr"
    return DemoFailedError(f"{what}: {last}", details={"stderr": stderr})


def open_demo_store(uri: str) -> DurableTaskStore:
    return open_store_uri(uri)


async def worker_main(uri: str, key: str, worker: str, delay: float,
                      call_log: str | None) -> dict[str, Any]:
    """The body of a worker process: run (or recover) the task to the end."""
    store = open_demo_store(uri)
    try:
        runtime = ExecutionGraphRuntime(
            catalog=build_catalog(delay=delay, call_log=Path(call_log) if call_log else None),
            store=store, require_durable=True, poll_interval=0.2)
        result = await runtime.run(key, worker)
        return {"ok": True, "output": result.output}
    finally:
        await store.close()


def exit_when_parent_dies() -> None:
    """Watch stdin, a pipe whose only write end the parent demo holds, in a daemon thread
    and end this worker at once when it reaches EOF: the demo has gone, however it died
    (even SIGKILL, which runs none of its cleanup), and no one would stop this worker. A
    pipe rather than polling the parent pid: no delay and no race with pid reuse."""
    def watch() -> None:
        try:
            while os.read(0, 4096):  # the demo never writes; data would only be ignored
                pass
        except OSError:
            return  # not a pipe we can watch: keep running rather than guess
        os.write(2, b"demo worker: the demo process is gone; exiting\n")
        os._exit(1)  # the task's progress is durable: a later run recovers it

    threading.Thread(target=watch, name="demo-parent-watch", daemon=True).start()


def _spawn(uri: str, delay: float, call_log: Path, workdir: Path, name: str,
           workers: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Start a worker process, recorded in ``workers`` so it is stopped however the demo
    ends. Its output goes to files in ``workdir`` (a pipe nobody reads while the demo waits
    could fill and stall it). Its stdin is a pipe the demo keeps open and never writes: when
    the demo dies the pipe closes and the worker exits (:func:`exit_when_parent_dies`)."""
    cmd = [sys.executable, "-m", "agentium_graph.demo", "--store", uri, "--key", KEY,
           "--worker", WORKER, "--delay", str(delay), "--call-log", str(call_log),
           "--exit-with-parent"]
    # The demo reads what a worker writes as UTF-8, whatever the user's PYTHONIOENCODING
    # (utf-16 would turn its JSON result into bytes json cannot read).
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONUTF8": "1"}
    with open(workdir / f"{name}.out", "wb") as out, open(workdir / f"{name}.err", "wb") as err:
        process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                   env=env)
    workers.append(process)
    return process


def _output(workdir: Path, name: str, stream: str) -> str:
    return (workdir / f"{name}.{stream}").read_text(encoding="utf-8", errors="replace")


def _result(stdout: str) -> dict[str, Any]:
    """The recovery worker's result: the JSON object its last line of output holds."""
    lines = stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:  # JSONDecodeError, or a number too long to convert
        result = None
    if not isinstance(result, dict) or not isinstance(result.get("output"), dict):
        shown = " ".join(lines[-1].split())[:200] if lines else "nothing"
        raise DemoFailedError(
            f"the recovery worker's output is not its JSON result (it wrote {shown!r}); run "
            "the demo again, and report this if it persists", details={"stdout": stdout})
    return result


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL and reap every worker still running (a worker's progress is durable: the
    next run of the task recovers it). Idempotent."""
    for process in workers:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        process.wait()
        if process.stdin is not None:  # only once it is dead: closing it ends the worker
            process.stdin.close()


async def _completed(store: DurableTaskStore) -> int:
    snap = await store.get_task(KEY)
    return 0 if snap is None else sum(n.state == "completed" for n in snap.nodes.values())


class Stopped(Exception):
    """The demo was stopped by a signal (SIGTERM, SIGHUP) after stopping its workers."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


async def run_demo(uri: str | None, kill_after: int, delay: float, console: Console,
                   workers: list[subprocess.Popen[bytes]] | None = None) -> int:
    """Run the walkthrough; returns the exit code. Whatever ends it (an error, Ctrl-C,
    SIGTERM or SIGHUP: :class:`Stopped`), the worker processes it started are killed and
    reaped, and the temporary directory it made (with its database, unless ``--store``
    named one) is removed. ``workers`` (optional) collects the worker processes for a
    caller's own last-resort cleanup."""
    workers = [] if workers is None else workers
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    for signum in previous:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        with _temporary_directory() as tmp:
            try:
                return await _walkthrough(uri, kill_after, delay, console, Path(tmp), workers)
            finally:
                # Before the directory goes: a worker still running has its files open.
                stop_workers(workers)
    except asyncio.CancelledError:
        if received:
            raise Stopped(received[0]) from None
        raise
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)


def _temporary_directory() -> tempfile.TemporaryDirectory[str]:
    """The demo's work directory (worker output, the call log, the default database), or a
    DemoFailedError naming the temporary directory that cannot hold it: the OSError would
    otherwise read as a failure to write the output, or end in a traceback."""
    try:
        return tempfile.TemporaryDirectory(prefix="agentium-demo-", ignore_cleanup_errors=True)
    except OSError as exc:
        # mkdtemp names the directory it tried to make; gettempdir, when no candidate is
        # usable, names none (its message lists them).
        where = (os.path.dirname(exc.filename) if isinstance(exc.filename, str)
                 else os.environ.get("TMPDIR") or tempfile.tempdir)
        named = f" {where!r}" if where else ""
        raise DemoFailedError(
            f"the temporary directory{named} is not usable ({exc.strerror or exc}); the demo "
            "keeps its worker processes' output there, and its database unless --store names "
            "one: set TMPDIR to a directory you can write", details={"directory": where}
        ) from None


async def _walkthrough(uri: str | None, kill_after: int, delay: float, console: Console,
                       workdir: Path, workers: list[subprocess.Popen[bytes]]) -> int:
    temporary = uri is None
    uri = uri or f"sqlite:///{workdir / 'demo.db'}"
    call_log = workdir / "executions.log"
    store = open_demo_store(uri)
    try:
        if await store.get_header(KEY) is not None:
            raise _exists(uri)
        witness = _CreateWitness(store)
        runtime = ExecutionGraphRuntime(catalog=build_catalog(),
                                        store=witness,
                                        require_durable=True)
        await runtime.create(KEY, build_program())
        if not witness.created:
            # Another demo created it since the check above (create is idempotent and
            # returns the stored task): only the demo that created the task runs it.
            raise _exists(uri)
        console.print(f"[bold]agentium-graph demo[/]  store: {escape(redact(uri))}"
                      + (" (temporary: removed when the demo ends)" if temporary else ""))
        console.print(f"task {KEY!r}: 7 pure tools, one fan-out of 4 and a join\n")

        first = _spawn(uri, delay, call_log, workdir, "first", workers)
        console.print(f"1. worker process {first.pid} runs the graph ...")
        started = time.monotonic()
        while await _completed(store) < kill_after:
            if first.poll() is not None:
                raise _worker_failed(f"worker exited early (process {first.pid}, exit code "
                                     f"{first.returncode})", _output(workdir, "first", "err"))
            if time.monotonic() - started > 60:
                raise DemoFailedError("worker made no progress in 60 s")
            await asyncio.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        crashed = await runtime.inspect(KEY)
        done = sum(n.state == "completed" for n in crashed.nodes.values())
        running = sorted(n for n, v in crashed.nodes.items() if v.state == "running")
        console.print(f"2. [red]SIGKILL[/] sent to worker {first.pid} after {done} nodes "
                      f"completed; interrupted while running: {', '.join(running) or 'none'}")

        second = _spawn(uri, delay, call_log, workdir, "second", workers)
        console.print(f"3. fresh worker process {second.pid} calls run({KEY!r}, "
                      f"{WORKER!r}) and recovers ...")
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(120):
                # Canceled (Ctrl-C, SIGTERM), the thread ends when stop_workers kills it.
                await asyncio.to_thread(second.wait)
        except TimeoutError:
            raise DemoFailedError("recovery worker did not finish in 120 s") from None
        elapsed = time.monotonic() - t0
        if second.returncode != 0:
            raise _worker_failed(f"recovery worker failed (process {second.pid}, exit code "
                                 f"{second.returncode})", _output(workdir, "second", "err"))
        result = _result(_output(workdir, "second", "out"))
        final = await runtime.inspect(KEY)
        console.print(f"   recovered in {elapsed:.2f} s (process start included)\n")
        _report(console, crashed, final, read_call_log(call_log))
        console.print(f"\n[bold]invoice[/]\n{result['output']['invoice']['text']}")
        reran = [n for n, v in crashed.nodes.items() if v.state == "completed" and
                 sum(1 for e in read_call_log(call_log) if e["node"] == n) != 1]
        ok = final.status == "completed" and final.verified and not reran
        console.print(f"\nno completed node re-ran: {'yes' if not reran else 'NO: ' + str(reran)}"
                      f"; data verified: {final.verified}")
        if temporary:
            console.print("to inspect a run afterwards, give it a store to keep: "
                          "agentium-graph demo --store sqlite:///demo.db", markup=False)
        else:
            console.print("inspect it yourself: " + shlex.join(
                ["agentium-graph", "--store", redact(uri), "inspect", KEY]), markup=False)
        return 0 if ok else 1
    finally:
        await store.close()


def _exists(uri: str) -> ConfigurationError:
    # A second demo would find its task already run (or half run): it could show neither
    # the crash nor the recovery, only a false "re-ran" report.
    return ConfigurationError(
        f"the demo's task {KEY!r} already exists in {redact(uri)} (an earlier demo, or one "
        "running now, created it); run the demo with a new --store file, or omit --store to "
        "use a fresh temporary one (inspect that run with: agentium-graph --store "
        f"{shlex.quote(redact(uri))} inspect {shlex.quote(KEY)})",
        details={"key": KEY})


class _CreateWitness(ForwardingStore):
    """The demo's store as ``runtime.create`` sees it, noting whether the store's atomic
    ``create_task`` created the task or found it there (``create`` itself is idempotent
    and returns the stored task either way). Every other call goes to the store."""

    def __init__(self, store: DurableTaskStore) -> None:
        super().__init__(store)
        self.created = False

    async def create_task(self, request: CreateTaskRequest) -> CreateTaskResult:
        result = await super().create_task(request)
        self.created = result.created
        return result


def _report(console: Console, crashed: TaskView, final: TaskView,
            calls: list[dict[str, Any]]) -> None:
    table = Table(title="per-node report (runs = tool executions across both processes)")
    for col in ("node", "at crash", "final", "attempts fence:outcome", "runs", "recovery"):
        table.add_column(col, no_wrap=True)
    order = [n["id"] for n in (build_program().plan or {}).get("nodes", [])]
    for node_id in order:
        node, before = final.nodes[node_id], crashed.nodes[node_id]
        runs = sum(1 for c in calls if c["node"] == node_id)
        if before.state == "completed":
            how = "[green]reused[/]"
        elif any(a.outcome == "interrupted" for a in node.attempts):
            how = "[yellow]restarted under a newer fence[/]"
        else:
            how = "first run, after recovery"
        attempts = " ".join(f"{a.fence}:{a.outcome}" for a in node.attempts)
        table.add_row(node_id, before.state, node.state, attempts, str(runs), how)
    console.print(table)
    title = "root counters (charged before dispatch, never refunded)"
    counters = Table(title=title, min_width=len(title))  # a title wider than the table wraps
    for col in ("counter", "at crash", "final", "limit"):
        counters.add_column(col, no_wrap=True)
    for name in ("expanded_nodes", "work_attempts", "tool_calls", "plan_revisions"):
        limit = final.limits.get(name)
        counters.add_row(name, str(crashed.counters[name]), str(final.counters[name]),
                         "-" if limit is None else str(limit))
    console.print(counters)
