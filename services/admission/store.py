"""Admission's SQL: proposals, the command registry and its outbox."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal
from libs.telemetry import inject_context
from schemas.governance import Decision

__all__ = [
    "COMMAND_STATES",
    "CommandAdmission",
    "AdmissionStore",
    "Admitted",
    "Backlog",
    "Known",
    "OutboxRow",
    "ProposalRow",
    "StoredCommand",
    "new_public_id",
]

OUTBOX_CHANNEL = "writ_outbox"
# Every state a command can be in (the CHECK on admission.commands.state).
COMMAND_STATES = (
    "pending",
    "dispatching",
    "succeeded",
    "denied",
    "expired",
    "revision_required",
    "unknown",
    "failed",
)


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


class ProposalRow(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal as stored, with its command's recorded state once it became one."""

    tenant: str
    proposal_id: str
    public_id: str
    run_id: str
    step: int
    principal: str
    agent: str
    action: str
    action_version: int
    arguments: dict[str, Any]
    preview: dict[str, Any]
    request_hash: bytes
    state: str
    decision_id: str | None
    reason: str | None
    expires_at: datetime | None
    approved_by: str | None
    expected_revision: str | None
    operation_key: str | None
    request_id: str | None
    traceparent: str | None  # the trace the proposal was made in (approval links back to it)
    operation_id: str | None
    command_state: str | None
    receipt: str | None
    command_reason: str | None


class Known(msgspec.Struct, frozen=True, kw_only=True):
    """What a proposal finds first: its command, its recorded refusal or ask, and the policy
    epoch before `decide` (None if governance's counter cannot be read)."""

    command: StoredCommand | None
    proposal: tuple[str, str | None, str] | None
    policy_epoch: int | None


class Backlog(msgspec.Struct, frozen=True, kw_only=True):
    """What the operators' gauges show: commands per state, the outbox's age, waiting asks."""

    commands: dict[str, int]
    outbox_oldest_s: float
    proposals_pending: int


class OutboxRow(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatch obligation waiting to be published."""

    id: int
    tenant: str
    operation_id: str
    traceparent: str | None = None  # the admitting span, so dispatch joins the run's trace


_COMMAND_COLUMNS = (
    "request_hash, state, receipt, reason, decision_id::text AS decision_id, "
    "decision_line, policy_version, origin, operation_key, request_id"
)

# `{journal}` in a statement is where its audit journal row goes (a CTE written only if the
# CTE it names changed something), or nothing when the store has no journal.
_INSERT_PROPOSAL = """
WITH recorded AS (
    INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent,
        action, action_version, arguments, request_hash, state, decision_id, reason,
        expected_revision, operation_key, request_id, public_id, preview, expires_at,
        traceparent, facts, facts_read_at, decision_line, policy_version)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15, $16, $17,
            $18::jsonb, $19, $20, $21::jsonb, $22, $23, $24)
    ON CONFLICT (tenant, proposal_id) DO NOTHING
    RETURNING public_id
){journal}
SELECT public_id FROM recorded
"""

# The reference architecture's admission in one statement: the proposal's pending -> executing
# claim, the command (ON CONFLICT DO NOTHING: RETURNING yields a row only for the first admission),
# its outbox row only if the command was created, and the relay's wake-up. $20 is the notification
# channel, $24 the policy epoch read before `decide` (NULL: the dispatcher's re-check asks again).
_ADMIT = """
WITH proposal AS (
    INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent,
        action, action_version, arguments, request_hash, state, decision_id, reason,
        expected_revision, operation_key, request_id, public_id, preview)
    VALUES ($1, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, 'executing', $12, NULL, $16,
            $18, $19, $22, $23::jsonb)
    ON CONFLICT (tenant, proposal_id) DO UPDATE
        SET state = 'executing', decision_id = EXCLUDED.decision_id, updated_at = now()
        WHERE admission.proposals.state = 'pending'
    RETURNING 1
), admitted AS (
    INSERT INTO admission.commands (tenant, operation_id, proposal_id, run_id, step, principal,
        agent, action, action_version, arguments, request_hash, decision_id, decision_line,
        policy_version, expires_at, expected_revision, origin, operation_key, request_id,
        preview, traceparent, policy_epoch)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13, $14, $15, $16, $17,
            $18, $19, $23::jsonb, $21, $24)
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING tenant, operation_id
), queued AS (
    INSERT INTO admission.outbox (tenant, operation_id, traceparent)
    SELECT tenant, operation_id, $21 FROM admitted
    RETURNING id
){journal}
SELECT (SELECT id FROM queued) AS outbox_id,
       (SELECT count(*) FROM (SELECT pg_notify($20, '') FROM queued) AS woken) AS woken,
       (SELECT count(*) FROM proposal) AS claimed
"""


_PROPOSAL_ROW = """
SELECT p.tenant, p.proposal_id::text AS proposal_id, p.public_id, p.run_id, p.step,
       p.principal, p.agent, p.action, p.action_version, p.arguments,
       coalesce(p.preview, '{}'::jsonb) AS preview, p.request_hash, p.state,
       p.decision_id::text AS decision_id, p.reason, p.expires_at, p.approved_by,
       p.expected_revision, p.operation_key, p.request_id, p.traceparent,
       c.operation_id::text AS operation_id, c.state AS command_state, c.receipt,
       c.reason AS command_reason
FROM admission.proposals p
LEFT JOIN admission.commands c ON c.tenant = p.tenant AND c.proposal_id = p.proposal_id
WHERE p.tenant = $1"""

# Approval by public id (the approval-contracts note): only a pending, unexpired proposal moves to
# executing, and only that move creates the command and its outbox row, from the proposal's frozen
# columns. $9 is the notification channel, $10 the admitting span's traceparent.
_APPROVE = """
WITH claimed AS (
    UPDATE admission.proposals
    SET state = 'executing', approved_by = $3, approved_at = now(), decision_id = $4,
        updated_at = now()
    WHERE tenant = $1 AND proposal_id = $2 AND state = 'pending' AND expires_at > now()
    RETURNING *
), admitted AS (
    INSERT INTO admission.commands (tenant, operation_id, proposal_id, run_id, step, principal,
        agent, action, action_version, arguments, request_hash, decision_id, decision_line,
        policy_version, expires_at, expected_revision, origin, operation_key, request_id,
        preview, traceparent)
    SELECT tenant, $8, proposal_id, run_id, step, principal, agent, action, action_version,
           arguments, request_hash, $4, $5, $6, $7, expected_revision,
           CASE WHEN operation_key IS NULL THEN 'run' ELSE 'host' END, operation_key,
           request_id, preview, $10
    FROM claimed
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING tenant, operation_id
), queued AS (
    INSERT INTO admission.outbox (tenant, operation_id, traceparent)
    SELECT tenant, operation_id, $10 FROM admitted
    RETURNING id
){journal}
SELECT (SELECT count(*) FROM claimed) = 1
       AND (SELECT count(*) FROM (SELECT pg_notify($9, '') FROM queued) AS woken) = 1
"""


def new_public_id() -> str:
    """An opaque, unguessable proposal id: nothing about the run or the step can be read from
    it, and knowing one proposal's id says nothing about another's."""
    return f"prop_{secrets.token_urlsafe(18)}"


def _proposal_row(row: Any) -> ProposalRow:
    values = dict(row)
    values["arguments"] = json.loads(values["arguments"])
    values["preview"] = json.loads(values["preview"])
    return ProposalRow(**values)


_MOVE_PROPOSAL = """
WITH moved AS (
    UPDATE admission.proposals SET state = $3, reason = $4, updated_at = now()
    WHERE tenant = $1 AND proposal_id = $2 AND state = 'pending' {condition}
    RETURNING 1
){journal}
SELECT count(*) FROM moved
"""


# With the governance policy epoch as it stands before `decide` is asked (see `known`).
_KNOWN = f"""
SELECT c.*, p.state AS proposal_state, p.decision_id::text AS proposal_decision_id,
       coalesce(p.reason, '') AS proposal_reason,
       (SELECT epoch FROM governance.policy_epoch) AS policy_epoch
FROM (SELECT 1) AS one
LEFT JOIN (SELECT {_COMMAND_COLUMNS} FROM admission.commands
           WHERE tenant = $1 AND operation_id = $2) AS c ON true
LEFT JOIN admission.proposals p ON p.tenant = $1 AND p.proposal_id = $3
"""


_KNOWN_MANY = f"""
SELECT c.*, p.state AS proposal_state, p.decision_id::text AS proposal_decision_id,
       coalesce(p.reason, '') AS proposal_reason,
       (SELECT epoch FROM governance.policy_epoch) AS policy_epoch
FROM unnest($1::text[], $2::uuid[], $3::uuid[]) WITH ORDINALITY AS k(tenant, operation_id,
                                                                       proposal_id, i)
LEFT JOIN LATERAL (SELECT {_COMMAND_COLUMNS} FROM admission.commands
                   WHERE tenant = k.tenant AND operation_id = k.operation_id) AS c ON true
LEFT JOIN admission.proposals p ON p.tenant = k.tenant AND p.proposal_id = k.proposal_id
ORDER BY k.i
"""


def _known(row: Any) -> Known:
    command = None
    if row["state"] is not None:
        command = StoredCommand(**{k: row[k] for k in StoredCommand.__struct_fields__})
    proposal = None
    if row["proposal_state"] is not None:
        proposal = (row["proposal_state"], row["proposal_decision_id"], row["proposal_reason"])
    return Known(command=command, proposal=proposal, policy_epoch=row["policy_epoch"])


class CommandAdmission(msgspec.Struct, frozen=True, kw_only=True):
    """One proposal to admit as a command (`AdmissionStore.admit`, `admit_many`)."""

    tenant: str
    operation_id: str
    proposal_id: str
    run_id: str
    step: int
    principal: str
    agent: str
    action: str
    version: int
    arguments: dict[str, Any]
    request_hash: bytes
    decision: Decision
    ttl: timedelta
    preview: dict[str, Any]
    expected_revision: str | None = None
    operation_key: str | None = None
    request_id: str | None = None
    policy_epoch: int | None = None
    traceparent: str | None = None  # the admitting span, so the dispatch joins its trace

    @property
    def origin(self) -> str:
        return "host" if self.operation_key is not None else "run"


class AdmissionStore:
    """Every write admission makes, each in one short transaction."""

    def __init__(self, pool: asyncpg.Pool, journal: Journal | None = None) -> None:
        self._pool, self._journal = pool, journal
        self._insert_proposal = self._journaled(_INSERT_PROPOSAL, 25, "recorded")
        self._admit = self._journaled(_ADMIT, 25, "admitted")
        self._approve = self._journaled(_APPROVE, 11, "admitted")
        self._reject = self._journaled(_MOVE_PROPOSAL.replace("{condition}", ""), 5, "moved")
        self._expire = self._journaled(
            _MOVE_PROPOSAL.replace("{condition}", "AND expires_at <= now()"), 5, "moved"
        )

    def _journaled(self, statement: str, first: int, changed: str) -> str:
        """The statement with its journal row, written only if `changed` changed anything."""
        row = "" if self._journal is None else ", " + self._journal.cte_if(first, changed)
        return statement.replace("{journal}", row)

    def _entry(
        self, tenant: str, kind: str, subject: str, run_id: str, payload: dict[str, Any]
    ) -> tuple[Any, ...]:
        """The journal row's parameters (none without a journal)."""
        if self._journal is None:
            return ()
        return msgspec.structs.astuple(
            self._journal.entry(
                tenant=tenant, kind=kind, subject=subject, run_id=run_id, payload=payload
            )
        )

    async def command(self, tenant: str, operation_id: str) -> StoredCommand | None:
        """The registered command for this key, if any."""
        row = await self._pool.fetchrow(
            f"SELECT {_COMMAND_COLUMNS} FROM admission.commands "
            "WHERE tenant = $1 AND operation_id = $2",
            tenant,
            operation_id,
        )
        return None if row is None else StoredCommand(**dict(row))

    async def record_proposal(
        self,
        *,
        tenant: str,
        proposal_id: str,
        run_id: str,
        step: int,
        principal: str,
        agent: str,
        action: str,
        version: int,
        arguments: dict[str, Any],
        request_hash: bytes,
        state: str,
        decision_id: str | None,
        reason: str | None,
        preview: dict[str, Any],
        ttl: timedelta,
        expected_revision: str | None = None,
        operation_key: str | None = None,
        request_id: str | None = None,
        facts: Any = None,
        facts_read_at: datetime | None = None,
        decision_line: int | None = None,
        policy_version: str | None = None,
    ) -> ProposalRow:
        """Record a proposal that did not become a command (refused, or waiting for a person),
        under a new opaque public id; a redelivery gets the row recorded the first time."""
        public_id, expires_at = new_public_id(), datetime.now(UTC) + ttl
        await self._pool.execute(
            self._insert_proposal,
            tenant,
            proposal_id,
            run_id,
            step,
            principal,
            agent,
            action,
            version,
            json.dumps(arguments),
            request_hash,
            state,
            decision_id,
            reason,
            expected_revision,
            operation_key,
            request_id,
            public_id,
            json.dumps(preview),
            expires_at,
            inject_context({}).get("traceparent"),
            None if facts is None else json.dumps(facts),
            facts_read_at,
            decision_line,
            policy_version,
            *self._entry(
                tenant,
                f"proposal.{state}",
                public_id,
                run_id,
                {
                    "proposal_id": proposal_id,
                    "public_id": public_id,
                    "step": step,
                    "principal": principal,
                    "agent": agent,
                    "action": action,
                    "version": version,
                    "arguments": arguments,
                    "preview": preview,
                    "request_hash": request_hash.hex(),
                    "decision_id": decision_id,
                    "reason": reason,
                    "expires_at": expires_at,
                    "operation_key": operation_key,
                },
            ),
        )
        row = await self.proposal_row(tenant, proposal_id=proposal_id)
        assert row is not None
        return row

    async def proposal_row(
        self, tenant: str, *, proposal_id: str | None = None, public_id: str | None = None
    ) -> ProposalRow | None:
        """A proposal by its internal or its public id, within the tenant, with the state of
        the command it became (if it did)."""
        row = await self._pool.fetchrow(
            _PROPOSAL_ROW + (" AND p.proposal_id = $2" if proposal_id else " AND p.public_id = $2"),
            tenant,
            proposal_id or public_id,
        )
        return None if row is None else _proposal_row(row)

    async def expire_proposal(self, tenant: str, proposal_id: str) -> bool:
        """pending -> expired once its time is over; False if it was not pending any more."""
        moved = await self._pool.fetchval(
            self._expire,
            tenant,
            proposal_id,
            "expired",
            "expired",
            *self._entry(tenant, "proposal.expired", proposal_id, "", {"proposal_id": proposal_id}),
        )
        return bool(moved)

    async def approve_for_execution(
        self,
        proposal: ProposalRow,
        *,
        approver: str,
        decision: Decision,
        ttl: timedelta,
        operation_id: str,
    ) -> bool:
        """The one pending -> executing claim of the approval-contracts note, with the command and
        its outbox row, in one statement: True for exactly one approval of a pending, unexpired
        proposal."""
        expires_at = datetime.now(UTC) + ttl
        claimed = await self._pool.fetchval(
            self._approve,
            proposal.tenant,
            proposal.proposal_id,
            approver,
            decision.decision_id,
            decision.line,
            decision.policy_version,
            expires_at,
            operation_id,
            OUTBOX_CHANNEL,
            inject_context({}).get("traceparent"),
            *self._entry(
                proposal.tenant,
                "proposal.approved",
                proposal.public_id,
                proposal.run_id,
                {
                    "proposal_id": proposal.proposal_id,
                    "approved_by": approver,
                    "decision_id": decision.decision_id,
                    "line": decision.line,
                    "policy_version": decision.policy_version,
                    "operation_id": operation_id,
                    "expires_at": expires_at,
                    "request_hash": proposal.request_hash.hex(),
                },
            ),
        )
        return bool(claimed)

    async def known(self, tenant: str, operation_id: str, proposal_id: str) -> Known:
        """The command registered under this key and the proposal's recorded state, if any,
        and governance's policy epoch: one round trip for what every proposal must check first.

        The epoch is read before `decide` is asked, so a change `decide` did not see has a
        later epoch than this one (the dispatcher compares them).
        """
        row = await self._pool.fetchrow(_KNOWN, tenant, operation_id, proposal_id)
        assert row is not None
        return _known(row)

    async def known_many(self, keys: list[tuple[str, str, str]]) -> list[Known]:
        """`known` for each (tenant, operation id, proposal id), in order, in one statement."""
        rows = await self._pool.fetch(
            _KNOWN_MANY, [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]
        )
        return [_known(row) for row in rows]

    async def proposal(self, tenant: str, proposal_id: str) -> tuple[str, str | None, str] | None:
        """(state, decision id, reason) of a proposal already recorded, if any."""
        row = await self._pool.fetchrow(
            "SELECT state, decision_id::text AS decision_id, coalesce(reason, '') AS reason "
            "FROM admission.proposals WHERE tenant = $1 AND proposal_id = $2",
            tenant,
            proposal_id,
        )
        return None if row is None else (row["state"], row["decision_id"], row["reason"])

    async def reject_proposal(self, tenant: str, proposal_id: str, reason: str) -> bool:
        """pending -> rejected; False if it was not pending any more."""
        moved = await self._pool.fetchval(
            self._reject,
            tenant,
            proposal_id,
            "rejected",
            reason,
            *self._entry(
                tenant,
                "proposal.rejected",
                proposal_id,
                "",
                {"proposal_id": proposal_id, "reason": reason},
            ),
        )
        return bool(moved)

    async def admit(
        self, *, before_commit: Callable[[], None] | None = None, **admission: Any
    ) -> Admitted:
        """Proposal -> executing, command and outbox row, in one statement (the reference
        architecture).

        `admission` is `CommandAdmission`'s fields. Its `policy_epoch` is governance's epoch read
        before `decide` answered (`known`): while it stands, the dispatcher's re-check is this
        admission's allow.
        """
        a = CommandAdmission(traceparent=inject_context({}).get("traceparent"), **admission)
        async with self._pool.acquire() as conn:
            if before_commit is not None:
                before_commit()  # the fault suite's "before the admission commit"
            # One statement is one transaction: no BEGIN / COMMIT round trips, and a failure
            # (or the statement timeout) rolls all of it back.
            return await self._admit_on(conn, a, self._admit_args(a))

    async def admit_many(
        self, admissions: list[CommandAdmission], *, before_commit: Callable[[], None] | None = None
    ) -> list[Admitted]:
        """`admit` for each, in order, in one transaction: one commit (and one wake-up of the
        relay) for all. Any failure rolls all of them back."""
        args = [self._admit_args(a) for a in admissions]  # encrypting is no work for Postgres
        async with self._pool.acquire() as conn, conn.transaction():
            admitted = [
                await self._admit_on(conn, a, arg) for a, arg in zip(admissions, args, strict=True)
            ]
            if before_commit is not None:
                before_commit()  # the fault suite's "before the admission commit"
        return admitted

    def _admit_args(self, a: CommandAdmission) -> tuple[Any, ...]:
        expires_at = datetime.now(UTC) + a.ttl
        return (
            a.tenant,
            a.operation_id,
            a.proposal_id,
            a.run_id,
            a.step,
            a.principal,
            a.agent,
            a.action,
            a.version,
            json.dumps(a.arguments),
            a.request_hash,
            a.decision.decision_id,
            a.decision.line,
            a.decision.policy_version,
            expires_at,
            a.expected_revision,
            a.origin,
            a.operation_key,
            a.request_id,
            OUTBOX_CHANNEL,
            a.traceparent,
            new_public_id(),
            json.dumps(a.preview),
            a.policy_epoch,
            *self._entry(
                a.tenant,
                "command.admitted",
                a.operation_id,
                a.run_id,
                {
                    "operation_id": a.operation_id,
                    "proposal_id": a.proposal_id,
                    "step": a.step,
                    "principal": a.principal,
                    "agent": a.agent,
                    "action": a.action,
                    "version": a.version,
                    "arguments": a.arguments,
                    "preview": a.preview,
                    "request_hash": a.request_hash.hex(),
                    "decision_id": a.decision.decision_id,
                    "line": a.decision.line,
                    "policy_version": a.decision.policy_version,
                    "expires_at": expires_at,
                    "origin": a.origin,
                    "operation_key": a.operation_key,
                    "policy_epoch": a.policy_epoch,
                },
            ),
        )

    async def _admit_on(
        self, conn: asyncpg.Connection, a: CommandAdmission, args: tuple[Any, ...]
    ) -> Admitted:
        outbox_id = await conn.fetchval(self._admit, *args)
        if outbox_id is not None:
            return Admitted(
                created=True,
                command=StoredCommand(
                    request_hash=a.request_hash,
                    state="pending",
                    receipt=None,
                    reason=None,
                    decision_id=a.decision.decision_id,
                    decision_line=a.decision.line,
                    policy_version=a.decision.policy_version,
                    origin=a.origin,
                    operation_key=a.operation_key,
                    request_id=a.request_id,
                ),
            )
        # Someone admitted this key first. Read Committed: this new statement sees their
        # committed row (the unique check waited for it), so comparing hashes is sound.
        row = await conn.fetchrow(
            f"SELECT {_COMMAND_COLUMNS} FROM admission.commands "
            "WHERE tenant = $1 AND operation_id = $2",
            a.tenant,
            a.operation_id,
        )
        return Admitted(created=False, command=StoredCommand(**dict(row)))

    async def claim_outbox(self, conn: asyncpg.Connection, limit: int) -> list[OutboxRow]:
        """Lock up to `limit` due rows; other relay replicas skip them (SKIP LOCKED)."""
        rows = await conn.fetch(
            "SELECT id, tenant, operation_id::text AS operation_id, traceparent "
            "FROM admission.outbox "
            "WHERE available_at <= now() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
            limit,
        )
        return [OutboxRow(**dict(r)) for r in rows]

    async def delete_outbox(self, conn: asyncpg.Connection, ids: list[int]) -> None:
        """The rows were published; their obligation is discharged."""
        await conn.execute("DELETE FROM admission.outbox WHERE id = ANY($1::bigint[])", ids)

    async def backlog(self) -> Backlog:
        """Commands per state (every state, 0 when none), the age of the oldest outbox row
        (0 when empty) and the proposals waiting for a person, read in one snapshot."""
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            rows = await conn.fetch(
                "SELECT state, count(*) AS n FROM admission.commands GROUP BY state"
            )
            oldest = await conn.fetchval(
                "SELECT coalesce(extract(epoch FROM now() - min(available_at)), 0)::float8 "
                "FROM admission.outbox"
            )
            pending = await conn.fetchval(
                "SELECT count(*) FROM admission.proposals WHERE state = 'pending'"
            )
        commands = dict.fromkeys(COMMAND_STATES, 0)
        commands.update({r["state"]: int(r["n"]) for r in rows if r["state"] in commands})
        return Backlog(
            commands=commands,
            outbox_oldest_s=max(float(oldest), 0.0),
            proposals_pending=int(pending),
        )

    def acquire(self) -> Any:
        """A pooled connection, for the relay's claim-publish-delete transaction."""
        return self._pool.acquire()
