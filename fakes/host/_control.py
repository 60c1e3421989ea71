"""The host's `/_control` switches, and the guard of its MCP endpoint (bearer token, fault
mode, lost answers)."""

from __future__ import annotations

import hmac
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fakes.host._oauth import base_url, resource_metadata_url
from fakes.host._rest import Lost
from fakes.host._state import MODES, HostState, Unavailable, fault, problem

__all__ = ["Guard", "control_routes"]


def control_routes(state: HostState) -> list[Route]:
    async def get_state(request: Request) -> Response:
        return JSONResponse(state.snapshot())

    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    async def mode(request: Request) -> Response:
        req = await request.json()
        face, name = req.get("face", "rest"), req.get("mode")
        if face not in ("mcp", "rest") or name not in MODES:
            return problem(400, f"face is mcp or rest, mode one of {sorted(MODES)}")
        with state.lock:
            state.modes[face] = {
                "mode": name,
                "count": req.get("count"),
                "delay_s": float(req.get("delay_s", 0.0)),
            }
        return JSONResponse(state.modes[face])

    async def rug_pull(request: Request) -> Response:
        req = await request.json()
        with state.lock:
            for tool in state.tools:
                if tool["name"] == req.get("tool"):
                    if "description" in req:
                        tool["description"] = str(req["description"])
                    if "input_schema" in req:
                        tool["input_schema"] = req["input_schema"]
                    if "rename" in req:  # the same definition under another name
                        tool["name"] = str(req["rename"])
                    return JSONResponse(tool)
        return problem(404, "no such tool")

    async def add_tool(request: Request) -> Response:
        """The server lists one more tool from now on (name, description, schemas)."""
        req = await request.json()
        tool = {
            "name": str(req["name"]),
            "description": str(req.get("description", "")),
            "input_schema": req.get("input_schema") or {"type": "object"},
            "output_schema": req.get("output_schema"),
        }
        with state.lock:
            state.tools.append(tool)
        return JSONResponse(tool)

    async def inject(request: Request) -> Response:
        req = await request.json()
        with state.lock:
            state.injected[str(req["tool"])] = str(req["text"])
        return JSONResponse({"ok": True})

    async def change_ticket(request: Request) -> Response:
        """Someone at the host edits a ticket: its revision moves on."""
        ticket_id = request.path_params["ticket_id"]
        req = await request.json()
        with state.lock:
            if ticket_id not in state.tickets:
                return problem(404, "ticket not found")
            state.tickets[ticket_id].update(
                {k: str(v) for k, v in req.items() if k in ("status", "priority", "subject")}
            )
            state.revisions[ticket_id] += 1
            return JSONResponse(state.ticket(ticket_id))

    async def metadata(request: Request) -> Response:
        """Where the 401 says the protected-resource metadata is (`named`: a path on this host
        or an absolute URL; null for the well-known one), and whether the well-known locations
        serve it (`well_known`)."""
        req = await request.json()
        named = req.get("named")
        with state.lock:
            state.metadata_named = None if named is None else str(named)
            state.well_known_metadata = bool(req.get("well_known", True))
        return JSONResponse(
            {"named": state.metadata_named, "well_known": state.well_known_metadata}
        )

    async def revoke_tokens(request: Request) -> Response:
        with state.lock:
            revoked = len(state.access_tokens)
            state.access_tokens.clear()
            state.token_audiences.clear()
        return JSONResponse({"revoked": revoked})

    return [
        Route("/_control/state", get_state, methods=["GET"]),
        Route("/_control/revoke_tokens", revoke_tokens, methods=["POST"]),
        Route("/_control/metadata", metadata, methods=["POST"]),
        Route("/_control/reset", reset, methods=["POST"]),
        Route("/_control/mode", mode, methods=["POST"]),
        Route("/_control/rug_pull", rug_pull, methods=["POST"]),
        Route("/_control/add_tool", add_tool, methods=["POST"]),
        Route("/_control/inject", inject, methods=["POST"]),
        Route("/_control/tickets/{ticket_id}", change_ticket, methods=["POST"]),
        Route("/healthz", lambda r: JSONResponse({"status": "ok"}), methods=["GET"]),
    ]


class Guard:
    """ASGI around the app: the MCP endpoint's bearer token and fault mode, lost answers."""

    def __init__(self, app: Any, *, state: HostState, token: bytes) -> None:
        self._app, self._state, self._token = app, state, token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = dict(scope.get("headers") or [])
            scheme, _, value = headers.get(b"authorization", b"").decode().partition(" ")
            base = base_url(headers)
            with self._state.lock:
                named = self._state.metadata_named
                issued = self._state.access_tokens.get(value, 0.0) > time.time()
                # The audience check: a token is taken only if it was got for this resource.
                audience = self._state.token_audiences.get(value)
                if issued and audience != f"{base}/mcp":
                    issued = False
                    self._state.audience_refusals += 1
            if scheme.lower() != "bearer" or not (
                issued or hmac.compare_digest(value.encode(), self._token)
            ):
                where = (
                    resource_metadata_url(base)
                    if named is None
                    else f"{base}{named}"
                    if named.startswith("/")
                    else named
                )
                challenge = f'Bearer error="invalid_token", resource_metadata="{where}"'

                await JSONResponse(
                    {"error": "invalid_token"},
                    status_code=401,
                    headers={"WWW-Authenticate": challenge},
                )(scope, receive, send)
                return
            if scope["method"] == "POST":  # each JSON-RPC request is one POST
                try:
                    await fault(self._state, "mcp")
                except Unavailable:
                    await problem(503, "unavailable")(scope, receive, send)
                    return
        try:
            await self._app(scope, receive, send)
        except Lost:
            return  # the connection ends without an answer
