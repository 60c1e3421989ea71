"""Admission: turns a model's proposal into an admitted command, or a recorded refusal.

It validates against the action's contract, asks governance's `decide`, and admits the command
with its outbox row in one transaction. It holds nothing that acts on the world.
"""

from __future__ import annotations

import functools
import logging
from datetime import timedelta

import anyio
import anyio.abc
import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from prometheus_client import Gauge

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish, publish_now
from libs.errors import RetryableError
from libs.runtime import Runtime
from libs.telemetry import inject_context, refresh_every
from schemas import subjects
from schemas.admission import CommandAdmitted, ProposalRefused
from schemas.dispatcher import CommandOutcome
from schemas.governance import DecideRequest, Decision, DecisionAnswered
from schemas.host import CommandResult, ErrorInfo
from schemas.planner import ProposeCommand
from services.admission.logic import (
    Invalid,
    operation_id_for,
    proposal_id_for,
    validate,
)
from services.admission.relay import OutboxRelay
from services.admission.store import COMMAND_STATES, AdmissionStore, StoredCommand

__all__ = ["AdmissionService"]

Inbound = ProposeCommand | CommandOutcome | DecisionAnswered
INBOX = ConsumerSpec(stream="WRIT_INT", durable="admission", filter_subjects=subjects.ADMISSION_IN)
log = logging.getLogger("writ.admission")


class AdmissionService:
    """Judges proposals and relays admitted commands."""

    def __init__(self, *, rt: Runtime, store: AdmissionStore, relay: OutboxRelay,
                 command_ttl: timedelta, decide_timeout_s: float = 2.0,
                 gauges_every_s: float = 5.0) -> None:
        self._rt, self._store, self._relay = rt, store, relay
        self._ttl, self._decide_timeout = command_ttl, decide_timeout_s
        self._gauges_every_s = gauges_every_s
        self._decoder = msgspec.json.Decoder(Inbound)
        self._decision_decoder = msgspec.json.Decoder(Decision)
        self._encoder = msgspec.json.Encoder()
        self._commands = Gauge("writ_admission_commands", "Admitted commands per state",
                               ["state"], registry=rt.registry)
        for state in COMMAND_STATES:
            self._commands.labels(state).set(0)
        self._outbox_oldest = Gauge("writ_admission_outbox_oldest_seconds",
                                    "Age of the oldest outbox row not yet relayed (0 when empty)",
                                    registry=rt.registry)
        self._proposals_pending = Gauge("writ_admission_proposals_pending",
                                        "Proposals waiting for a person's answer",
                                        registry=rt.registry)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Consume proposals and relay the outbox until stopped."""
        async with anyio.create_task_group() as tg:
            await tg.start(self._relay.run, self._rt.stopping)
            tg.start_soon(functools.partial(refresh_every, self._gauges_every_s,
                                            self.refresh_gauges, stopping=self._rt.stopping,
                                            what="admission gauges"))
            await run_actor(js=self._rt.js, spec=INBOX, decoder=self._decoder,
                            handler=self.handle, metrics=self._rt.metrics,
                            tracer=self._rt.tracer, stopping=self._rt.stopping,
                            task_status=task_status)

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
            await self._answer_outcome(message)
        elif isinstance(message, DecisionAnswered):
            await self._on_answered(message)
        else:
            await self._judge(message)

    async def _judge(self, p: ProposeCommand) -> None:
        """Validate, decide, admit (or refuse) one proposal; safe to run twice."""
        with self._rt.tracer.start_as_current_span("admission admit") as span:
            try:
                valid = validate(p)
            except Invalid as exc:
                await self._refuse(p, "invalid", str(exc)[:500])
                return
            operation_id = operation_id_for(p.tenant, p.run_id, p.step, p.operation_key)
            proposal_id = proposal_id_for(p.tenant, p.run_id, p.step)
            span.set_attribute("writ.operation_id", operation_id)
            existing, recorded = await self._store.known(p.tenant, operation_id, proposal_id)
            if existing is not None:
                await self._known(p, operation_id, valid.request_hash, existing, replay=True)
                return
            if recorded is not None and recorded[0] in ("pending", "rejected"):
                # Proposed again (a redelivery): the same answer, never a second ask.
                state, decision_id, reason = recorded
                verdict = ("ask" if state == "pending" else
                           "rejected" if reason.startswith("rejected by") else "deny")
                await self._refuse(p, verdict, reason, decision_id,
                                   pending_id=decision_id if state == "pending" else None)
                return
            decision = await self._decide(p, valid.arguments, proposal_id)
            span.set_attribute("writ.decision.verdict", decision.verdict)
            if decision.verdict != "allow":
                # An ask leaves a durable pending proposal, frozen as it will be shown; the
                # run's handler returns and nothing is held while a person thinks.
                await self._store.record_proposal(
                    tenant=p.tenant, proposal_id=proposal_id, run_id=p.run_id, step=p.step,
                    principal=p.principal, agent=p.agent, action=valid.contract.name,
                    version=valid.contract.version, arguments=valid.arguments,
                    request_hash=valid.request_hash,
                    state="pending" if decision.verdict == "ask" else "rejected",
                    decision_id=decision.decision_id, reason=decision.reason,
                    expected_revision=p.expected_revision, operation_key=p.operation_key,
                    request_id=p.request_id)
                await self._refuse(p, decision.verdict, decision.reason, decision.decision_id,
                                   pending_id=decision.pending_id)
                return
            admitted = await self._store.admit(
                tenant=p.tenant, operation_id=operation_id, proposal_id=proposal_id,
                run_id=p.run_id, step=p.step, principal=p.principal, agent=p.agent,
                action=valid.contract.name, version=valid.contract.version,
                arguments=valid.arguments, request_hash=valid.request_hash, decision=decision,
                ttl=self._ttl, expected_revision=p.expected_revision,
                operation_key=p.operation_key, request_id=p.request_id,
                before_commit=lambda: self._rt.faults.crash_if("admission.before_commit"))
            await self._known(p, operation_id, valid.request_hash, admitted.command,
                              replay=not admitted.created)

    async def _known(self, p: ProposeCommand, operation_id: str, request_hash: bytes,
                     stored: StoredCommand, *, replay: bool) -> None:
        """The key is registered: a replay returns the recorded state, a new payload conflicts."""
        if stored.request_hash != request_hash:
            await self._refuse(p, "conflict",
                               f"operation key {p.operation_key or operation_id} was already "
                               "used with another payload; the stored command is unchanged")
            return
        # A progress event for watchers (the timeline), not an obligation: a core publish into
        # the stream, without waiting for its acknowledgement.
        await publish_now(
            self._rt.nc, subjects.admitted(p.tenant),
            CommandAdmitted(tenant=p.tenant, run_id=p.run_id, step=p.step, action=p.action,
                            operation_id=operation_id, request_hash=request_hash.hex(),
                            decision_id=stored.decision_id, decision_line=stored.decision_line,
                            policy_version=stored.policy_version, replay=replay),
            msg_id=f"admitted:{p.tenant}:{operation_id}:{int(replay)}",
        )
        if p.operation_key is not None and replay:
            # A host replaying its key learns the recorded state (and outcome, if terminal).
            await self._answer_host(p.tenant, p.request_id or "", p.operation_key, operation_id,
                                    stored.state, stored.receipt, stored.reason)

    async def _answer_outcome(self, outcome: CommandOutcome) -> None:
        stored = await self._store.command(outcome.tenant, outcome.operation_id)
        if stored is None or stored.origin != "host" or stored.operation_key is None:
            return  # a run's command: the planner answers its host
        await self._answer_host(outcome.tenant, stored.request_id or "", stored.operation_key,
                                outcome.operation_id, outcome.state, outcome.receipt,
                                outcome.reason)

    async def _answer_host(self, tenant: str, request_id: str, operation_key: str,
                           operation_id: str | None, status: str, receipt: str | None,
                           reason: str | None, code: str | None = None,
                           pending_id: str | None = None) -> None:
        error = None
        if status not in ("succeeded", "pending", "dispatching"):
            error = ErrorInfo(code=code or status.upper(), message=(reason or status)[:512])
        await publish(
            self._rt.js, subjects.result(tenant),
            CommandResult(request_id=request_id, operation_key=operation_key, status=status,
                          operation_id=operation_id, receipt=receipt, error=error,
                          pending_id=pending_id),
            msg_id=f"command-result:{tenant}:{request_id}:{operation_id}:{status}",
        )

    async def _on_answered(self, answered: DecisionAnswered) -> None:
        """A person answered the ask about a pending proposal: admit it, or reject it."""
        if answered.proposal_id is None:
            return
        pending = await self._store.pending_proposal(answered.tenant, answered.proposal_id,
                                                     answered.pending_id)
        if pending is None:
            return  # already acted on (a redelivery), or not a proposal of ours
        p = ProposeCommand(run_id=pending.run_id, step=pending.step, tenant=pending.tenant,
                           principal=pending.principal, agent=pending.agent,
                           action=pending.action, arguments=pending.arguments,
                           expected_revision=pending.expected_revision,
                           operation_key=pending.operation_key, request_id=pending.request_id)
        if answered.answer == "deny":
            reason = f"rejected by {answered.answered_by}" + (
                f": {answered.reason}" if answered.reason else "")
            if await self._store.reject_proposal(p.tenant, pending.proposal_id, reason):
                await self._refuse(p, "rejected", reason[:500], answered.decision_id)
            return
        try:
            valid = validate(p)  # the frozen arguments must still decode under the contract
        except Invalid as exc:
            await self._store.reject_proposal(p.tenant, pending.proposal_id, str(exc)[:500])
            await self._refuse(p, "invalid", str(exc)[:500])
            return
        if valid.request_hash != pending.request_hash:
            reason = "the contract changed since the proposal was shown: propose again"
            await self._store.reject_proposal(p.tenant, pending.proposal_id, reason)
            await self._refuse(p, "invalid", reason)
            return
        decision = Decision(decision_id=answered.decision_id, verdict="allow",
                            line=answered.line, family=valid.contract.family,
                            reason=f"approved {answered.answer} by {answered.answered_by}"[:512],
                            policy_version=answered.policy_version)
        operation_id = operation_id_for(p.tenant, p.run_id, p.step, p.operation_key)
        admitted = await self._store.admit(
            tenant=p.tenant, operation_id=operation_id, proposal_id=pending.proposal_id,
            run_id=p.run_id, step=p.step, principal=p.principal, agent=p.agent,
            action=valid.contract.name, version=valid.contract.version,
            arguments=valid.arguments, request_hash=valid.request_hash, decision=decision,
            ttl=self._ttl, expected_revision=p.expected_revision,
            operation_key=p.operation_key, request_id=p.request_id)
        await self._known(p, operation_id, valid.request_hash, admitted.command,
                          replay=not admitted.created)

    async def _decide(self, p: ProposeCommand, arguments: dict[str, object],
                      proposal_id: str) -> Decision:
        first = next(iter(arguments.values()), "")
        ask = DecideRequest(tenant=p.tenant, principal=p.principal, agent=p.agent,
                            run_id=p.run_id, tool=p.action,
                            first_argument=first[:512] if isinstance(first, str) else "",
                            proposal_id=proposal_id)
        try:
            reply = await self._rt.nc.request(subjects.DECIDE, self._encoder.encode(ask),
                                              timeout=self._decide_timeout,
                                              headers=inject_context({}))
        except (NatsTimeoutError, NoRespondersError) as exc:
            # No answer is not an allow: try again later, the proposal stays unadmitted.
            raise RetryableError(f"governance did not answer: {exc!r}", delay=1.0) from exc
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            raise RetryableError(f"governance error: {reply.headers.get('Nats-Service-Error')}")
        return self._decision_decoder.decode(reply.data)

    async def _refuse(self, p: ProposeCommand, verdict: str, reason: str,
                      decision_id: str | None = None, *, pending_id: str | None = None) -> None:
        if p.operation_key is not None:
            status = {"deny": "denied", "ask": "awaiting_human", "invalid": "rejected",
                      "conflict": "conflict", "rejected": "rejected"}[verdict]
            code = {"deny": "DENIED", "ask": "AWAITING_HUMAN", "invalid": "INVALID_COMMAND",
                    "conflict": "CONFLICT", "rejected": "REJECTED"}[verdict]
            await self._answer_host(p.tenant, p.request_id or "", p.operation_key, None, status,
                                    None, reason, code, pending_id)
            return
        await publish(
            self._rt.js, subjects.refused(p.tenant),
            ProposalRefused(tenant=p.tenant, run_id=p.run_id, step=p.step,
                            action=p.action[:512], verdict=verdict, reason=reason,
                            decision_id=decision_id, pending_id=pending_id),
            msg_id=f"refused:{p.tenant}:{p.run_id}:{p.step}:{verdict}",
        )
