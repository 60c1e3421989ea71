"""The dispatcher's SQL: fenced claims and finalisation of commands, and attempt records.

Every write after the claim is conditioned on the claim's `lease_epoch` (DESIGN.md §5): zero
rows changed means another worker took the lease over, and this one must stop.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from libs.errors import Fenced

__all__ = ["Claim", "DispatcherStore", "TERMINAL"]

TERMINAL = frozenset({"succeeded", "denied", "expired", "revision_required", "unknown", "failed"})


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A command this worker holds under `lease_epoch` until `lease_until`."""

    tenant: str
    operation_id: str
    lease_epoch: int
    lease_until: datetime
    run_id: str
    step: int
    action: str
    arguments: dict[str, Any]
    expires_at: datetime
    expected_revision: str | None


class Current(msgspec.Struct, frozen=True, kw_only=True):
    """A command's state as read, when it could not be claimed."""

    state: str
    run_id: str
    step: int
    action: str
    receipt: str | None
    reason: str | None
    lease_until: datetime | None


_CLAIM = """
UPDATE admission.commands
SET state = 'dispatching', lease_epoch = lease_epoch + 1, lease_owner = $3,
    lease_until = now() + make_interval(secs => $4), updated_at = now()
WHERE tenant = $1 AND operation_id = $2
  AND (state = 'pending' OR (state = 'dispatching' AND lease_until < now()))
RETURNING tenant, operation_id::text AS operation_id, lease_epoch, lease_until, run_id, step,
          action, arguments, expires_at, expected_revision
"""


class DispatcherStore:
    """Claims, attempts and outcomes."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def claim(self, tenant: str, operation_id: str, *, worker: str,
                    lease_s: float) -> Claim | None:
        """Take the lease if the command is pending or its holder's lease expired."""
        row = await self._pool.fetchrow(_CLAIM, tenant, operation_id, worker, lease_s)
        if row is None:
            return None
        values = dict(row)
        values["arguments"] = json.loads(values["arguments"])
        return Claim(**values)

    async def current(self, tenant: str, operation_id: str) -> Current | None:
        """The command's state, for a delivery that could not claim it."""
        row = await self._pool.fetchrow(
            "SELECT state, run_id, step, action, receipt, reason, lease_until "
            "FROM admission.commands WHERE tenant = $1 AND operation_id = $2",
            tenant, operation_id)
        return None if row is None else Current(**dict(row))

    async def start_attempt(self, claim: Claim, *, worker: str, connector: str) -> int:
        """Record that this worker is about to call the connector under this epoch."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._check_fence(conn, claim)
            return int(await conn.fetchval(
                "INSERT INTO dispatcher.attempts (tenant, operation_id, lease_epoch, worker, "
                "connector) VALUES ($1, $2, $3, $4, $5) RETURNING attempt_id",
                claim.tenant, claim.operation_id, claim.lease_epoch, worker, connector))

    async def finish(self, claim: Claim, attempt_id: int, *, state: str, result: str,
                     receipt: str | None, reason: str | None) -> None:
        """Record the attempt's result and the command's terminal state, fenced, atomically."""
        async with self._pool.acquire() as conn, conn.transaction():
            changed = await conn.fetchval(
                "WITH moved AS (UPDATE admission.commands SET state = $4, receipt = $5, "
                "reason = $6, lease_until = NULL, updated_at = now() "
                "WHERE tenant = $1 AND operation_id = $2 AND lease_epoch = $3 "
                "AND state = 'dispatching' RETURNING 1) SELECT count(*) FROM moved",
                claim.tenant, claim.operation_id, claim.lease_epoch, state, receipt, reason)
            if changed != 1:
                raise Fenced("lease taken over before finalising", operation_id=claim.operation_id)
            await conn.execute(
                "UPDATE dispatcher.attempts SET finished_at = now(), result = $2, detail = $3 "
                "WHERE attempt_id = $1", attempt_id, result, reason or receipt)

    async def release(self, claim: Claim, attempt_id: int | None, *, result: str,
                      detail: str) -> None:
        """Give the lease back after a transient failure so the next delivery can claim it."""
        async with self._pool.acquire() as conn, conn.transaction():
            changed = await conn.fetchval(
                "WITH moved AS (UPDATE admission.commands SET lease_until = now(), "
                "updated_at = now() WHERE tenant = $1 AND operation_id = $2 "
                "AND lease_epoch = $3 AND state = 'dispatching' RETURNING 1) "
                "SELECT count(*) FROM moved", claim.tenant, claim.operation_id, claim.lease_epoch)
            if changed != 1:
                raise Fenced("lease taken over before release", operation_id=claim.operation_id)
            if attempt_id is not None:
                await conn.execute(
                    "UPDATE dispatcher.attempts SET finished_at = now(), result = $2, "
                    "detail = $3 WHERE attempt_id = $1", attempt_id, result, detail)

    async def _check_fence(self, conn: asyncpg.Connection, claim: Claim) -> None:
        epoch = await conn.fetchval(
            "SELECT lease_epoch FROM admission.commands WHERE tenant = $1 AND operation_id = $2 "
            "FOR SHARE", claim.tenant, claim.operation_id)
        if epoch != claim.lease_epoch:
            raise Fenced("lease taken over", operation_id=claim.operation_id)
