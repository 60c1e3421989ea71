"""The host's MCP server over stdio (`python -m fakes.host.stdio`): the same read tools, served
on stdin/stdout by a process its client starts, as most published MCP servers are run.

`--report FILE` writes the process id and the names of its environment variables there when it
starts, so a test can see what environment the client gave it and whether it is still alive.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import anyio
from mcp.server.stdio import stdio_server

from fakes.host._mcp import mcp_server
from fakes.host._state import DEFAULT_DATA, HostState

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Serve the helpdesk's MCP tools on stdin/stdout until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m fakes.host.stdio", description=main.__doc__)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    if args.report is not None:
        args.report.write_text(json.dumps({"pid": os.getpid(), "env": sorted(os.environ)}))
    server = mcp_server(HostState(DEFAULT_DATA))

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
