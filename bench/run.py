"""Benchmark agentium-graph: W1-W4 on each store next to the durable-write floor.

Usage: python bench/run.py [--stores memory,sqlite] [--quick]
Prints one JSON object per line; ``--help`` lists every option.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)  # run as a script: make ``bench`` importable
    from bench._main import main as run

    raise SystemExit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
