"""A simulated host product (a helpdesk) that federates with Writ, as scenario C describes.

One loopback HTTP server, three faces:

- `/mcp`: the host's own MCP server over Streamable HTTP (the official `mcp` SDK's low-level
  `Server`), or, with `legacy_sse` (`--legacy-sse`), over the legacy HTTP+SSE transport only,
  as a server from before Streamable HTTP would be (`GET /mcp` opens the event stream,
  messages are POSTed to `/mcp/messages/`, `POST /mcp` is 405); bearer token required:
  read tools `tickets.search`, `ticket.get`, `customer.get`, each with an input and an
  output schema. Their annotations say `readOnlyHint`, as a real server's would; Writ treats
  them as hints and never decides on them.
  A tool it serves but never lists (`tickets.export`) answers anyone who calls it anyway: a
  client that calls what it was never shown is caught by `calls`.
- `/api/v1`: its REST API for writes, another bearer token: `POST /tickets/{id}/comments` and
  `PATCH /tickets/{id}` with `If-Match` revisions and `Idempotency-Key` (same key and body: the
  first answer again; same key, another body: 422), described by `GET /api/v1/openapi.json`.
- `/oauth/token`: its authorization server's token endpoint, for the OAuth 2.0 client
  credentials grant (RFC 6749 §4.4; `client_secret_basic` or `_post`) when `oauth_clients`
  (`--oauth-clients-file`, `{"<client id>": "<secret>"}`) are set: the access tokens it issues
  (an hour) are taken by `/mcp` beside the static MCP token; `/_control/revoke_tokens` revokes
  every one.
- `/_control`: the switches, as the other fakes have them: a mode per face (`fail` answers 503,
  `slow` waits `delay_s`, `lose_response` applies a write and never answers), a "rug pull"
  (a tool's description or input schema changes between two listings), instruction-like text
  in a tool's result, and the host's state (customers, tickets, comments, calls per tool).

"Going away" is the process stopping (`FakeHost.stop`, or the stack stopping it); it comes
back on the same port. `drive_run` plays the host driving Writ through the SDK (`writ_client`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hmac
import json
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Self

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.sse import SseServerTransport
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from fakes.host_oauth import token_routes as _token_routes

__all__ = ["DEFAULT_DATA", "FakeHost", "main", "tool_definitions"]

MAX_BODY_BYTES: Final = 64 * 1024
MAX_KEY_CHARS: Final = 255
_MODES: Final = frozenset({"normal", "fail", "slow", "lose_response"})

DEFAULT_DATA: Final[dict[str, Any]] = {
    "customers": {
        "CUST-42": {"customer_id": "CUST-42", "name": "Acme Corporation",
                    "email": "ops@acme.example", "plan": "enterprise"},
        "CUST-7": {"customer_id": "CUST-7", "name": "Initech", "email": "it@initech.example",
                   "plan": "starter"},
    },
    "tickets": {
        "T-1001": {"ticket_id": "T-1001", "customer_id": "CUST-42",
                   "subject": "Order 7781 shipped late", "status": "open", "priority": "high",
                   "body": "Our order 7781 arrived four days late. What happened?"},
        "T-1002": {"ticket_id": "T-1002", "customer_id": "CUST-7",
                   "subject": "Invoice address", "status": "pending", "priority": "low",
                   "body": "Please change the invoice address."},
    },
}

_ID: Final = {"type": "string", "pattern": "^[A-Z]+-[0-9]{1,8}$", "maxLength": 16}
_TICKET_OUT: Final = {
    "type": "object",
    "properties": {"ticket_id": {"type": "string"}, "customer_id": {"type": "string"},
                   "subject": {"type": "string"}, "status": {"type": "string"},
                   "priority": {"type": "string"}, "body": {"type": "string"},
                   "revision": {"type": "string"}, "comments": {"type": "integer"}},
    "required": ["ticket_id", "customer_id", "subject", "status", "revision"],
}


def tool_definitions() -> list[dict[str, Any]]:
    """The tools the host lists, as plain data (name, description, schemas, annotations)."""
    return [
        {"name": "tickets.search",
         "description": "Search the helpdesk's tickets by words of their subject or body.",
         "input_schema": {"type": "object", "additionalProperties": False,
                          "properties": {"query": {"type": "string", "minLength": 1,
                                                   "maxLength": 200},
                                         "limit": {"type": "integer", "minimum": 1,
                                                   "maximum": 10}},
                          "required": ["query"]},
         "output_schema": {"type": "object", "properties": {
             "tickets": {"type": "array", "items": _TICKET_OUT}}, "required": ["tickets"]}},
        {"name": "ticket.get", "description": "Read one ticket: its subject, status, body, "
                                              "revision and number of comments.",
         "input_schema": {"type": "object", "additionalProperties": False,
                          "properties": {"ticket_id": _ID}, "required": ["ticket_id"]},
         "output_schema": _TICKET_OUT},
        {"name": "customer.get", "description": "Read one customer: name, email and plan.",
         "input_schema": {"type": "object", "additionalProperties": False,
                          "properties": {"customer_id": _ID}, "required": ["customer_id"]},
         "output_schema": {"type": "object", "properties": {
             "customer_id": {"type": "string"}, "name": {"type": "string"},
             "email": {"type": "string"}, "plan": {"type": "string"}},
             "required": ["customer_id", "name"]}},
    ]


class _State:
    """The helpdesk's records, its switches and its counters; every method holds `lock`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self._seed = data
        self.access_tokens: dict[str, float] = {}  # the authorization server's, kept by reset
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.customers = copy.deepcopy(self._seed["customers"])
            self.tickets = copy.deepcopy(self._seed["tickets"])
            self.revisions = dict.fromkeys(self.tickets, 1)
            self.comments: list[dict[str, Any]] = []
            self.replies: dict[str, tuple[str, dict[str, Any], int, dict[str, Any]]] = {}
            self.tools = tool_definitions()
            self.injected: dict[str, str] = {}
            self.modes: dict[str, dict[str, Any]] = {"mcp": {"mode": "normal"},
                                                     "rest": {"mode": "normal"}}
            self.tool_calls: dict[str, int] = {}
            self.listings = 0
            self.rest_calls = 0
            self.sse_sessions = 0
            self.tokens_issued = 0
            self.token_refusals = 0

    def take_mode(self, face: str) -> dict[str, Any]:
        with self.lock:
            mode = dict(self.modes[face])
            if (count := mode.get("count")) is not None:
                if count <= 1:
                    self.modes[face] = {"mode": "normal"}
                else:
                    self.modes[face]["count"] = count - 1
            return mode

    def ticket(self, ticket_id: str) -> dict[str, Any] | None:
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            return None
        return {**ticket, "revision": f"r{self.revisions[ticket_id]}",
                "comments": sum(c["ticket_id"] == ticket_id for c in self.comments)}

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"customers": copy.deepcopy(self.customers),
                    "tickets": {t: self.ticket(t) for t in self.tickets},
                    "comments": copy.deepcopy(self.comments),
                    "tool_calls": dict(self.tool_calls), "listings": self.listings,
                    "rest_calls": self.rest_calls, "sse_sessions": self.sse_sessions,
                    "tokens_issued": self.tokens_issued,
                    "token_refusals": self.token_refusals}


# -- MCP ------------------------------------------------------------------------------------


def _mcp_server(state: _State) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        with state.lock:
            state.listings += 1
            tools = copy.deepcopy(state.tools)
        return types.ListToolsResult(tools=[types.Tool(
            name=t["name"], description=t["description"], input_schema=t["input_schema"],
            output_schema=t["output_schema"],
            annotations=types.ToolAnnotations(read_only_hint=True)) for t in tools])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        with state.lock:
            state.tool_calls[params.name] = state.tool_calls.get(params.name, 0) + 1
            result = _answer(state, params.name, args)
            injected = state.injected.get(params.name)
        if result is None:
            return types.CallToolResult(content=[types.TextContent(text="not found")],
                                        is_error=True)
        if injected:  # a record whose text gives orders, as a hostile customer would write
            if "body" in result:
                result["body"] = f"{result['body']} {injected}"
            elif "name" in result:
                result["name"] = f"{result['name']} {injected}"
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(result))],
                                    structured_content=result)

    return Server("writ-fake-helpdesk", version="1.0.0", on_list_tools=list_tools,
                  on_call_tool=call_tool)


def _answer(state: _State, tool: str, args: dict[str, Any]) -> dict[str, Any] | None:
    if tool == "ticket.get":
        return state.ticket(str(args.get("ticket_id", "")))
    if tool == "customer.get":
        found = state.customers.get(str(args.get("customer_id", "")))
        return dict(found) if found else None
    if tool == "tickets.search":
        words = str(args.get("query", "")).lower().split()
        hits = [state.ticket(t) for t, v in state.tickets.items()
                if any(w in (v["subject"] + " " + v["body"]).lower() for w in words)]
        return {"tickets": hits[: int(args.get("limit", 5))]}
    if tool == "tickets.export":  # served, never listed
        return {"tickets": [state.ticket(t) for t in state.tickets]}
    return None


async def _fault(state: _State, face: str) -> dict[str, Any]:
    mode = state.take_mode(face)
    if mode["mode"] == "fail":
        raise _Unavailable
    if mode["mode"] == "slow":
        await asyncio.sleep(float(mode.get("delay_s", 1.0)))
    return mode


class _Unavailable(Exception):
    """The face answers 503 (its `fail` mode)."""


# -- REST -----------------------------------------------------------------------------------


def _problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"title": detail, "status": status, **extra}, status_code=status,
                        media_type="application/problem+json")


class _Lost(Exception):
    """The write was applied; its answer is never sent."""


class _LostResponse(Response):
    """Promise a body and stop halfway: the client sees the connection end without an answer,
    as when a response is lost after the write was applied."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"64")]})
        await send({"type": "http.response.body", "body": b"{", "more_body": True})
        raise _Lost


def _rest_routes(state: _State, token: bytes) -> list[Route]:
    def authorized(request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), token)

    async def write(request: Request, kind: str) -> Response:
        with state.lock:
            state.rest_calls += 1
        if not authorized(request):
            return _problem(401, "unauthorized")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return _problem(413, "request body too large")
        try:
            body = json.loads(raw)
        except ValueError:
            return _problem(400, "malformed JSON")
        key = request.headers.get("idempotency-key", "")
        if not key or len(key) > MAX_KEY_CHARS:
            return _problem(400, f"Idempotency-Key required, {MAX_KEY_CHARS} characters at most")
        try:
            mode = await _fault(state, "rest")
        except _Unavailable:
            return _problem(503, "unavailable")
        ticket_id = request.path_params["ticket_id"]
        fingerprint = json.dumps([kind, ticket_id, body], sort_keys=True)
        with state.lock:
            status, answer = _apply(state, kind, ticket_id, body, key, fingerprint,
                                    request.headers.get("if-match"))
        if mode["mode"] == "lose_response":
            return _LostResponse()
        return JSONResponse(answer, status_code=status,
                            media_type="application/json" if status < 400
                            else "application/problem+json")

    async def comments(request: Request) -> Response:
        return await write(request, "comment")

    async def ticket(request: Request) -> Response:
        if request.method == "GET":
            if not authorized(request):
                return _problem(401, "unauthorized")
            with state.lock:
                found = state.ticket(request.path_params["ticket_id"])
            return JSONResponse(found) if found else _problem(404, "ticket not found")
        return await write(request, "update")

    async def openapi(request: Request) -> Response:
        return JSONResponse(OPENAPI)

    return [Route("/api/v1/tickets/{ticket_id}/comments", comments, methods=["POST"]),
            Route("/api/v1/tickets/{ticket_id}", ticket, methods=["GET", "PATCH"]),
            Route("/api/v1/openapi.json", openapi, methods=["GET"])]


def _apply(state: _State, kind: str, ticket_id: str, body: Any, key: str, fingerprint: str,
           if_match: str | None) -> tuple[int, dict[str, Any]]:
    """One write, with the lock held. The key is looked at before If-Match: replaying a write
    whose answer was lost must give that answer, although the revision moved on since."""
    if (done := state.replies.get(key)) is not None:
        if done[0] != fingerprint:
            return 422, {"title": "Idempotency-Key reused with another request",
                         "status": 422}
        return done[2], {**done[1]}
    ticket = state.tickets.get(ticket_id)
    if ticket is None:
        return 404, {"title": "ticket not found", "status": 404}
    current = f"r{state.revisions[ticket_id]}"
    if if_match is not None and if_match != current:
        return 412, {"title": "revision mismatch", "status": 412, "revision": current}
    if kind == "comment":
        text = body.get("body") if isinstance(body, dict) else None
        if not isinstance(text, str) or not 1 <= len(text) <= 4000 or set(body) - {"body"}:
            return 400, {"title": "a comment is {\"body\": 1..4000 characters}", "status": 400}
        comment = {"comment_id": f"cmt_{len(state.comments) + 1}", "ticket_id": ticket_id,
                   "body": text, "idempotency_key": key,
                   "created_at": datetime.now(UTC).isoformat(timespec="milliseconds")}
        state.comments.append(comment)
        answer, status = dict(comment), 201
    else:
        allowed = {"status": ("open", "pending", "solved"), "priority": ("low", "high")}
        if (not isinstance(body, dict) or not body or set(body) - set(allowed)
                or any(body[k] not in allowed[k] for k in body)):
            return 400, {"title": "an update sets status and/or priority", "status": 400}
        ticket.update(body)
        answer, status = {"ticket_id": ticket_id, **body}, 200
    state.revisions[ticket_id] += 1
    answer["revision"] = f"r{state.revisions[ticket_id]}"
    state.replies[key] = (fingerprint, answer, status, {})
    return status, answer


OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {"title": "Helpdesk write API", "version": "1.0.0"},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "security": [{"bearer": []}],
    "paths": {
        "/api/v1/tickets/{ticket_id}/comments": {"post": {
            "operationId": "createComment",
            "parameters": [
                {"name": "ticket_id", "in": "path", "required": True,
                 "schema": {"type": "string"}},
                {"name": "Idempotency-Key", "in": "header", "required": True,
                 "schema": {"type": "string", "maxLength": MAX_KEY_CHARS}},
                {"name": "If-Match", "in": "header", "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "required": ["body"],
                "properties": {"body": {"type": "string", "minLength": 1,
                                        "maxLength": 4000}}}}}},
            "responses": {"201": {"description": "created (or the first answer, replayed)"},
                          "412": {"description": "If-Match is not the ticket's revision"},
                          "422": {"description": "the key was used for another request"}}}},
        "/api/v1/tickets/{ticket_id}": {"patch": {
            "operationId": "updateTicket",
            "parameters": [
                {"name": "ticket_id", "in": "path", "required": True,
                 "schema": {"type": "string"}},
                {"name": "Idempotency-Key", "in": "header", "required": True,
                 "schema": {"type": "string", "maxLength": MAX_KEY_CHARS}},
                {"name": "If-Match", "in": "header", "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "minProperties": 1,
                "properties": {"status": {"enum": ["open", "pending", "solved"]},
                               "priority": {"enum": ["low", "high"]}}}}}},
            "responses": {"200": {"description": "updated"},
                          "412": {"description": "If-Match is not the ticket's revision"},
                          "422": {"description": "the key was used for another request"}}}},
    },
}


# -- control --------------------------------------------------------------------------------


def _control_routes(state: _State) -> list[Route]:
    async def get_state(request: Request) -> Response:
        return JSONResponse(state.snapshot())

    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse({"ok": True})

    async def mode(request: Request) -> Response:
        req = await request.json()
        face, name = req.get("face", "rest"), req.get("mode")
        if face not in ("mcp", "rest") or name not in _MODES:
            return _problem(400, f"face is mcp or rest, mode one of {sorted(_MODES)}")
        with state.lock:
            state.modes[face] = {"mode": name, "count": req.get("count"),
                                 "delay_s": float(req.get("delay_s", 0.0))}
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
                    return JSONResponse(tool)
        return _problem(404, "no such tool")

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
                return _problem(404, "ticket not found")
            state.tickets[ticket_id].update({k: str(v) for k, v in req.items()
                                             if k in ("status", "priority", "subject")})
            state.revisions[ticket_id] += 1
            return JSONResponse(state.ticket(ticket_id))

    async def revoke_tokens(request: Request) -> Response:
        with state.lock:
            revoked = len(state.access_tokens)
            state.access_tokens.clear()
        return JSONResponse({"revoked": revoked})

    return [Route("/_control/state", get_state, methods=["GET"]),
            Route("/_control/revoke_tokens", revoke_tokens, methods=["POST"]),
            Route("/_control/reset", reset, methods=["POST"]),
            Route("/_control/mode", mode, methods=["POST"]),
            Route("/_control/rug_pull", rug_pull, methods=["POST"]),
            Route("/_control/inject", inject, methods=["POST"]),
            Route("/_control/tickets/{ticket_id}", change_ticket, methods=["POST"]),
            Route("/healthz", lambda r: JSONResponse({"status": "ok"}), methods=["GET"])]


class _Guard:
    """ASGI around the app: the MCP endpoint's bearer token and fault mode, lost answers."""

    def __init__(self, app: Any, *, state: _State, token: bytes) -> None:
        self._app, self._state, self._token = app, state, token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = dict(scope.get("headers") or [])
            scheme, _, value = headers.get(b"authorization", b"").decode().partition(" ")
            with self._state.lock:
                issued = self._state.access_tokens.get(value, 0.0) > time.time()
            if scheme.lower() != "bearer" or not (
                    issued or hmac.compare_digest(value.encode(), self._token)):
                await JSONResponse({"error": "invalid_token"}, status_code=401, headers={
                    "WWW-Authenticate": 'Bearer error="invalid_token"'})(scope, receive, send)
                return
            if scope["method"] == "POST":  # each JSON-RPC request is one POST
                try:
                    await _fault(self._state, "mcp")
                except _Unavailable:
                    await _problem(503, "unavailable")(scope, receive, send)
                    return
        try:
            await self._app(scope, receive, send)
        except _Lost:
            return  # the connection ends without an answer


class FakeHost:
    """The helpdesk on loopback: `url` is its base (`url + "/mcp"`, `url + "/api/v1"`)."""

    def __init__(self, *, mcp_token: str, rest_token: str, host: str = "127.0.0.1",
                 port: int = 0, data: dict[str, Any] | None = None,
                 legacy_sse: bool = False, oauth_clients: dict[str, str] | None = None) -> None:
        if not mcp_token or not rest_token:
            raise ValueError("both tokens must be set")
        self.legacy_sse = legacy_sse
        self._oauth_clients = dict(oauth_clients or {})
        self.state = _State(data or DEFAULT_DATA)
        self._mcp_token, self._rest_token = mcp_token.encode(), rest_token.encode()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(128)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:53211."""
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _app(self) -> Any:
        server = _mcp_server(self.state)
        if self.legacy_sse:
            return _Guard(self._legacy_app(server), state=self.state, token=self._mcp_token)
        app = server.streamable_http_app(
            stateless_http=True, json_response=True,
            custom_starlette_routes=[*_rest_routes(self.state, self._rest_token),
                                     *_token_routes(self.state, self._oauth_clients),
                                     *_control_routes(self.state)])
        return _Guard(app, state=self.state, token=self._mcp_token)

    def _legacy_app(self, server: Server[Any]) -> Any:
        """The MCP server over the legacy HTTP+SSE transport only (the SDK's own)."""
        sse = SseServerTransport("/mcp/messages/")
        state = self.state

        async def connect(request: Request) -> Response:
            with state.lock:
                state.sse_sessions += 1
            async with sse.connect_sse(request.scope, request.receive,
                                       request._send) as (read, write):  # noqa: SLF001
                await server.run(read, write, server.create_initialization_options())
            return Response()

        return Starlette(routes=[
            Route("/mcp", connect, methods=["GET"]),  # POST /mcp: 405, as an old server says
            Mount("/mcp/messages/", app=sse.handle_post_message),
            *_rest_routes(self.state, self._rest_token),
            *_token_routes(self.state, self._oauth_clients), *_control_routes(self.state)])

    def start(self) -> None:
        """Serve in a thread until `stop`."""
        config = uvicorn.Config(self._app(), log_level="critical", lifespan="on",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake host did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def drive_run(api_url: str, *, tenant: str, issuer: str, private_key_pem: bytes,
                    principal: str, agent: str, text: str, timeout_s: float = 60) -> Any:
    """What the host product does to ask Writ for work: start a run through the SDK over
    HTTP and wait for its result (the host's own `writ_client`, as any host would)."""
    from writ_client import Client, Issuer

    signer = Issuer(tenant=tenant, issuer=issuer, private_key_pem=private_key_pem)
    async with Client(api_url, signer, principal) as client:
        return await client.run(agent, text, timeout_s=timeout_s)


def main(argv: list[str] | None = None) -> None:
    """Serve the fake host until SIGTERM or SIGINT."""
    import os
    import signal

    parser = argparse.ArgumentParser(prog="python -m fakes.host", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mcp-token-file", type=Path, required=True)
    parser.add_argument("--rest-token-file", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--oauth-clients-file", type=Path,
                        help='JSON {"<client id>": "<secret>"}: the token endpoint\'s clients')
    parser.add_argument("--legacy-sse", action="store_true",
                        help="serve MCP over the legacy HTTP+SSE transport only")
    args = parser.parse_args(argv)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with FakeHost(mcp_token=args.mcp_token_file.read_text().strip(),
                  rest_token=args.rest_token_file.read_text().strip(),
                  host=args.host, port=args.port, legacy_sse=args.legacy_sse,
                  oauth_clients=json.loads(args.oauth_clients_file.read_text())
                  if args.oauth_clients_file else None) as fake:
        if args.ready_file is not None:
            tmp = args.ready_file.with_name(f".{args.ready_file.name}.{os.getpid()}.tmp")
            tmp.write_text(fake.url)
            os.replace(tmp, args.ready_file)
        print(fake.url, flush=True)
        done.wait()


if __name__ == "__main__":
    main()
