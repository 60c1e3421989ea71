"""Governance's SQL: the facts a decision needs, decisions, runs, pending decisions and policy
(run budgets: `_budgets.py`; org policy: `_policy.py`; the statements: `_statements.py`).

Every change it records (a decision, an answer, a grant or rule it writes, a run registered, an
org policy loaded or withdrawn, a budget set, reserved, refused, settled, paused or resumed)
writes its audit journal row in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from libs.journal import Journal
from schemas.governance import Answer, ListPending, PendingDecision, RegisterRun
from schemas.planner import root_run_id
from services.governance.budgets import Limits
from services.governance.logic import Call, Facts, Ruling, source_of
from services.governance.store._always import write_always
from services.governance.store._budgets import BudgetStore
from services.governance.store._policy import PolicyStore
from services.governance.store._records import (
    ATTENDED_ASK_TIMEOUT,
    Answered,
    Counted,
    NotAnswerable,
    Policy,
    ToRead,
    ToRecord,
    decision_row,
    is_uuid,
)
from services.governance.store._statements import (
    FACTS,
    INSERT_DECISION,
    INSERT_PENDING,
    PENDING_COUNT,
    PENDING_PAGE,
    RUN,
    RUN_BUDGET,
    RUN_GRANTS,
    facts_of,
)

__all__ = ["GovernanceStore"]


class GovernanceStore(BudgetStore):
    """Reads policy, rules and grants; writes decisions, runs and answers, each journaled.

    `journal` is None only in tests of something else: the service always passes one.
    """

    def __init__(self, pool: asyncpg.Pool, *, journal: Journal | None = None) -> None:
        super().__init__()
        self._pool, self._journal = pool, journal
        self._insert_decision_statement = (
            f"WITH {journal.cte(12)} {INSERT_DECISION}" if journal is not None else INSERT_DECISION
        )
        self._policy = PolicyStore(pool, self._write)

    async def facts(
        self, tenant: str, call: Call, principal: str, run_id: str, approval_id: str | None = None
    ) -> Facts:
        """Everything `decide` needs for this call, read in one statement (one snapshot)."""
        return (
            await self.facts_many(
                [
                    ToRead(
                        tenant=tenant,
                        call=call,
                        principal=principal,
                        run_id=run_id,
                        approval_id=approval_id,
                    )
                ]
            )
        )[0]

    async def facts_many(self, reads: list[ToRead]) -> list[Facts]:
        """`facts` for several calls, in order, read in one statement (one snapshot)."""
        rows = await self._pool.fetch(
            FACTS,
            [r.tenant for r in reads],
            [r.call.tool for r in reads],
            [r.call.agent for r in reads],
            [r.principal for r in reads],
            [r.run_id for r in reads],
            [
                r.approval_id if r.approval_id is not None and is_uuid(r.approval_id) else None
                for r in reads
            ],
            [root_run_id(r.run_id) for r in reads],
            [r.call.first_argument for r in reads],
            [source_of(r.call.tool) for r in reads],
            [r.call.digest for r in reads],
        )
        if len(rows) != len(reads):
            raise RuntimeError(f"facts for {len(reads)} calls read {len(rows)} rows")
        return [facts_of(row) for row in rows]

    def _decision_args(
        self, decision: tuple[object, ...], event: dict[str, object]
    ) -> tuple[object, ...]:
        """The parameters of `_insert_decision_statement`: the row and its journal row."""
        if self._journal is None:
            return decision
        entry = self._journal.entry(
            tenant=str(decision[1]),
            kind="decision",
            subject=str(decision[0]),
            run_id=str(decision[2]),
            payload=event,
        )
        return (*decision, *msgspec.structs.astuple(entry))

    async def record_many(self, decisions: list[ToRecord]) -> list[str]:
        """Persist several allow or deny decisions (never an ask: its pending decision is
        `record`'s) in one transaction, each with its journal row; their ids, in order."""
        ids, rows = [], []
        for d in decisions:
            if d.ruling.verdict == "ask":
                raise ValueError("an ask is recorded with its pending decision, by record()")
            decision_id, decision, event = decision_row(
                tenant=d.tenant,
                run_id=d.run_id,
                principal=d.principal,
                call=d.call,
                ruling=d.ruling,
                policy_version=d.policy_version,
                proposal_id=d.proposal_id,
                attended=d.attended,
                facts=d.facts,
                approval_id=d.approval_id,
            )
            ids.append(decision_id)
            if self._journal is not None:
                await self._journal.prepare(d.tenant, d.run_id)
            rows.append(self._decision_args(decision, event))
        # One round trip and one implicit transaction (asyncpg's executemany is atomic): no
        # BEGIN and COMMIT of its own.
        await self._pool.executemany(self._insert_decision_statement, rows)
        return ids

    async def record(
        self,
        *,
        tenant: str,
        run_id: str,
        principal: str,
        call: Call,
        ruling: Ruling,
        policy_version: str,
        proposal_id: str | None = None,
        attended: bool = False,
        ask_open_s: int | None = None,
        facts: Facts | None = None,
        approval_id: str | None = None,
    ) -> str:
        """Persist the decision (and, for an ask, its pending decision) in one transaction.

        An ask's pending decision closes (deny, by the clock) after 5 minutes when a person is
        watching, and after `ask_open_s` (its proposal's time to live) in any case."""
        decision_id, decision, event = decision_row(
            tenant=tenant,
            run_id=run_id,
            principal=principal,
            call=call,
            ruling=ruling,
            policy_version=policy_version,
            proposal_id=proposal_id,
            attended=attended,
            facts=facts,
            approval_id=approval_id,
        )
        if ruling.verdict != "ask":
            # One statement (no BEGIN/COMMIT round trips): the decision and its journal row.
            if self._journal is not None:
                await self._journal.prepare(tenant, run_id)
            await self._pool.execute(
                self._insert_decision_statement, *self._decision_args(decision, event)
            )
            return decision_id
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(INSERT_DECISION, *decision)
                now = datetime.now(UTC)
                deadlines = ([now + ATTENDED_ASK_TIMEOUT] if attended else []) + (
                    [now + timedelta(seconds=ask_open_s)] if ask_open_s else []
                )
                deadline = min(deadlines) if deadlines else None
                event.update(options=list(ruling.options), deadline=deadline)
                await self._write(
                    conn,
                    tenant=tenant,
                    kind="decision",
                    subject=decision_id,
                    run_id=run_id,
                    payload=event,
                )
                inserted = await conn.fetchval(
                    INSERT_PENDING,
                    decision_id,
                    tenant,
                    run_id,
                    proposal_id,
                    call.agent,
                    principal,
                    call.tool,
                    call.family or "unclassified",
                    call.first_argument,
                    ruling.reason,
                    list(ruling.options),
                    attended,
                    deadline,
                    call.digest,
                )
                if inserted is None:
                    raise _AlreadyPending  # rolls back this decision and its journal row
                # The run now waits for a person: its budget clock stops until the answer.
                await self._pause(conn, tenant, run_id, f"pending:{decision_id}")
        except _AlreadyPending:
            # The same proposal was asked about concurrently (one operation key sent twice at
            # once): it waits as the pending decision recorded first, not as a second one.
            existing = await self._pool.fetchval(
                "SELECT pending_id::text FROM governance.pending WHERE tenant = $1 "
                "AND proposal_id = $2 AND answer IS NULL",
                tenant,
                proposal_id,
            )
            if existing is None:  # answered in the meantime: ask again, as a new question
                return await self.record(
                    tenant=tenant,
                    run_id=run_id,
                    principal=principal,
                    call=call,
                    ruling=ruling,
                    policy_version=policy_version,
                    proposal_id=proposal_id,
                    attended=attended,
                    facts=facts,
                    approval_id=approval_id,
                )
            return str(existing)
        return decision_id

    async def registered(
        self, tenant: str, run_id: str
    ) -> tuple[str, str, bool, frozenset[str]] | None:
        """(principal, agent, attended, run grants) of a registered run; None if unknown."""
        row = await self._pool.fetchrow(
            "SELECT principal, agent, attended, ARRAY(SELECT g.family FROM governance.run_grants g "
            "WHERE g.tenant = r.tenant AND g.run_id = r.run_id) AS grants "
            "FROM governance.runs r WHERE r.tenant = $1 AND r.run_id = $2",
            tenant,
            run_id,
        )
        if row is None:
            return None
        return row["principal"], row["agent"], row["attended"], frozenset(row["grants"])

    async def register_run(self, run: RegisterRun, limits: Limits | None = None) -> None:
        """Record a run, its run grants and its budget (`limits`, or the built-in defaults
        under the run's own budget); idempotent: a redelivery changes nothing."""
        limits = limits if limits is not None else Limits().lowered(run.budget)
        args = (
            run.tenant,
            run.run_id,
            run.principal,
            run.agent,
            run.attended,
            list(run.grants),
            limits.provider_calls,
            limits.tokens,
            limits.capability_calls,
            limits.wall_time_s,
            limits.max_concurrent_steps,
        )
        # One statement, hence one transaction, without BEGIN and COMMIT round trips: the run,
        # its grants and its budget, each journaled only if it recorded something. The budget
        # stands apart from the run: a run registered before budgets existed gets one when its
        # registration is delivered again.
        if self._journal is None:
            await self._pool.execute(f"WITH {RUN}, {RUN_GRANTS}, {RUN_BUDGET} SELECT 1", *args)
            return
        await self._journal.prepare(run.tenant, run.run_id)
        registered = self._journal.entry(
            tenant=run.tenant,
            kind="run.registered",
            subject=run.run_id,
            run_id=run.run_id,
            payload=msgspec.to_builtins(run),
        )
        budgeted = self._journal.entry(
            tenant=run.tenant,
            kind="budget.set",
            subject=run.run_id,
            run_id=run.run_id,
            payload={"agent": run.agent, **msgspec.to_builtins(limits)},
        )
        first = len(args) + 1
        await self._pool.execute(
            f"WITH {RUN}, {RUN_GRANTS}, {RUN_BUDGET}, "
            f"{self._journal.cte_if(first, 'run', name='run_row')}, "
            f"{self._journal.cte_if(first + 8, 'budget', name='budget_row')} SELECT 1",
            *args,
            *msgspec.structs.astuple(registered),
            *msgspec.structs.astuple(budgeted),
        )

    async def pending(self, tenant: str, limit: int = 500) -> list[PendingDecision]:
        """The tenant's unanswered decisions, oldest first."""
        return (await self.pending_page(ListPending(tenant=tenant, limit=limit)))[0]

    async def pending_page(self, ask: ListPending) -> tuple[list[PendingDecision], int, str | None]:
        """A page of the tenant's unanswered decisions (oldest first unless `ask` says newest),
        as `ask` filters them; how many match in all; and the next page's cursor."""
        tenant = ask.tenant
        after = _pending_cursor(ask.cursor)
        order = "DESC" if ask.newest_first else "ASC"
        args = (
            tenant,
            ask.about_proposal,
            ask.agent,
            ask.tool,
            ask.principal,
            ask.older_than_s,
            ask.pending_id,
        )
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            total = await conn.fetchval(PENDING_COUNT, *args)
            rows = await conn.fetch(
                PENDING_PAGE.format(after="<" if ask.newest_first else ">", order=order),
                *args,
                after[0] if after else None,
                after[1] if after else None,
                ask.limit + 1,
            )
        more, rows = len(rows) > ask.limit, rows[: ask.limit]
        decisions = [
            PendingDecision(
                pending_id=r["pending_id"],
                run_id=r["run_id"],
                agent=r["agent"],
                principal=r["principal"],
                tool=r["tool"],
                family=r["family"],
                first_argument=r["first_argument"][:512],
                reason=r["reason"][:512],
                options=list(r["options"]),
                attended=r["attended"],
                deadline=r["deadline"].isoformat() if r["deadline"] else None,
                created_at=r["created_at"].isoformat(),
                about_proposal=r["about_proposal"],
            )
            for r in rows
        ]
        last = rows[-1] if more and rows else None
        cursor = f"{last['created_at'].isoformat()}|{last['pending_id']}" if last else None
        return decisions, int(total), cursor

    async def revoked(self, tenant: str, principal: str) -> bool:
        """Whether this principal's access to the tenant was revoked."""
        return bool(
            await self._pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM governance.revocations "
                "WHERE tenant = $1 AND principal = $2)",
                tenant,
                principal,
            )
        )

    async def still_counting(self, tenant: str, approvers: Sequence[str]) -> list[str]:
        """Those of a proposal's earlier approvers whose approval still counts, in order, by
        the one rule admission lists them by too (`governance.approval_void`)."""
        if not approvers:
            return []
        rows = await self._pool.fetch(
            "SELECT a.approver FROM unnest($2::text[]) WITH ORDINALITY AS a(approver, i) "
            "WHERE governance.approval_void($1, a.approver) IS NULL ORDER BY a.i",
            tenant,
            list(approvers),
        )
        return [r["approver"] for r in rows]

    async def answer(
        self,
        *,
        tenant: str,
        pending_id: str,
        answer: Answer,
        answered_by: str,
        reason: str,
        same_again: bool = False,
        proposal_id: str | None = None,
        by_clock: bool = False,
        never_always: frozenset[str] = frozenset(),
        needed: int = 1,
        co_approvers: Sequence[str] = (),
    ) -> Answered | Counted | NotAnswerable:
        """Take a person's (or the clock's) answer, once; `always` writes its grant or rule.

        `same_again`: the same answer given again gets the recorded one back (who gave it, and
        the decision it became) instead of a refusal; concurrent approvals of one proposal then
        all reach admission's single claim, which says which of them executes.

        `proposal_id`: the proposal admission showed the approver. A decision about a proposal
        is answered only with it (one door per effect: where its frozen preview is shown), or
        by the clock (`by_clock`: unanswered is deny).

        `never_always`: tools no standing grant may cover (their contracts say so): `always`
        is refused for them whatever options a decision recorded before that was said.

        `needed`, `co_approvers`: four eyes. The other approvals of the proposal that still
        count (the caller left out those whose approver was revoked); while they and this one
        are fewer than `needed` distinct people besides the requester, this approval, checked
        like any answer, is `Counted` and the decision stays open.
        """
        if not is_uuid(pending_id):
            return NotAnswerable(reason="no such pending decision")
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT p.*, d.line, d.policy_version FROM governance.pending p "
                "JOIN governance.decisions d ON d.decision_id = p.pending_id "
                "WHERE p.pending_id = $1 AND p.tenant = $2 FOR UPDATE OF p",
                pending_id,
                tenant,
            )
            if row is None:
                return NotAnswerable(reason="no such pending decision")
            if (
                row["answer"] is None
                and not by_clock
                and row["deadline"] is not None
                and row["deadline"] <= datetime.now(UTC)
            ):
                return NotAnswerable(
                    reason="the decision expired unanswered: nothing may be answered now",
                    code="EXPIRED",
                )
            if row["answer"] is not None:
                if same_again and row["answer"] == answer:
                    return Answered(
                        pending_id=pending_id,
                        tenant=tenant,
                        run_id=row["run_id"],
                        proposal_id=row["proposal_id"],
                        answer=answer,
                        reason=row["answer_reason"] or "",
                        answered_by=row["answered_by"],
                        decision_id=str(row["answer_decision_id"]),
                        line=row["line"],
                        policy_version=row["policy_version"],
                    )
                return NotAnswerable(
                    reason=f"already answered {row['answer']}", code="ALREADY_ANSWERED"
                )
            if (
                row["proposal_id"] is not None
                and not by_clock
                and proposal_id != row["proposal_id"]
            ):
                return NotAnswerable(
                    reason="this decision is about a proposal: answer it on the proposal, "
                    "where its preview is shown (name the proposal's id)",
                    code="PROPOSAL_REQUIRED",
                )
            if (
                row["proposal_id"] is not None
                and answer != "deny"
                and (answered_by == row["principal"])
            ):
                # Separation of duties: a proposal is approved by someone else than the
                # principal who asked for it, whichever door the answer came through.
                return NotAnswerable(
                    reason="the principal who requested the run cannot approve its proposals",
                    code="SEPARATION_OF_DUTIES",
                )
            if answer not in row["options"] or (answer == "always" and row["tool"] in never_always):
                return NotAnswerable(
                    reason=f"{answer!r} is not offered here: {', '.join(row['options'])}",
                    code="INVALID_ANSWER",
                )
            if answer != "deny" and needed > 1:
                counted = [
                    p
                    for p in dict.fromkeys(co_approvers)
                    if p not in (answered_by, row["principal"])
                ]
                if len(counted) + 1 < needed:
                    return Counted(approvers=[*counted, answered_by])
            decision_id = str(uuid.uuid4())
            verdict = "deny" if answer == "deny" else "allow"
            text = f"answered {answer} by {answered_by}" + (f": {reason}" if reason else "")
            await conn.execute(
                "INSERT INTO governance.decisions (decision_id, tenant, run_id, agent, "
                "principal, tool, family, verdict, line, reason, policy_version) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                decision_id,
                tenant,
                row["run_id"],
                row["agent"],
                row["principal"],
                row["tool"],
                row["family"],
                verdict,
                row["line"],
                text[:1000],
                row["policy_version"],
            )
            await conn.execute(
                "UPDATE governance.pending SET answer = $2, answered_by = $3, "
                "answered_at = now(), answer_reason = $4, answer_decision_id = $5 "
                "WHERE pending_id = $1",
                pending_id,
                answer,
                answered_by,
                reason,
                decision_id,
            )
            await self._resume(conn, tenant, row["run_id"], f"pending:{pending_id}")
            await self._write(
                conn,
                tenant=tenant,
                kind="pending.answered",
                subject=pending_id,
                run_id=row["run_id"],
                payload={
                    "pending_id": pending_id,
                    "decision_id": decision_id,
                    "run_id": row["run_id"],
                    "proposal_id": row["proposal_id"],
                    "agent": row["agent"],
                    "principal": row["principal"],
                    "tool": row["tool"],
                    "family": row["family"],
                    "answer": answer,
                    "verdict": verdict,
                    "answered_by": answered_by,
                    "reason": reason,
                    "line": row["line"],
                    "policy_version": row["policy_version"],
                },
            )
            if answer == "always":
                await write_always(
                    conn, self._write, tenant=tenant, row=row, by=answered_by, pending_id=pending_id
                )
        return Answered(
            pending_id=pending_id,
            tenant=tenant,
            run_id=row["run_id"],
            proposal_id=row["proposal_id"],
            answer=answer,
            reason=reason,
            answered_by=answered_by,
            decision_id=decision_id,
            line=row["line"],
            policy_version=row["policy_version"],
        )

    async def overdue(self, limit: int = 100) -> list[tuple[str, str, str]]:
        """(tenant, pending id, why) of asks nobody answered in time: an attended ask after
        5 minutes, any other once its proposal expired."""
        rows = await self._pool.fetch(
            "SELECT tenant, pending_id::text AS pending_id, attended FROM governance.pending "
            "WHERE answer IS NULL AND deadline < now() ORDER BY deadline LIMIT $1",
            limit,
        )
        return [
            (
                r["tenant"],
                r["pending_id"],
                "no answer within 5 minutes"
                if r["attended"]
                else "no answer before the proposal expired",
            )
            for r in rows
        ]

    async def policy_tenants(self) -> list[str]:
        """Tenants with a recorded org policy."""
        return await self._policy.tenants()

    async def drop_policy(self, tenant: str) -> None:
        """Forget a tenant's org policy (its file was withdrawn)."""
        await self._policy.drop(tenant)

    async def save_policy(self, policy: Policy) -> None:
        """Record a loaded (or refused) organisation policy for its tenant, if it changed."""
        await self._policy.save(policy)


class _AlreadyPending(Exception):
    """The proposal already has an open pending decision (inside `record` only)."""


def _pending_cursor(raw: str | None) -> tuple[datetime, str] | None:
    """A page's cursor: (created_at, pending id) of the last decision before it. One that does
    not parse starts from the first page (it names no decision anyway)."""
    if not raw or "|" not in raw:
        return None
    when, pending_id = raw.split("|", 1)
    try:
        return datetime.fromisoformat(when), pending_id
    except ValueError:
        return None
