"""The dispatcher's SQL: fenced claims and finalisation of commands, and attempt records.

Every write after the claim is conditioned on the claim's `lease_epoch` (docs/design.md §5): zero
rows changed means another worker took the lease over, and this one must stop.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from libs.errors import Fenced
from libs.journal import Journal
from libs.telemetry import inject_context

__all__ = ["Claim", "DispatcherStore", "PriorAttempt", "StaleCommand", "TERMINAL", "Unknown"]

TERMINAL = frozenset({"succeeded", "denied", "expired", "revision_required", "unknown", "failed"})


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A command this worker holds under `lease_epoch` until `lease_until`."""

    tenant: str
    operation_id: str
    lease_epoch: int
    lease_until: datetime
    run_id: str
    step: int
    principal: str
    agent: str
    action: str
    arguments: dict[str, Any]
    expires_at: datetime
    expected_revision: str | None
    decision_id: str
    origin: str
    preview: dict[str, Any]
    traceparent: str | None = None  # the trace the command was admitted in
    # Governance's policy epoch read before the admission's `decide` (None: not recorded).
    policy_epoch: int | None = None
    # At the claim: the epoch has not moved since and the admission is recent, so nothing
    # `decide` reads for this call has changed and the admission's allow is the re-check.
    decision_current: bool = False
    # How this holder re-checked the policy, for the attempt's journal row.
    recheck: str | None = None
    # The approval receipt admission signed for this command, forwarded unread
    # (`Writ-Authorization`; docs/receipts.md). None: admission signed none.
    authorization: str | None = None


class PriorAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """An attempt by an earlier lease holder that may have reached the provider."""

    lease_epoch: int
    worker: str
    result: str | None
    traceparent: str | None = None  # the trace the attempt ran in


class StaleCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command the bus may have lost: pending too long, or its holder's lease expired."""

    tenant: str
    operation_id: str
    state: str


class Unknown(msgspec.Struct, frozen=True, kw_only=True):
    """A command whose outcome nobody knows, waiting for reconciliation."""

    tenant: str
    operation_id: str
    action: str
    principal: str
    arguments: dict[str, Any]
    reason: str | None
    updated_at: datetime


class Current(msgspec.Struct, frozen=True, kw_only=True):
    """A command's state as read, when it could not be claimed."""

    state: str
    run_id: str
    step: int
    action: str
    receipt: str | None
    reason: str | None
    lease_until: datetime | None
    origin: str


# $5: how old (seconds) an admission's allow may be and still stand for the re-check (see
# `Claim.decision_current`); the epoch is read in the claim's own snapshot.
_CLAIM = """
UPDATE admission.commands
SET state = 'dispatching', lease_epoch = lease_epoch + 1, lease_owner = $3,
    lease_until = now() + make_interval(secs => $4), updated_at = now()
WHERE tenant = $1 AND operation_id = $2
  AND (state = 'pending' OR (state = 'dispatching' AND lease_until < now()))
RETURNING tenant, operation_id::text AS operation_id, lease_epoch, lease_until, run_id, step,
          principal, agent, action, arguments, expires_at, expected_revision,
          decision_id::text AS decision_id, origin, coalesce(preview, '{}'::jsonb) AS preview,
          traceparent, policy_epoch,
          coalesce(policy_epoch = (SELECT epoch FROM governance.policy_epoch)
                   AND created_at > now() - make_interval(secs => $5), false)
              AS decision_current,
          (SELECT a.token FROM admission.authorizations a
           WHERE a.tenant = $1 AND a.operation_id = $2) AS "authorization"
"""

# `_CLAIM` for a fetched batch's commands at once ($1 tenants, $2 operation ids, in pairs): one
# statement, one commit. Each row is fenced exactly as `_CLAIM` fences it; a command not
# claimable (or listed twice) is simply not returned.
_CLAIM_MANY = """
UPDATE admission.commands AS c
SET state = 'dispatching', lease_epoch = c.lease_epoch + 1, lease_owner = $3,
    lease_until = now() + make_interval(secs => $4), updated_at = now()
FROM unnest($1::text[], $2::uuid[]) AS k(tenant, operation_id)
WHERE c.tenant = k.tenant AND c.operation_id = k.operation_id
  AND (c.state = 'pending' OR (c.state = 'dispatching' AND c.lease_until < now()))
RETURNING c.tenant, c.operation_id::text AS operation_id, c.lease_epoch, c.lease_until,
          c.run_id, c.step, c.principal, c.agent, c.action, c.arguments, c.expires_at,
          c.expected_revision, c.decision_id::text AS decision_id, c.origin,
          coalesce(c.preview, '{}'::jsonb) AS preview, c.traceparent, c.policy_epoch,
          coalesce(c.policy_epoch = (SELECT epoch FROM governance.policy_epoch)
                   AND c.created_at > now() - make_interval(secs => $5), false)
              AS decision_current,
          (SELECT a.token FROM admission.authorizations a
           WHERE a.tenant = c.tenant AND a.operation_id = c.operation_id) AS "authorization"
"""

_START_ATTEMPT = """
WITH started AS (
    INSERT INTO dispatcher.attempts (tenant, operation_id, lease_epoch, worker, connector,
        traceparent)
    SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (
        SELECT 1 FROM admission.commands
        WHERE tenant = $1 AND operation_id = $2 AND lease_epoch = $3)
    RETURNING attempt_id
){journal}
SELECT attempt_id FROM started
"""

_FINISH = """
WITH moved AS (
    UPDATE admission.commands SET state = $4, receipt = $5, reason = $6, lease_until = NULL,
        updated_at = now()
    WHERE tenant = $1 AND operation_id = $2 AND lease_epoch = $3 AND state = 'dispatching'
    RETURNING 1
), attempt AS (
    UPDATE dispatcher.attempts SET finished_at = now(), result = $7, detail = $8
    WHERE attempt_id = $9 AND EXISTS (SELECT 1 FROM moved)
    RETURNING 1
){journal}
SELECT count(*) FROM moved
"""


class DispatcherStore:
    """Claims, attempts and outcomes; every attempt and outcome journaled with it."""

    def __init__(self, pool: asyncpg.Pool, journal: Journal | None = None) -> None:
        self._pool, self._journal = pool, journal
        self._start_attempt = self._journaled(_START_ATTEMPT, 7, "started")
        self._finish = self._journaled(_FINISH, 10, "moved")

    def _journaled(self, statement: str, first: int, changed: str) -> str:
        """The statement with its journal row, written only if `changed` changed anything."""
        row = "" if self._journal is None else ", " + self._journal.cte_if(first, changed)
        return statement.replace("{journal}", row)

    async def _entry(self, claim: Claim, kind: str, payload: dict[str, Any]) -> tuple[Any, ...]:
        """The journal row's parameters (none without a journal), its window key made first."""
        if self._journal is None:
            return ()
        await self._journal.prepare(claim.tenant, claim.run_id)
        return msgspec.structs.astuple(
            self._journal.entry(
                tenant=claim.tenant,
                kind=kind,
                subject=claim.operation_id,
                run_id=claim.run_id,
                payload={
                    "operation_id": claim.operation_id,
                    "lease_epoch": claim.lease_epoch,
                    "action": claim.action,
                    **payload,
                },
            )
        )

    async def _write(
        self,
        conn: asyncpg.Connection,
        *,
        tenant: str,
        kind: str,
        subject: str,
        run_id: str,
        payload: dict[str, Any],
    ) -> None:
        if self._journal is not None:
            await self._journal.write(
                conn, tenant=tenant, kind=kind, subject=subject, run_id=run_id, payload=payload
            )

    async def claim(
        self,
        tenant: str,
        operation_id: str,
        *,
        worker: str,
        lease_s: float,
        reuse_decision_s: float = 0.0,
    ) -> Claim | None:
        """Take the lease if the command is pending or its holder's lease expired.

        `reuse_decision_s` > 0: say whether the admission's allow (at most that old, under the
        policy epoch that still stands) can be the re-check (`Claim.decision_current`).
        """
        row = await self._pool.fetchrow(
            _CLAIM, tenant, operation_id, worker, lease_s, reuse_decision_s
        )
        if row is None:
            return None
        values = dict(row)
        values["arguments"] = json.loads(values["arguments"])
        values["preview"] = json.loads(values["preview"])
        return Claim(**values)

    async def claim_many(
        self,
        keys: list[tuple[str, str]],
        *,
        worker: str,
        lease_s: float,
        reuse_decision_s: float = 0.0,
    ) -> dict[tuple[str, str], Claim]:
        """`claim` for each (tenant, operation id), in one statement: the claims taken, by key.

        Raises if the statement fails (nothing was claimed then).
        """
        rows = await self._pool.fetch(
            _CLAIM_MANY,
            [k[0] for k in keys],
            [k[1] for k in keys],
            worker,
            lease_s,
            reuse_decision_s,
        )
        claims = {}
        for row in rows:
            values = dict(row)
            values["arguments"] = json.loads(values["arguments"])
            values["preview"] = json.loads(values["preview"])
            claims[(values["tenant"], values["operation_id"])] = Claim(**values)
        return claims

    async def current(self, tenant: str, operation_id: str) -> Current | None:
        """The command's state, for a delivery that could not claim it."""
        row = await self._pool.fetchrow(
            "SELECT state, run_id, step, action, receipt, reason, lease_until, origin "
            "FROM admission.commands WHERE tenant = $1 AND operation_id = $2",
            tenant,
            operation_id,
        )
        return None if row is None else Current(**dict(row))

    async def start_attempt(self, claim: Claim, *, worker: str, connector: str) -> int:
        """Record that this worker is about to call the connector under this epoch."""
        attempt = await self._pool.fetchval(
            self._start_attempt,
            claim.tenant,
            claim.operation_id,
            claim.lease_epoch,
            worker,
            connector,
            inject_context({}).get("traceparent"),
            *(
                await self._entry(
                    claim,
                    "attempt.started",
                    {"worker": worker, "connector": connector, "recheck": claim.recheck},
                )
            ),
        )
        if attempt is None:
            raise Fenced("lease taken over", operation_id=claim.operation_id)
        return int(attempt)

    async def start_attempts(
        self, starts: list[tuple[Claim, str, str | None]], *, worker: str
    ) -> list[int | None]:
        """`start_attempt` for each (claim, connector, traceparent), in one transaction: each
        statement fenced on its own claim's epoch, one commit for all. None where fenced.

        Raises if the transaction fails (no attempt was recorded then).
        """
        attempts: list[int | None] = []
        async with self._pool.acquire() as conn, conn.transaction():
            for claim, connector, traceparent in starts:
                attempt = await conn.fetchval(
                    self._start_attempt,
                    claim.tenant,
                    claim.operation_id,
                    claim.lease_epoch,
                    worker,
                    connector,
                    traceparent,
                    *(
                        await self._entry(
                            claim,
                            "attempt.started",
                            {"worker": worker, "connector": connector, "recheck": claim.recheck},
                        )
                    ),
                )
                attempts.append(None if attempt is None else int(attempt))
        return attempts

    async def finish_many(
        self, finishes: list[tuple[Claim, int, str, str, str | None, str | None]]
    ) -> list[bool]:
        """`finish` for each (claim, attempt id, state, result, receipt, reason), in one
        transaction: each statement fenced on its own claim's epoch, one commit for all.
        False where fenced (nothing of that one changed).

        Raises if the transaction fails (none was finished then).
        """
        finished: list[bool] = []
        async with self._pool.acquire() as conn, conn.transaction():
            for claim, attempt_id, state, result, receipt, reason in finishes:
                changed = await conn.fetchval(
                    self._finish,
                    claim.tenant,
                    claim.operation_id,
                    claim.lease_epoch,
                    state,
                    receipt,
                    reason,
                    result,
                    reason or receipt,
                    attempt_id,
                    *(
                        await self._entry(
                            claim,
                            f"command.{state}",
                            {
                                "attempt_id": attempt_id,
                                "result": result,
                                "receipt": receipt,
                                "reason": reason,
                            },
                        )
                    ),
                )
                finished.append(changed == 1)
        return finished

    async def finish(
        self,
        claim: Claim,
        attempt_id: int,
        *,
        state: str,
        result: str,
        receipt: str | None,
        reason: str | None,
        conn: asyncpg.Connection | None = None,
    ) -> None:
        """Record the command's terminal state and the attempt's result: one fenced statement
        (inside `conn`'s transaction when given, so a local change commits with it)."""
        changed = await (conn or self._pool).fetchval(
            self._finish,
            claim.tenant,
            claim.operation_id,
            claim.lease_epoch,
            state,
            receipt,
            reason,
            result,
            reason or receipt,
            attempt_id,
            *(
                await self._entry(
                    claim,
                    f"command.{state}",
                    {
                        "attempt_id": attempt_id,
                        "result": result,
                        "receipt": receipt,
                        "reason": reason,
                    },
                )
            ),
        )
        if changed != 1:
            raise Fenced("lease taken over before finalising", operation_id=claim.operation_id)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection in a transaction, for a local operation and its outcome together."""
        async with self._pool.acquire() as conn, conn.transaction():
            yield conn

    async def release(
        self,
        claim: Claim,
        attempt_id: int | None,
        *,
        result: str,
        detail: str,
        not_before_s: float = 0.0,
    ) -> None:
        """Give the lease back after a transient failure so a later delivery can claim it.

        `not_before_s` keeps it unclaimable for that long (an open circuit's cooldown), so the
        sweeper does not pick it up again on every pass meanwhile.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            changed = await conn.fetchval(
                "WITH moved AS (UPDATE admission.commands "
                "SET lease_until = now() + make_interval(secs => $4), updated_at = now() "
                "WHERE tenant = $1 AND operation_id = $2 "
                "AND lease_epoch = $3 AND state = 'dispatching' RETURNING 1) "
                "SELECT count(*) FROM moved",
                claim.tenant,
                claim.operation_id,
                claim.lease_epoch,
                not_before_s,
            )
            if changed != 1:
                raise Fenced("lease taken over before release", operation_id=claim.operation_id)
            if attempt_id is not None:
                await conn.execute(
                    "UPDATE dispatcher.attempts SET finished_at = now(), result = $2, "
                    "detail = $3 WHERE attempt_id = $1",
                    attempt_id,
                    result,
                    detail,
                )
                await self._write(
                    conn,
                    tenant=claim.tenant,
                    kind="attempt.released",
                    subject=claim.operation_id,
                    run_id=claim.run_id,
                    payload={
                        "operation_id": claim.operation_id,
                        "lease_epoch": claim.lease_epoch,
                        "attempt_id": attempt_id,
                        "result": result,
                        "detail": detail,
                    },
                )

    async def renew(self, claim: Claim, lease_s: float) -> datetime:
        """Extend the lease, fenced: raises `Fenced` if another worker took it over."""
        until = await self._pool.fetchval(
            "UPDATE admission.commands SET lease_until = now() + make_interval(secs => $4) "
            "WHERE tenant = $1 AND operation_id = $2 AND lease_epoch = $3 "
            "AND state = 'dispatching' RETURNING lease_until",
            claim.tenant,
            claim.operation_id,
            claim.lease_epoch,
            lease_s,
        )
        if until is None:
            raise Fenced("lease taken over while renewing", operation_id=claim.operation_id)
        return until

    async def prior_attempts(self, claim: Claim) -> list[PriorAttempt]:
        """Earlier holders' attempts that may have acted: unfinished, or finished `lost`."""
        rows = await self._pool.fetch(
            "SELECT lease_epoch, worker, result, traceparent FROM dispatcher.attempts "
            "WHERE tenant = $1 AND operation_id = $2 AND lease_epoch < $3 "
            "AND (result IS NULL OR result = 'lost') ORDER BY lease_epoch",
            claim.tenant,
            claim.operation_id,
            claim.lease_epoch,
        )
        return [PriorAttempt(**dict(r)) for r in rows]

    async def stale(self, *, pending_grace_s: float, limit: int = 100) -> list[StaleCommand]:
        """Commands to re-drive without the bus (docs/design.md §5: JetStream can lose messages).

        A pending command still in admission's outbox has not been published yet: the relay
        owes it, and signs its approval receipt first, so it is not taken before that.
        """
        rows = await self._pool.fetch(
            "SELECT tenant, operation_id::text AS operation_id, state FROM admission.commands c "
            "WHERE (state = 'dispatching' AND lease_until < now()) "
            "   OR (state = 'pending' AND updated_at < now() - make_interval(secs => $1) "
            "       AND NOT EXISTS (SELECT 1 FROM admission.outbox o WHERE o.tenant = c.tenant "
            "                       AND o.operation_id = c.operation_id)) "
            "ORDER BY updated_at LIMIT $2",
            pending_grace_s,
            limit,
        )
        return [StaleCommand(**dict(r)) for r in rows]

    async def count_unknown(self) -> int:
        """How many commands, across tenants, wait in `unknown` for reconciliation."""
        return int(
            await self._pool.fetchval(
                "SELECT count(*) FROM admission.commands WHERE state = 'unknown'"
            )
        )

    async def unknown(self, tenant: str, limit: int = 500) -> list[Unknown]:
        """The tenant's commands in `unknown`, oldest first."""
        rows = await self._pool.fetch(
            "SELECT tenant, operation_id::text AS operation_id, action, principal, arguments, "
            "reason, updated_at FROM admission.commands WHERE tenant = $1 AND state = 'unknown' "
            "ORDER BY updated_at LIMIT $2",
            tenant,
            limit,
        )
        return [Unknown(**{**dict(r), "arguments": json.loads(r["arguments"])}) for r in rows]

    async def reconcile(
        self,
        tenant: str,
        operation_id: str,
        *,
        state: str,
        receipt: str | None,
        evidence: str,
        resolved_by: str,
    ) -> Current | None:
        """Leave `unknown` with recorded evidence; None if the command is not `unknown`."""
        async with self._pool.acquire() as conn, conn.transaction():
            moved = await conn.fetchrow(
                "UPDATE admission.commands SET state = $3, receipt = $4, "
                "reason = 'reconciled: ' || $5, updated_at = now() "
                "WHERE tenant = $1 AND operation_id = $2 AND state = 'unknown' "
                "RETURNING state, run_id, step, action, receipt, reason, lease_until, origin",
                tenant,
                operation_id,
                state,
                receipt,
                evidence[:400],
            )
            if moved is None:
                return None
            await conn.execute(
                "INSERT INTO admission.reconciliations (tenant, operation_id, resolved_state, "
                "receipt, evidence, resolved_by) VALUES ($1, $2, $3, $4, $5, $6)",
                tenant,
                operation_id,
                state,
                receipt,
                evidence,
                resolved_by,
            )
            await self._write(
                conn,
                tenant=tenant,
                kind="command.reconciled",
                subject=operation_id,
                run_id=moved["run_id"],
                payload={
                    "operation_id": operation_id,
                    "state": state,
                    "receipt": receipt,
                    "evidence": evidence,
                    "resolved_by": resolved_by,
                },
            )
        return Current(**dict(moved))
