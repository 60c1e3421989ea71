"""Admission's SQL: proposals, the command registry and its outbox."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal
from libs.telemetry import inject_context
from schemas.governance import Decision
from schemas.planner import ProposeCommand
from services.admission import _statements as sql
from services.admission._rows import (
    COMMAND_STATES,
    OUTBOX_CHANNEL,
    Admitted,
    Approval,
    Backlog,
    CommandAdmission,
    Known,
    OutboxRow,
    ProposalRow,
    ResolvedFacts,
    StoredCommand,
    approvals_of,
    known_of,
    new_public_id,
    proposal_of,
)
from services.admission._sealed import SealedProposal, open_payload, seal_proposal, window_keys
from services.admission.receipts import Authorizer

__all__ = [
    "COMMAND_STATES",
    "OUTBOX_CHANNEL",
    "CommandAdmission",
    "AdmissionStore",
    "Admitted",
    "Approval",
    "Backlog",
    "Known",
    "OutboxRow",
    "ProposalRow",
    "ResolvedFacts",
    "StoredCommand",
    "new_public_id",
]


class AdmissionStore:
    """Every write admission makes, each in one short transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        journal: Journal | None = None,
        *,
        receipts: Authorizer | None = None,
    ) -> None:
        self._pool, self._journal, self._receipts = pool, journal, receipts
        self._insert_proposal = self._journaled(sql.INSERT_PROPOSAL, 26, "recorded")
        self._admit = self._journaled(sql.ADMIT, 25, "admitted").replace(
            "{receipt}", "" if receipts is None else self._receipt_ctes()
        )
        self._approve = self._journaled(sql.APPROVE, 13, "admitted")
        self._add_approval = self._journaled(sql.ADD_APPROVAL, 4, "added")
        self._reject = self._journaled(sql.MOVE_PROPOSAL.replace("{condition}", ""), 5, "moved")
        self._expire = self._journaled(
            sql.MOVE_PROPOSAL.replace("{condition}", "AND expires_at <= now()"), 5, "moved"
        )

    def _receipt_ctes(self) -> str:
        """`ADMIT`'s receipt (after its own journal row's parameters) and its journal row."""
        first = 25 + (8 if self._journal is not None else 0)
        receipt = sql.ADMIT_RECEIPT.format(kid=first, token=first + 1, expires=first + 2)
        if self._journal is None:
            return receipt
        return f"{receipt}, {self._journal.cte_if(first + 3, 'signed', name='receipt_row')}"

    async def _receipt_args(self, a: CommandAdmission, expires_at: datetime) -> tuple[Any, ...]:
        """The receipt's parameters of `ADMIT` (its journal row's included), or NULLs."""
        if self._receipts is None:
            return ()
        command = {
            "tenant": a.tenant,
            # As the relay reads them back (`uuid::text`): what a receipt says does not depend
            # on who signed it.
            "operation_id": str(uuid.UUID(a.operation_id)),
            "request_hash": a.request_hash,
            "action": a.action,
            "action_version": a.version,
            "arguments": a.arguments,
            "principal": a.principal,
            "run_id": a.run_id,
            "decision_id": str(uuid.UUID(a.decision.decision_id)),
            "decision_line": a.decision.line,
            "policy_version": a.decision.policy_version,
            "expires_at": expires_at,
            "approved_by": None,
        }
        signed = await self._receipts.signed(command, now=datetime.now(UTC))
        return signed or (None,) * (3 + (8 if self._journal is not None else 0))

    def _journaled(self, statement: str, first: int, changed: str) -> str:
        """The statement with its journal row, written only if `changed` changed anything."""
        row = "" if self._journal is None else ", " + self._journal.cte_if(first, changed)
        return statement.replace("{journal}", row)

    async def _entry(
        self, tenant: str, kind: str, subject: str, run_id: str, payload: dict[str, Any]
    ) -> tuple[Any, ...]:
        """The journal row's parameters (none without a journal), its window key made first."""
        if self._journal is None:
            return ()
        await self._journal.prepare(tenant, run_id)
        return msgspec.structs.astuple(
            self._journal.entry(
                tenant=tenant, kind=kind, subject=subject, run_id=run_id, payload=payload
            )
        )

    async def command(self, tenant: str, operation_id: str) -> StoredCommand | None:
        """The registered command for this key, if any."""
        row = await self._pool.fetchrow(
            f"SELECT {sql.COMMAND_COLUMNS} FROM admission.commands "
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
        sealed = await seal_proposal(
            self._journal,
            tenant=tenant,
            run_id=run_id,
            proposal_id=proposal_id,
            payload=SealedProposal(arguments=arguments, preview=preview, facts=facts),
        )
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
            "{}" if sealed is not None else json.dumps(arguments),
            request_hash,
            state,
            decision_id,
            reason,
            expected_revision,
            operation_key,
            request_id,
            public_id,
            None if sealed is not None else json.dumps(preview),
            expires_at,
            inject_context({}).get("traceparent"),
            None if facts is None or sealed is not None else json.dumps(facts),
            facts_read_at,
            decision_line,
            policy_version,
            sealed,
            *(
                await self._entry(
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
                )
            ),
        )
        row = await self.proposal_row(tenant, proposal_id=proposal_id)
        assert row is not None
        return row

    async def record_resolved_facts(self, rows: list[ResolvedFacts]) -> None:
        """The facts each of these proposals was resolved against, in one statement: a
        proposal resolved again keeps its last resolution (the one its verdict stands on)."""
        if not rows:
            return
        await self._pool.execute(
            "INSERT INTO admission.resolved_facts (tenant, proposal_id, run_id, step, action, "
            "facts_kind, facts_id, facts, read_at) "
            "SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::int[], $5::text[], "
            "$6::text[], $7::text[], $8::jsonb[], $9::timestamptz[]) "
            "ON CONFLICT (tenant, proposal_id) DO UPDATE SET facts_kind = EXCLUDED.facts_kind, "
            "facts_id = EXCLUDED.facts_id, facts = EXCLUDED.facts, read_at = EXCLUDED.read_at",
            [r.tenant for r in rows],
            [r.proposal_id for r in rows],
            [r.run_id for r in rows],
            [r.step for r in rows],
            [r.action for r in rows],
            [r.kind for r in rows],
            [r.ref for r in rows],
            [json.dumps(r.facts) for r in rows],
            [r.read_at for r in rows],
        )

    async def proposal_row(
        self, tenant: str, *, proposal_id: str | None = None, public_id: str | None = None
    ) -> ProposalRow | None:
        """A proposal by its internal or its public id, within the tenant, with the state of
        the command it became (if it did)."""
        row = await self._pool.fetchrow(
            sql.PROPOSAL_ROW
            + (" AND p.proposal_id = $2" if proposal_id else " AND p.public_id = $2"),
            tenant,
            proposal_id or public_id,
        )
        if row is None:
            return None
        values = dict(row)
        await open_payload(self._pool, window_keys(self._journal), [values])
        return proposal_of(values)

    async def expire_proposal(self, proposal: ProposalRow) -> bool:
        """pending -> expired once its time is over; False if it was not pending any more."""
        moved = await self._pool.fetchval(
            self._expire,
            proposal.tenant,
            proposal.proposal_id,
            "expired",
            "expired",
            *(
                await self._entry(
                    proposal.tenant,
                    "proposal.expired",
                    proposal.public_id,
                    proposal.run_id,
                    {"proposal_id": proposal.proposal_id},
                )
            ),
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
        proposal whose payload has not expired (the command is made of it)."""
        if proposal.expired is not None:
            return False
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
            json.dumps(proposal.arguments),
            json.dumps(proposal.preview),
            *(
                await self._entry(
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
                )
            ),
        )
        return bool(claimed)

    async def known(self, tenant: str, operation_id: str, proposal_id: str) -> Known:
        """The command registered under this key and the proposal's recorded state, if any,
        and governance's policy epoch: one round trip for what every proposal must check first.

        The epoch is read before `decide` is asked, so a change `decide` did not see has a
        later epoch than this one (the dispatcher compares them).
        """
        row = await self._pool.fetchrow(sql.KNOWN, tenant, operation_id, proposal_id)
        assert row is not None
        return known_of(row)

    async def known_many(self, keys: list[tuple[str, str, str]]) -> list[Known]:
        """`known` for each (tenant, operation id, proposal id), in order, in one statement."""
        rows = await self._pool.fetch(
            sql.KNOWN_MANY, [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]
        )
        return [known_of(row) for row in rows]

    async def record_invalid(self, p: ProposeCommand, reason: str) -> None:
        """A run's proposal refused as invalid, kept for the planner's sweeper (the first
        reason stays: the same step proposed again is refused as it was)."""
        await self._pool.execute(
            "INSERT INTO admission.invalid_proposals (tenant, run_id, step, action, reason) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            p.tenant,
            p.run_id,
            p.step,
            p.action[:512],
            reason,
        )

    async def told_host(self, tenant: str, operation_id: str, state: str) -> None:
        """The host was told its command reached `state` (its result is published)."""
        await self._pool.execute(
            "UPDATE admission.commands SET answered_state = $3 "
            "WHERE tenant = $1 AND operation_id = $2",
            tenant,
            operation_id,
            state,
        )

    async def proposal(self, tenant: str, proposal_id: str) -> tuple[str, str | None, str] | None:
        """(state, decision id, reason) of a proposal already recorded, if any."""
        row = await self._pool.fetchrow(
            "SELECT state, decision_id::text AS decision_id, coalesce(reason, '') AS reason "
            "FROM admission.proposals WHERE tenant = $1 AND proposal_id = $2",
            tenant,
            proposal_id,
        )
        return None if row is None else (row["state"], row["decision_id"], row["reason"])

    async def add_approval(self, proposal: ProposalRow, approver: str) -> bool:
        """One person's approval of a proposal that needs more than one, journaled; False if
        this person had approved it already (approving twice adds nothing)."""
        added = await self._pool.fetchval(
            self._add_approval,
            proposal.tenant,
            proposal.proposal_id,
            approver,
            *(
                await self._entry(
                    proposal.tenant,
                    "proposal.approval_recorded",
                    proposal.public_id,
                    proposal.run_id,
                    {"proposal_id": proposal.proposal_id, "approved_by": approver},
                )
            ),
        )
        return bool(added)

    async def approvals(self, tenant: str, proposal_id: str) -> list[Approval]:
        """Every approval of a proposal so far, first first, each saying whether it still
        counts (governance's `approval_void`, the rule the API lists them by too)."""
        raw = await self._pool.fetchval(
            "SELECT "
            + sql.APPROVALS_OF.format(proposal="p")
            + " FROM admission.proposals p WHERE p.tenant = $1 AND p.proposal_id = $2",
            tenant,
            proposal_id,
        )
        return approvals_of(raw)

    async def reject_proposal(
        self, proposal: ProposalRow, reason: str, *, by: str = "", kind: str = "proposal.rejected"
    ) -> bool:
        """pending -> rejected (journaled as `kind`); False if it was not pending any more."""
        moved = await self._pool.fetchval(
            self._reject,
            proposal.tenant,
            proposal.proposal_id,
            "rejected",
            reason,
            *(
                await self._entry(
                    proposal.tenant,
                    kind,
                    proposal.public_id,
                    proposal.run_id,
                    {"proposal_id": proposal.proposal_id, "reason": reason, "rejected_by": by},
                )
            ),
        )
        return bool(moved)

    async def admit(
        self, *, before_commit: Callable[[], None] | None = None, **admission: Any
    ) -> Admitted:
        """Proposal -> executing, command and outbox row, in one statement (the reference
        architecture), with the command's approval receipt when the store has a signer.

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
            return await self._admit_on(conn, a, await self._admit_args(a))

    async def admit_many(
        self, admissions: list[CommandAdmission], *, before_commit: Callable[[], None] | None = None
    ) -> list[Admitted]:
        """`admit` for each, in order, in one transaction: one commit (and one wake-up of the
        relay) for all. Any failure rolls all of them back."""
        args = [await self._admit_args(a) for a in admissions]  # encrypting is no work for Postgres
        async with self._pool.acquire() as conn, conn.transaction():
            admitted = [
                await self._admit_on(conn, a, arg) for a, arg in zip(admissions, args, strict=True)
            ]
            if before_commit is not None:
                before_commit()  # the fault suite's "before the admission commit"
        return admitted

    async def _admit_args(self, a: CommandAdmission) -> tuple[Any, ...]:
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
            *(
                await self._entry(
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
                )
            ),
            *await self._receipt_args(a, expires_at),
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
            f"SELECT {sql.COMMAND_COLUMNS} FROM admission.commands "
            "WHERE tenant = $1 AND operation_id = $2",
            a.tenant,
            a.operation_id,
        )
        return Admitted(created=False, command=StoredCommand(**dict(row)))

    async def claim_outbox(self, conn: asyncpg.Connection, limit: int) -> list[OutboxRow]:
        """Lock up to `limit` due rows; other relay replicas skip them (SKIP LOCKED)."""
        rows = await conn.fetch(
            "SELECT o.id, o.tenant, o.operation_id::text AS operation_id, o.traceparent, "
            "EXISTS (SELECT 1 FROM admission.authorizations a WHERE a.tenant = o.tenant "
            "AND a.operation_id = o.operation_id) AS signed "
            "FROM admission.outbox o "
            "WHERE o.available_at <= now() ORDER BY o.id LIMIT $1 FOR UPDATE OF o SKIP LOCKED",
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
