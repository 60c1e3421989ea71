"""The host's REST API for writes: comments and ticket updates, with `If-Match` revisions and
`Idempotency-Key`, and the OpenAPI document describing it."""

from __future__ import annotations

import hmac
import json
from datetime import UTC, datetime
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fakes import _receipts
from fakes.host._state import MAX_BODY_BYTES, MAX_KEY_CHARS, HostState, Unavailable, fault, problem

__all__ = ["OPENAPI", "Lost", "rest_routes"]


class Lost(Exception):
    """The write was applied; its answer is never sent."""


class _LostResponse(Response):
    """Promise a body and stop halfway: the client sees the connection end without an answer,
    as when a response is lost after the write was applied."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"64")],
            }
        )
        await send({"type": "http.response.body", "body": b"{", "more_body": True})
        raise Lost


def rest_routes(state: HostState, token: bytes) -> list[Route]:
    def authorized(request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), token)

    async def write(request: Request, kind: str) -> Response:
        with state.lock:
            state.rest_calls += 1
        if not authorized(request):
            return problem(401, "unauthorized")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return problem(413, "request body too large")
        try:
            body = json.loads(raw)
        except ValueError:
            return problem(400, "malformed JSON")
        key = request.headers.get("idempotency-key", "")
        if not key or len(key) > MAX_KEY_CHARS:
            return problem(400, f"Idempotency-Key required, {MAX_KEY_CHARS} characters at most")
        if state.receipts is not None:
            try:
                state.receipts.check(request.headers.get(_receipts.HEADER), raw, key)
            except _receipts.ReceiptRefused as exc:
                return problem(403, "approval receipt refused", reason=exc.reason)
        try:
            mode = await fault(state, "rest")
        except Unavailable:
            return problem(503, "unavailable")
        ticket_id = request.path_params["ticket_id"]
        fingerprint = json.dumps([kind, ticket_id, body], sort_keys=True)
        with state.lock:
            status, answer = _apply(
                state, kind, ticket_id, body, key, fingerprint, request.headers.get("if-match")
            )
        if mode["mode"] == "lose_response":
            return _LostResponse()
        return JSONResponse(
            answer,
            status_code=status,
            media_type="application/json" if status < 400 else "application/problem+json",
        )

    async def comments(request: Request) -> Response:
        return await write(request, "comment")

    async def ticket(request: Request) -> Response:
        if request.method == "GET":
            if not authorized(request):
                return problem(401, "unauthorized")
            with state.lock:
                found = state.ticket(request.path_params["ticket_id"])
            return JSONResponse(found) if found else problem(404, "ticket not found")
        return await write(request, "update")

    async def openapi(request: Request) -> Response:
        return JSONResponse(OPENAPI)

    return [
        Route("/api/v1/tickets/{ticket_id}/comments", comments, methods=["POST"]),
        Route("/api/v1/tickets/{ticket_id}", ticket, methods=["GET", "PATCH"]),
        Route("/api/v1/openapi.json", openapi, methods=["GET"]),
    ]


def _apply(
    state: HostState,
    kind: str,
    ticket_id: str,
    body: Any,
    key: str,
    fingerprint: str,
    if_match: str | None,
) -> tuple[int, dict[str, Any]]:
    """One write, with the lock held. The key is looked at before If-Match: replaying a write
    whose answer was lost must give that answer, although the revision moved on since."""
    if (done := state.replies.get(key)) is not None:
        if done[0] != fingerprint:
            return 422, {"title": "Idempotency-Key reused with another request", "status": 422}
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
            return 400, {"title": 'a comment is {"body": 1..4000 characters}', "status": 400}
        comment = {
            "comment_id": f"cmt_{len(state.comments) + 1}",
            "ticket_id": ticket_id,
            "body": text,
            "idempotency_key": key,
            "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        state.comments.append(comment)
        answer, status = dict(comment), 201
    else:
        allowed = {"status": ("open", "pending", "solved"), "priority": ("low", "high")}
        if (
            not isinstance(body, dict)
            or not body
            or set(body) - set(allowed)
            or any(body[k] not in allowed[k] for k in body)
        ):
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
        "/api/v1/tickets/{ticket_id}/comments": {
            "post": {
                "operationId": "createComment",
                "parameters": [
                    {
                        "name": "ticket_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": True,
                        "schema": {"type": "string", "maxLength": MAX_KEY_CHARS},
                    },
                    {"name": "If-Match", "in": "header", "schema": {"type": "string"}},
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["body"],
                                "properties": {
                                    "body": {"type": "string", "minLength": 1, "maxLength": 4000}
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "201": {"description": "created (or the first answer, replayed)"},
                    "412": {"description": "If-Match is not the ticket's revision"},
                    "422": {"description": "the key was used for another request"},
                },
            }
        },
        "/api/v1/tickets/{ticket_id}": {
            "patch": {
                "operationId": "updateTicket",
                "parameters": [
                    {
                        "name": "ticket_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": True,
                        "schema": {"type": "string", "maxLength": MAX_KEY_CHARS},
                    },
                    {"name": "If-Match", "in": "header", "schema": {"type": "string"}},
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "additionalProperties": False,
                                "minProperties": 1,
                                "properties": {
                                    "status": {"enum": ["open", "pending", "solved"]},
                                    "priority": {"enum": ["low", "high"]},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": {"description": "updated"},
                    "412": {"description": "If-Match is not the ticket's revision"},
                    "422": {"description": "the key was used for another request"},
                },
            }
        },
    },
}
