"""Admission's SQL: proposals, the command registry and its outbox."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from schemas.governance import Decision

__all__ = ["AdmissionStore", "Admitted", "OutboxRow", "StoredCommand"]

OUTBOX_CHANNEL = "writ_outbox"


class StoredCommand(msgspec.Struct, frozen=True, kw_only=True):
    """The registry's view of one operation id."""

    request_hash: bytes
    state: str
    receipt: str | None
    reason: str | None
    decision_id: str
    decision_line: int
    policy_version: str
    origin: str
    operation_key: str | None
    request_id: str | None


class Admitted(msgspec.Struct, frozen=True, kw_only=True):
    """What the admission transaction found: created now, or already there (maybe conflicting)."""

    created: bool
    command: StoredCommand


class OutboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatch obligation waiting to be published."""

    id: int
    tenant: str
    operation_id: str


_COMMAND_COLUMNS = ("request_hash, state, receipt, reason, decision_id::text AS decision_id, "
                    "decision_line, policy_version, origin, operation_key, request_id")

_INSERT_PROPOSAL = """
INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent, action,
    action_version, arguments, request_hash, state, decision_id, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13)
ON CONFLICT (tenant, proposal_id) DO NOTHING
"""

# Seed 001 §4: only the first admission returns a row, so only it creates the dispatch obligation.
_ADMIT = """
WITH admitted AS (
    INSERT INTO admission.commands (tenant, operation_id, proposal_id, run_id, step, principal,
        agent, action, action_version, arguments, request_hash, decision_id, decision_line,
        policy_version, expires_at, expected_revision, origin, operation_key, request_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13, $14, $15, $16, $17,
            $18, $19)
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING tenant, operation_id
)
INSERT INTO admission.outbox (tenant, operation_id)
SELECT tenant, operation_id FROM admitted
RETURNING id
"""


class AdmissionStore:
    """Every write admission makes, each in one short transaction."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def command(self, tenant: str, operation_id: str) -> StoredCommand | None:
        """The registered command for this key, if any."""
        row = await self._pool.fetchrow(
            f"SELECT {_COMMAND_COLUMNS} FROM admission.commands "
            "WHERE tenant = $1 AND operation_id = $2", tenant, operation_id)
        return None if row is None else StoredCommand(**dict(row))

    async def record_proposal(self, *, tenant: str, proposal_id: str, run_id: str, step: int,
                              principal: str, agent: str, action: str, version: int,
                              arguments: dict[str, Any], request_hash: bytes, state: str,
                              decision_id: str | None, reason: str | None) -> None:
        """Record a proposal that did not become a command (refused, or waiting for a person)."""
        await self._pool.execute(
            _INSERT_PROPOSAL, tenant, proposal_id, run_id, step, principal, agent, action,
            version, json.dumps(arguments), request_hash, state, decision_id, reason)

    async def admit(self, *, tenant: str, operation_id: str, proposal_id: str, run_id: str,
                    step: int, principal: str, agent: str, action: str, version: int,
                    arguments: dict[str, Any], request_hash: bytes, decision: Decision,
                    ttl: timedelta, expected_revision: str | None = None,
                    operation_key: str | None = None,
                    request_id: str | None = None,
                    before_commit: Callable[[], None] | None = None) -> Admitted:
        """Proposal -> executing, command and outbox row, in one transaction (seed 001 §4)."""
        args_json = json.dumps(arguments)
        expires_at = datetime.now(UTC) + ttl
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                _INSERT_PROPOSAL, tenant, proposal_id, run_id, step, principal, agent, action,
                version, args_json, request_hash, "executing", decision.decision_id, None)
            outbox_id = await conn.fetchval(
                _ADMIT, tenant, operation_id, proposal_id, run_id, step, principal, agent,
                action, version, args_json, request_hash, decision.decision_id, decision.line,
                decision.policy_version, expires_at, expected_revision,
                "host" if operation_key is not None else "run", operation_key, request_id)
            # Read Committed: this statement sees a concurrent admission of the same key once
            # the unique check has waited for it, so the hash comparison below is sound.
            row = await conn.fetchrow(
                f"SELECT {_COMMAND_COLUMNS} FROM admission.commands "
                "WHERE tenant = $1 AND operation_id = $2", tenant, operation_id)
            if outbox_id is not None:
                await conn.execute("SELECT pg_notify($1, '')", OUTBOX_CHANNEL)
            if before_commit is not None:
                before_commit()
        return Admitted(created=outbox_id is not None, command=StoredCommand(**dict(row)))

    async def claim_outbox(self, conn: asyncpg.Connection, limit: int) -> list[OutboxRow]:
        """Lock up to `limit` due rows; other relay replicas skip them (SKIP LOCKED)."""
        rows = await conn.fetch(
            "SELECT id, tenant, operation_id::text AS operation_id FROM admission.outbox "
            "WHERE available_at <= now() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED", limit)
        return [OutboxRow(**dict(r)) for r in rows]

    async def delete_outbox(self, conn: asyncpg.Connection, ids: list[int]) -> None:
        """The rows were published; their obligation is discharged."""
        await conn.execute("DELETE FROM admission.outbox WHERE id = ANY($1::bigint[])", ids)

    def acquire(self) -> Any:
        """A pooled connection, for the relay's claim-publish-delete transaction."""
        return self._pool.acquire()
