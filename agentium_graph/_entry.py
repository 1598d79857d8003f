"""The CLI's entry point (``agentium-graph`` and ``python -m agentium_graph``).

It imports nothing but the standard library before it can catch a Ctrl-C: the CLI needs the
runtime, whose import takes a noticeable part of a second, and an interrupt that arrives
during it would otherwise end the process with a KeyboardInterrupt traceback instead of
click's one ``Aborted!`` line (exit 1). The package ``__init__`` imports lazily for the same
reason: it runs before this module does.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, NoReturn


def main() -> None:
    """Run the operator CLI (:func:`agentium_graph.cli.main`)."""
    try:
        from agentium_graph.cli import main as cli_main
    except KeyboardInterrupt:
        _aborted()
    cli_main()


def _aborted() -> NoReturn:
    """End as click ends on Ctrl-C: ``Aborted!`` on stderr and exit code 1."""
    try:
        sys.stderr.write("Aborted!\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed or unwritable: keep the code
        discard_stream(sys.stderr)
    raise SystemExit(1)


def discard_stream(stream: Any) -> None:
    """Point ``stream``'s file descriptor at the null device: what is still buffered for it
    cannot be written either, and Python's flush at exit would report that again (which
    would make the exit code 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:  # a closed fd is the lowest free one: os.open may have reused it
            os.dup2(null, fd)
            os.close(null)
