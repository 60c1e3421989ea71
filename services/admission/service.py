"""Admission: turns a model's proposal into an admitted command, or a recorded refusal.

It validates the request against the action's contract, reads the state the preview will stand
on (from the dispatcher, the one holder of credentials), resolves the request into frozen
arguments and a preview, asks governance's `decide`, and admits the command with its outbox row
in one transaction. A proposal a person must approve is durable state with an opaque id;
approving it by that id is the one pending -> executing claim that admits it (the approval-contracts
note,
`_approvals.py`).
It holds nothing that acts on the world.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import cast

import anyio
import anyio.abc
import msgspec
from opentelemetry import trace
from prometheus_client import Gauge

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish_now
from libs.decide import DecideUnavailable, decide, decide_batch
from libs.facts import read_facts
from libs.journal import Sealer
from libs.runtime import Runtime
from libs.telemetry import inject_context, refresh_every
from schemas import subjects
from schemas.admission import CommandAdmitted, RefusalVerdict
from schemas.dispatcher import CommandOutcome
from schemas.governance import DecideRequest, Decision, DecisionAnswered
from schemas.host import CommandStatus
from schemas.ingress import ProposalAnswer
from schemas.planner import ProposeCommand
from services.admission._approvals import ProposalApprovals
from services.admission._replies import Replies, view_of
from services.admission.logic import (
    Invalid,
    Resolved,
    Validated,
    operation_id_for,
    plan_refusal,
    proposal_id_for,
    resolve,
    resolved_facts,
    validate,
)
from services.admission.relay import OutboxRelay
from services.admission.store import (
    COMMAND_STATES,
    AdmissionStore,
    CommandAdmission,
    Known,
    StoredCommand,
)
from services.admission.sweeper import AnswerSweeper

__all__ = ["AdmissionService"]

Inbound = ProposeCommand | CommandOutcome | DecisionAnswered | ProposalAnswer
INBOX = ConsumerSpec(stream="WRIT_INT", durable="admission", filter_subjects=subjects.ADMISSION_IN)
log = logging.getLogger("writ.admission")


class AdmissionService:
    """Judges proposals and relays admitted commands."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: AdmissionStore,
        relay: OutboxRelay,
        command_ttl: timedelta,
        proposal_ttl: timedelta = timedelta(hours=24),
        sealer: Sealer | None = None,
        sweeper: AnswerSweeper | None = None,
        decide_timeout_s: float = 2.0,
        gauges_every_s: float = 5.0,
        batch_size: int = 64,
        batches: int = 4,
    ) -> None:
        self._rt, self._store, self._relay, self._sealer = rt, store, relay, sealer
        self._sweeper = sweeper
        # Up to `batches` fetched batches of up to `batch_size` messages in flight, each
        # proposal batch admitted in one transaction.
        self._batch_size, self._batches = batch_size, batches
        self._ttl, self._decide_timeout = command_ttl, decide_timeout_s
        self._proposal_ttl = proposal_ttl
        self._gauges_every_s = gauges_every_s
        self._decoder = msgspec.json.Decoder(Inbound)
        self._encoder = msgspec.json.Encoder()
        self._replies = Replies(rt=rt, store=store)
        self._approvals = ProposalApprovals(
            rt=rt,
            store=store,
            command_ttl=command_ttl,
            decide_timeout_s=decide_timeout_s,
            known=self._known,
            refuse=self._replies.refuse,
        )
        self._commands = Gauge(
            "writ_admission_commands",
            "Admitted commands per state",
            ["state"],
            registry=rt.registry,
        )
        for state in COMMAND_STATES:
            self._commands.labels(state).set(0)
        self._outbox_oldest = Gauge(
            "writ_admission_outbox_oldest_seconds",
            "Age of the oldest outbox row not yet relayed (0 when empty)",
            registry=rt.registry,
        )
        self._proposals_pending = Gauge(
            "writ_admission_proposals_pending",
            "Proposals waiting for a person's answer",
            registry=rt.registry,
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume proposals and relay the outbox until stopped."""
        async with anyio.create_task_group() as tg:
            if self._sealer is not None:
                await tg.start(self._sealer.run)  # chains and signs the audit journal
            await tg.start(self._relay.run, self._rt.stopping)
            if self._sweeper is not None:  # answers whose announcement or claim was lost
                tg.start_soon(
                    self._sweeper.run, self._approvals.on_answered, self._replies.answer_outcome
                )
            tg.start_soon(
                functools.partial(
                    refresh_every,
                    self._gauges_every_s,
                    self.refresh_gauges,
                    stopping=self._rt.stopping,
                    what="admission gauges",
                )
            )
            await run_actor(
                js=self._rt.js,
                spec=INBOX,
                decoder=self._decoder,
                handler=self.handle,
                batch_handler=self.handle_batch,
                batch_size=self._batch_size,
                concurrency=self._batches,
                metrics=self._rt.metrics,
                tracer=self._rt.tracer,
                stopping=self._rt.stopping,
                health=self._rt.health,
                task_status=task_status,
                backoff_max_s=self._rt.retry_backoff_max_s,
                outage_limit_s=self._rt.outage_limit_s,
            )
            tg.cancel_scope.cancel()  # drained: the relay, the gauges and the sealer stop too

    async def refresh_gauges(self) -> None:
        """Read the commands per state, the outbox's age and waiting proposals into the gauges."""
        backlog = await self._store.backlog()
        for state, count in backlog.commands.items():
            self._commands.labels(state).set(count)
        self._outbox_oldest.set(backlog.outbox_oldest_s)
        self._proposals_pending.set(backlog.proposals_pending)

    async def handle(self, delivery: Delivery[Inbound]) -> None:
        """Judge a proposal, act on a person's answer, or tell a host what became of its
        command."""
        message = delivery.message
        if isinstance(message, CommandOutcome):
            await self._replies.answer_outcome(message)
        elif isinstance(message, DecisionAnswered):
            await self._approvals.on_answered(message)
        elif isinstance(message, ProposalAnswer):
            await self._approvals.on_proposal_answer(message)
        else:
            await self._judge(message)

    async def handle_batch(self, deliveries: list[Delivery[Inbound]]) -> list[BaseException | None]:
        """A fetched batch: its proposals judged together (one known-read, one batched
        `decide`, one admission transaction), everything else one by one. Raises only if
        nothing of the batch's admissions committed; the actor then takes them one by one."""
        results: list[BaseException | None] = [None] * len(deliveries)
        proposals = [
            (i, d.message, d.span)
            for i, d in enumerate(deliveries)
            if isinstance(d.message, ProposeCommand)
        ]
        if proposals:
            await self._judge_batch(proposals, results)

        async def one(index: int) -> None:
            delivery = deliveries[index]
            try:
                with trace.use_span(delivery.span, end_on_exit=False):
                    await self.handle(delivery)
            except Exception as exc:
                results[index] = exc

        async with anyio.create_task_group() as tg:
            for index, delivery in enumerate(deliveries):
                if not isinstance(delivery.message, ProposeCommand):
                    tg.start_soon(one, index)
        return results

    async def _judge(self, p: ProposeCommand) -> None:
        """Validate, decide, admit (or refuse) one proposal; safe to run twice. A batch of
        one: the same path as a fetched batch's proposals.

        Raises:
            Exception: whatever stopped this proposal's judging (the actor retries it).
        """
        results: list[BaseException | None] = [None]
        await self._judge_batch([(0, p, trace.get_current_span())], results)
        if results[0] is not None:
            raise results[0]

    async def _judge_batch(
        self,
        proposals: list[tuple[int, ProposeCommand, trace.Span]],
        results: list[BaseException | None],
    ) -> None:
        """Validate, decide and admit (or refuse) several proposals at once: one known-read,
        one batched `decide`, one admission transaction. Each proposal's failure is its own
        result (at `index`); raises only if the admission transaction failed (nothing of it
        committed)."""
        pending: list[_Judging] = []
        for index, p, parent in proposals:
            span = self._rt.tracer.start_span(
                "admission admit", context=trace.set_span_in_context(parent)
            )
            j = _Judging(index=index, p=p, span=span)
            try:
                with trace.use_span(span, end_on_exit=False):
                    try:
                        j.valid = validate(p)
                    except Invalid as exc:
                        await self._replies.refuse(p, "invalid", str(exc)[:500])
                        span.end()
                        continue
            except Exception as exc:
                results[index] = exc
                span.end()
                continue
            j.operation_id = operation_id_for(p.tenant, p.run_id, p.step, p.operation_key)
            j.proposal_id = proposal_id_for(p.tenant, p.run_id, p.step)
            span.set_attribute("writ.operation_id", j.operation_id)
            pending.append(j)
        try:
            await self._judge_known(pending, results)
        finally:
            for j in pending:
                j.span.end()

    async def _judge_known(
        self, pending: list[_Judging], results: list[BaseException | None]
    ) -> None:
        knowns = await self._store.known_many(
            [(j.p.tenant, j.operation_id, j.proposal_id) for j in pending]
        )
        fresh: list[_Judging] = []

        async def step(j: _Judging, work: Awaitable[None]) -> None:
            try:
                with trace.use_span(j.span, end_on_exit=False):
                    await work
            except Exception as exc:
                results[j.index] = exc

        async def resolve_one(j: _Judging) -> None:
            assert j.valid is not None
            try:
                facts = await self._read_facts(j.p.tenant, j.valid)
                if facts is not None:
                    j.facts, j.facts_read_at = facts, datetime.now(UTC)
                resolved = resolve(j.valid, facts)
                if (stale := plan_refusal(j.p, resolved)) is not None:
                    raise Invalid(stale)
                j.resolved = resolved
            except Invalid as exc:
                await self._replies.refuse(j.p, "invalid", str(exc)[:500])

        async with anyio.create_task_group() as tg:
            for j, known in zip(pending, knowns, strict=True):
                j.known = known
                existing, recorded = known.command, known.proposal
                assert j.valid is not None
                if existing is not None:
                    tg.start_soon(
                        step,
                        j,
                        self._known(
                            j.p, j.operation_id, j.valid.request_hash, existing, replay=True
                        ),
                    )
                elif recorded is not None and recorded[0] in ("pending", "rejected"):
                    tg.start_soon(
                        step,
                        j,
                        self._refuse_again(j.p, recorded, j.proposal_id, j.valid.request_hash),
                    )
                else:
                    fresh.append(j)
                    tg.start_soon(step, j, resolve_one(j))
        fresh = [j for j in fresh if j.resolved is not None and results[j.index] is None]
        if not fresh:
            return
        try:
            # Before any verdict is recorded: no proposal is admitted or asked about without
            # the facts it was resolved against kept for the evaluation (fail closed).
            await self._store.record_resolved_facts(
                [
                    r
                    for j in fresh
                    if j.valid is not None
                    and (r := resolved_facts(j.p, j.proposal_id, j.valid, j.facts, j.facts_read_at))
                    is not None
                ]
            )
        except Exception as exc:
            for j in fresh:
                results[j.index] = exc
            return
        decisions = await self._decide_many(fresh, results)
        allowed: list[tuple[_Judging, Decision]] = []
        async with anyio.create_task_group() as tg:
            for j, decision in zip(fresh, decisions, strict=True):
                if decision is None:
                    continue
                j.span.set_attribute("writ.decision.verdict", decision.verdict)
                if decision.verdict == "allow":
                    allowed.append((j, decision))
                else:
                    tg.start_soon(step, j, self._not_allowed(j, decision))
        if not allowed:
            return
        admissions = []
        for j, decision in allowed:
            assert j.valid is not None and j.resolved is not None and j.known is not None
            with trace.use_span(j.span, end_on_exit=False):
                traceparent = inject_context({}).get("traceparent")
            admissions.append(
                CommandAdmission(
                    tenant=j.p.tenant,
                    operation_id=j.operation_id,
                    proposal_id=j.proposal_id,
                    run_id=j.p.run_id,
                    step=j.p.step,
                    principal=j.p.principal,
                    agent=j.p.agent,
                    action=j.valid.contract.name,
                    version=j.valid.contract.version,
                    arguments=j.resolved.arguments,
                    request_hash=j.valid.request_hash,
                    decision=decision,
                    ttl=self._ttl,
                    preview=j.resolved.preview,
                    expected_revision=j.p.expected_revision,
                    operation_key=j.p.operation_key,
                    request_id=j.p.request_id,
                    policy_epoch=j.known.policy_epoch,
                    traceparent=traceparent,
                )
            )
        # Raises if the transaction fails: nothing of it committed, the actor goes one by one.
        admitted = await self._store.admit_many(
            admissions, before_commit=lambda: self._rt.faults.crash_if("admission.before_commit")
        )
        async with anyio.create_task_group() as tg:
            for (j, _), done in zip(allowed, admitted, strict=True):
                assert j.valid is not None
                tg.start_soon(
                    step,
                    j,
                    self._known(
                        j.p,
                        j.operation_id,
                        j.valid.request_hash,
                        done.command,
                        replay=not done.created,
                    ),
                )

    async def _decide_many(
        self, judging: list[_Judging], results: list[BaseException | None]
    ) -> list[Decision | None]:
        """Governance's decisions, in one request/reply (`decide` for one proposal,
        `decide_batch` for more); each on its own if governance cannot answer the batch (None
        where that failed too: its result says why). No answer is not an allow:
        `DecideUnavailable` is that proposal's result, retried, and it stays unadmitted until
        governance answers."""
        asks = [
            self._decide_request(j.p, j.resolved.arguments, j.proposal_id)
            for j in judging
            if j.resolved is not None
        ]
        if len(asks) > 1:
            try:
                return list(await decide_batch(self._rt.nc, asks, timeout=self._decide_timeout))
            except DecideUnavailable as exc:
                log.info("batched decide unavailable (%r): asking one by one", exc)
        decisions: list[Decision | None] = [None] * len(judging)

        async def one(index: int, ask: DecideRequest) -> None:
            try:
                decisions[index] = await decide(self._rt.nc, ask, timeout=self._decide_timeout)
            except Exception as exc:
                results[judging[index].index] = exc

        async with anyio.create_task_group() as tg:
            for index, ask in enumerate(asks):
                tg.start_soon(one, index, ask)
        return decisions

    async def _refuse_again(
        self,
        p: ProposeCommand,
        recorded: tuple[str, str | None, str],
        proposal_id: str,
        request_hash: bytes,
    ) -> None:
        """Proposed again (a redelivery, or a host's key sent again): the same answer, with
        what the first carried (the proposal to approve), never a second ask. A host's key
        sent with anything else changed is a conflict, as it is once the command exists."""
        state, decision_id, reason = recorded
        row = await self._store.proposal_row(p.tenant, proposal_id=proposal_id)
        if p.operation_key is not None and row is not None and (row.request_hash != request_hash):
            await self._replies.refuse(
                p,
                "conflict",
                f"operation key {p.operation_key} was already used with another "
                "payload; the stored proposal is unchanged",
            )
            return
        verdict: RefusalVerdict = (
            "ask"
            if state == "pending"
            else "rejected"
            if reason.startswith("rejected by")
            else "revise"
            if reason.startswith("revision asked by")
            else "deny"
        )
        await self._replies.refuse(
            p,
            verdict,
            reason,
            decision_id,
            pending_id=decision_id if state == "pending" else None,
            proposal=view_of(row) if row is not None and state == "pending" else None,
        )

    async def _not_allowed(self, j: _Judging, decision: Decision) -> None:
        """An ask or a deny: the proposal recorded, frozen as it will be shown, and refused."""
        assert j.valid is not None and j.resolved is not None
        p, valid, resolved = j.p, j.valid, j.resolved
        if decision.verdict == "allow":
            raise AssertionError("an allowed proposal is admitted, not refused")
        stored = await self._store.record_proposal(
            tenant=p.tenant,
            proposal_id=j.proposal_id,
            run_id=p.run_id,
            step=p.step,
            principal=p.principal,
            agent=p.agent,
            action=valid.contract.name,
            version=valid.contract.version,
            arguments=resolved.arguments,
            request_hash=valid.request_hash,
            state="pending" if decision.verdict == "ask" else "rejected",
            decision_id=decision.decision_id,
            reason=decision.reason,
            preview=resolved.preview,
            ttl=self._proposal_ttl,
            expected_revision=p.expected_revision,
            operation_key=p.operation_key,
            request_id=p.request_id,
            facts=j.facts,
            facts_read_at=j.facts_read_at,
            decision_line=decision.line,
            policy_version=decision.policy_version,
        )
        await self._replies.refuse(
            p,
            decision.verdict,
            decision.reason,
            decision.decision_id,
            pending_id=decision.pending_id,
            proposal=view_of(stored) if decision.verdict == "ask" else None,
        )

    async def _read_facts(self, tenant: str, valid: Validated) -> dict[str, object] | None:
        """The state the preview stands on (None: nothing to read, or no such resource; the
        contract says which is an error)."""
        ref = valid.contract.facts_ref(valid.request)
        if ref is None:
            return None
        return await read_facts(
            self._rt.nc, tenant, ref.kind, ref.id, timeout=self._decide_timeout, delay=1.0
        )

    async def _known(
        self,
        p: ProposeCommand,
        operation_id: str,
        request_hash: bytes,
        stored: StoredCommand,
        *,
        replay: bool,
    ) -> None:
        """The key is registered: a replay returns the recorded state, a new payload conflicts."""
        if stored.request_hash != request_hash:
            await self._replies.refuse(
                p,
                "conflict",
                f"operation key {p.operation_key or operation_id} was already "
                "used with another payload; the stored command is unchanged",
            )
            return
        # A progress event for watchers (the timeline), not an obligation: a core publish on a
        # subject no stream stores (the journal row written with the admission is the record).
        await publish_now(
            self._rt.nc,
            subjects.admitted(p.tenant),
            CommandAdmitted(
                tenant=p.tenant,
                run_id=p.run_id,
                step=p.step,
                action=p.action,
                operation_id=operation_id,
                request_hash=request_hash.hex(),
                decision_id=stored.decision_id,
                decision_line=stored.decision_line,
                policy_version=stored.policy_version,
                replay=replay,
            ),
            msg_id=f"admitted:{p.tenant}:{operation_id}:{int(replay)}",
        )
        if p.operation_key is not None and replay:
            # A host replaying its key learns the recorded state (and outcome, if terminal).
            await self._replies.answer_host(
                p.tenant,
                p.request_id or "",
                p.operation_key,
                operation_id,
                cast(CommandStatus, stored.state),  # a recorded state, which CHECK constrains
                stored.receipt,
                stored.reason,
            )

    def _decide_request(
        self, p: ProposeCommand, arguments: dict[str, object], proposal_id: str
    ) -> DecideRequest:
        first = next(iter(arguments.values()), "")
        return DecideRequest(
            tenant=p.tenant,
            principal=p.principal,
            agent=p.agent,
            run_id=p.run_id,
            tool=p.action,
            first_argument=first[:512] if isinstance(first, str) else "",
            proposal_id=proposal_id,
            # The decision closes when the proposal expires: nothing answers an expired one.
            ask_open_s=max(1, int(self._proposal_ttl.total_seconds())),
        )


class _Judging:
    """One proposal of a batch, as far as it got."""

    __slots__ = (
        "facts",
        "facts_read_at",
        "index",
        "known",
        "operation_id",
        "p",
        "proposal_id",
        "resolved",
        "span",
        "valid",
    )

    def __init__(self, *, index: int, p: ProposeCommand, span: trace.Span) -> None:
        self.index, self.p, self.span = index, p, span
        self.valid: Validated | None = None
        self.resolved: Resolved | None = None
        self.known: Known | None = None
        self.operation_id = self.proposal_id = ""
        # What the preview was computed from, and when it was read (shown to approvers).
        self.facts: object = None
        self.facts_read_at: datetime | None = None
