"""The host's MCP server (the official SDK's low-level `Server`): its read tools."""

from __future__ import annotations

import copy
import json
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

from fakes.host._state import HostState

__all__ = ["mcp_server"]


def mcp_server(state: HostState) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        with state.lock:
            state.listings += 1
            tools = copy.deepcopy(state.tools)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t["name"],
                    description=t["description"],
                    input_schema=t["input_schema"],
                    output_schema=t["output_schema"],
                    annotations=types.ToolAnnotations(read_only_hint=True),
                )
                for t in tools
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        with state.lock:
            state.tool_calls[params.name] = state.tool_calls.get(params.name, 0) + 1
            result = _answer(state, params.name, args)
            injected = state.injected.get(params.name)
        if result is None:
            return types.CallToolResult(
                content=[types.TextContent(text="not found")], is_error=True
            )
        if injected:  # a record whose text gives orders, as a hostile customer would write
            if "body" in result:
                result["body"] = f"{result['body']} {injected}"
            elif "name" in result:
                result["name"] = f"{result['name']} {injected}"
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(result))], structured_content=result
        )

    return Server(
        "writ-fake-helpdesk", version="1.0.0", on_list_tools=list_tools, on_call_tool=call_tool
    )


def _answer(state: HostState, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
    if tool == "ticket.get":
        return state.ticket(str(args.get("ticket_id", "")))
    if tool == "customer.get":
        found = state.customers.get(str(args.get("customer_id", "")))
        return dict(found) if found else None
    if tool == "tickets.search":
        words = str(args.get("query", "")).lower().split()
        hits = [
            state.ticket(t)
            for t, v in state.tickets.items()
            if any(w in (v["subject"] + " " + v["body"]).lower() for w in words)
        ]
        return {"tickets": hits[: int(args.get("limit", 5))]}
    if tool == "tickets.export":  # served, never listed
        return {"tickets": [state.ticket(t) for t in state.tickets]}
    return None
