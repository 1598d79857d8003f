"""The floor, measured in the same run and directory as the stores: what one durable write
costs on this disk before any runtime or store code runs."""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARMUP = 10


def _summary(name: str, samples: list[float], detail: str) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "kind": "floor", "name": name, "n": len(samples),
        "median_ms": round(statistics.median(ordered) * 1000, 4),
        "p10_ms": round(ordered[len(ordered) // 10] * 1000, 4),
        "p90_ms": round(ordered[len(ordered) * 9 // 10] * 1000, 4),
        "detail": detail,
    }


def _time(fn: Callable[[int], object], n: int) -> list[float]:
    for i in range(WARMUP):
        fn(-1 - i)
    samples: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - t0)
    return samples


def sqlite_commit(directory: Path, n: int, synchronous: str) -> dict[str, Any]:
    """One autocommit INSERT of a tiny row in WAL mode."""
    path = directory / f"floor-{synchronous.lower()}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER, v TEXT)")
        samples = _time(lambda i: conn.execute("INSERT INTO t VALUES (?, 'x')", (i,)), n)
    finally:
        conn.close()
    return _summary(f"sqlite_{synchronous.lower()}_commit", samples,
                    f"one INSERT transaction, WAL, synchronous={synchronous}, "
                    f"sqlite {sqlite3.sqlite_version}")


def fsync(directory: Path, n: int) -> dict[str, Any]:
    """Append 64 bytes to a file and fsync it."""
    fd = os.open(directory / "floor-fsync.bin", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    payload = b"x" * 64

    def once(_: int) -> None:
        os.write(fd, payload)
        os.fsync(fd)

    try:
        samples = _time(once, n)
    finally:
        os.close(fd)
    return _summary("fsync", samples, "os.write of 64 bytes + os.fsync, same directory")


def floors(directory: Path, n: int) -> list[dict[str, Any]]:
    return [sqlite_commit(directory, n, "FULL"), fsync(directory, n),
            sqlite_commit(directory, n, "NORMAL")]
