"""The chat path of the load: sessions opened over the HTTP API (`POST /api/v1/sessions`) with
the note agent, and messages sent to them at the path's rate, each starting a turn. A message
sent while its session's turn is still in flight is refused `409 SESSION_BUSY` and changes
nothing: it is counted as such, not as a loss. Some sessions only talk (their messages carry
`TALK`, so the fake model answers without writing a note); the others write one note a turn.

Every write carries an Idempotency-Key, and is sent again with the same key after an outage
(a 5xx, a timeout, a refused connection) until it gets an answer: a message is applied once,
whatever the retries, and the first answer is the one kept.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any, Final

import anyio
import httpx

from soak.deploy import TALK, TENANTS, principal
from soak.ledger import ChatSession, Ledger, Op
from writ.stack import Stack

__all__ = ["CHAT_AGENT", "Chat"]

CHAT_AGENT: Final = "chat-assistant"  # a standing write_delete grant in both tenants
SESSIONS_PER_TENANT: Final = 8  # in use at a time; so some messages find their session busy
NEW_SESSION_FRACTION: Final = 0.05  # of chat ticks, once there are enough: open another
TALK_FRACTION: Final = 0.3  # of sessions: they only talk
GIVE_UP_S: Final = 90.0  # past this an unanswered write is not accepted (and not checked)


class Chat:
    """Opens sessions and sends them messages (one call of `one` a tick)."""

    def __init__(self, stack: Stack, ledger: Ledger, rng: random.Random) -> None:
        self.stack, self.ledger, self.rng = stack, ledger, rng
        self._http: httpx.AsyncClient | None = None

    async def open(self) -> None:
        self._http = httpx.AsyncClient(base_url=self.stack.api_url, timeout=15)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def one(self) -> None:
        tenant = self.rng.choice(TENANTS)
        mine = [s for s in self.ledger.sessions.values() if s.tenant == tenant]
        if len(mine) < SESSIONS_PER_TENANT or self.rng.random() < NEW_SESSION_FRACTION:
            await self._open(tenant)
        else:
            await self._send(self.rng.choice(mine[-SESSIONS_PER_TENANT:]))

    async def _open(self, tenant: str) -> None:
        talk = self.rng.random() < TALK_FRACTION
        op = self.ledger.add(
            Op("open", f"open-{uuid.uuid4().hex}", tenant=tenant, arguments={"talk": talk})
        )
        answer = await self._write(op, "/sessions", {"agent": CHAT_AGENT})
        if answer is not None and answer[0] == 201:
            op.accepted, op.session_id = True, answer[1]["session_id"]
            self.ledger.sessions[op.session_id] = ChatSession(op.session_id, tenant, talk)

    async def _send(self, session: ChatSession) -> None:
        request_id = f"chat-{uuid.uuid4().hex}"
        text = (
            f"{TALK + ' ' if session.talk else ''}Soak chat {request_id}: please note "
            "today's call with ACME-42."
        )
        op = self.ledger.add(
            Op(
                "chat",
                request_id,
                tenant=session.tenant,
                session_id=session.session_id,
                arguments={"text": text},
            )
        )
        answer = await self._write(op, f"/sessions/{session.session_id}/messages", {"text": text})
        if answer is None:
            return
        status, body = answer
        if status == 202:
            op.accepted, op.run_id = True, str(body.get("run_id") or "")
        elif status == 409 and body.get("code") == "SESSION_BUSY":
            op.busy = True
        else:
            op.error = f"{status} {body.get('code')}: {str(body.get('detail'))[:200]}"

    async def _write(
        self, op: Op, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """The first definite answer (2xx or 4xx) to the write, under one key; None when
        none came within `GIVE_UP_S`."""
        assert self._http is not None
        headers = {
            "Authorization": f"Bearer {self._token(op.tenant)}",
            "Idempotency-Key": op.request_id,
        }
        op.sent_at = time.monotonic()
        while time.monotonic() - op.sent_at < GIVE_UP_S:
            try:
                response = await self._http.post(path, json=body, headers=headers)
            except httpx.HTTPError as exc:  # ingress restarting, or NATS away behind it
                op.error = repr(exc)[:300]
                await anyio.sleep(1.0)
                continue
            if response.status_code >= 500 or response.status_code == 429:
                op.error = f"{response.status_code} {response.text[:200]}"
                await anyio.sleep(1.0)
                continue
            op.error = ""
            try:
                return response.status_code, response.json()
            except ValueError:
                return response.status_code, {}
        return None

    def _token(self, tenant: str) -> str:
        return self.stack.token(tenant, principal(tenant), ttl_s=3600)
