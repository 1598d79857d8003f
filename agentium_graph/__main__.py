"""``python -m agentium_graph``: the operator CLI (same as the ``agentium-graph`` script)."""

from agentium_graph._entry import main

if __name__ == "__main__":
    main()
