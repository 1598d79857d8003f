"""Review 16: a path starting with '~' given to the constructor (which, like open() and
sqlite3.connect(), does not expand it) is refused with the way to expand it.

The error used to say "directory '<cwd>/~' does not exist; create it first (mkdir -p
'<cwd>/~')": following it makes a directory literally named '~' in the working directory,
the classic start of an `rm -rf ~` accident, and puts the database where nobody looks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentium_graph.errors import StoreError
from agentium_graph_sqlite import SQLiteDurableTaskStore


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


@pytest.mark.parametrize("path", ["~/tasks.db", "~/data/tasks.db", "~nobody-here/t.db"])
async def test_an_unexpanded_tilde_says_how_to_expand_it(in_tmp: Path, path: str) -> None:
    store = SQLiteDurableTaskStore(path)
    with pytest.raises(StoreError) as info:
        await store.get_header("k")
    await store.close()
    message = str(info.value)
    assert "mkdir" not in message
    assert "expanduser" in message and "is not expanded" in message
    assert os.listdir(in_tmp) == []


async def test_a_real_directory_named_tilde_still_works(in_tmp: Path) -> None:
    (in_tmp / "~").mkdir()
    async with SQLiteDurableTaskStore("~/tasks.db") as store:
        assert await store.get_header("k") is None
    assert (in_tmp / "~" / "tasks.db").exists()
