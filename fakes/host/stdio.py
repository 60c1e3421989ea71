"""`python -m fakes.host.stdio`: the host's MCP server over stdio (`_stdio.py`)."""

from fakes.host._stdio import main

if __name__ == "__main__":
    main()
