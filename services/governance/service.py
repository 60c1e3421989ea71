"""Governance: decides every capability call, keeps the pending decisions people answer, loads
the organisation's signed policy, and keeps run budgets. It holds the rule store, nothing that
acts."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nats.micro.request import Request
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from prometheus_client import Counter

from actions import ACTIONS
from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.journal import Sealer
from libs.runtime import BatchEndpoint, Endpoint, Runtime
from libs.telemetry import extract_context
from schemas import subjects
from schemas.governance import (
    AGENT_CALL_PREFIX,
    AnswerDecision,
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    DecideBatch,
    DecideRequest,
    Decision,
    DecisionAnswered,
    Decisions,
    ListPending,
    PendingDecisions,
    RegisterRun,
    RegisterTurn,
    ReserveBudget,
    RunRegistered,
    SettleBudget,
)
from schemas.host import DecisionResult
from schemas.mcp import ClassifyTool, RecordListing, parse_capability
from schemas.retrieval import READ_TOOLS
from services.governance.budgets import BudgetDefaults
from services.governance.logic import SENSITIVE_UNREADABLE, Call, Facts, Ruling, decide
from services.governance.mcp import McpRegistry
from services.governance.policy import load_policy
from services.governance.registration import turn_run, widening
from services.governance.store import (
    Answered,
    GovernanceStore,
    NotAnswerable,
    ToRead,
    ToRecord,
)

__all__ = ["GovernanceService"]

INBOX = ConsumerSpec(
    stream="WRIT_INT", durable="governance", filter_subjects=subjects.GOVERNANCE_IN
)
log = logging.getLogger("writ.governance")


class NotFound(LookupError):
    """An endpoint's subject does not exist: answered 404 (a KeyError stays a 500)."""


class RegistrationRefused(PermissionError):
    """A registration governance refuses (it would widen what governance holds, or names a turn
    of another session): answered 403 (logged)."""


class GovernanceService:
    """Decides capability calls; an unreadable store or a refused policy denies what is
    sensitive, and an unanswered ask is a deny."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: GovernanceStore,
        policy_dir: Path | None = None,
        policy_keys: dict[str, Ed25519PublicKey] | None = None,
        policy_poll_s: float = 2.0,
        overdue_poll_s: float = 1.0,
        sealer: Sealer | None = None,
        budget_defaults: BudgetDefaults | None = None,
        mcp: McpRegistry | None = None,
    ) -> None:
        self._rt, self._store, self._sealer, self._mcp = rt, store, sealer, mcp
        self._budget_defaults = budget_defaults or BudgetDefaults()
        self._policy_dir, self._policy_keys = policy_dir, policy_keys or {}
        self._policy_poll_s, self._overdue_poll_s = policy_poll_s, overdue_poll_s
        self._policy_seen: dict[str, tuple[float, int]] = {}
        # Contracts no standing grant may cover: "always" is refused for them at the answer
        # too, even where a decision recorded before said otherwise.
        self._never_always = frozenset(n for n, c in ACTIONS.items() if not c.grant_may_cover())
        self._ask_decoder = msgspec.json.Decoder(DecideRequest)
        self._batch_decoder = msgspec.json.Decoder(DecideBatch)
        self._encoder = msgspec.json.Encoder()
        # `line` is one of decide's six lines and `verdict` one of three: 18 series at most.
        self._decisions = Counter(
            "writ_governance_decisions",
            "Decisions returned by decide",
            ["line", "verdict"],
            registry=rt.registry,
        )
        # `budget` is one of the five BudgetKind values. (The planner's own
        # writ_planner_budget_* counter counts what it stopped; this counts what governance
        # refused.)
        self._exhausted = Counter(
            "writ_governance_budget_exhausted",
            "Budget reservations refused, by the budget that ran out",
            ["budget"],
            registry=rt.registry,
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve `decide`, run registration and pending decisions; take answers; until stopped."""
        await self.load_policies()  # before the first decision, not after
        self._rt.endpoints += self.endpoints()
        async with anyio.create_task_group() as tg:
            if self._sealer is not None:
                await tg.start(self._sealer.run)  # chains and signs the audit journal
            tg.start_soon(self._every, self._policy_poll_s, self.load_policies)
            tg.start_soon(self._every, self._overdue_poll_s, self.deny_overdue)
            await run_actor(
                js=self._rt.js,
                spec=INBOX,
                decoder=msgspec.json.Decoder(AnswerDecision),
                handler=self._on_answer,
                metrics=self._rt.metrics,
                tracer=self._rt.tracer,
                stopping=self._rt.stopping,
                health=self._rt.health,
                task_status=task_status,
                backoff_max_s=self._rt.retry_backoff_max_s,
            )
            tg.cancel_scope.cancel()

    # -- request/reply ----------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint | BatchEndpoint]:
        """The request/reply endpoints `run` serves (tests may serve them alone)."""
        return [
            # Concurrent decides are decided together: their facts read in one statement, their
            # allows and denies recorded in one transaction (per decision, far fewer round
            # trips, commits and tasks under load; alone, a batch of one goes at once).
            BatchEndpoint("decide", subjects.DECIDE, self._decide_requests),
            BatchEndpoint(
                "decide_batch", subjects.DECIDE_BATCH, self._decide_batches, max_batch=16
            ),
            Endpoint(
                "register_run",
                subjects.REGISTER_RUN,
                self._endpoint("register_run", RegisterRun, self.register_run),
            ),
            Endpoint(
                "register_turn",
                subjects.REGISTER_TURN,
                self._endpoint("register_turn", RegisterTurn, self.register_turn),
            ),
            Endpoint(
                "pending",
                subjects.PENDING_LIST,
                self._endpoint("pending", ListPending, self.list_pending),
            ),
            Endpoint("answer", subjects.ANSWER, self._answer_endpoint),
            Endpoint(
                "reserve", subjects.RESERVE, self._endpoint("reserve", ReserveBudget, self.reserve)
            ),
            Endpoint(
                "settle", subjects.SETTLE, self._endpoint("settle", SettleBudget, self.settle)
            ),
            *(
                []
                if self._mcp is None
                else [
                    Endpoint(
                        "mcp_listing",
                        subjects.MCP_LISTING,
                        self._endpoint("mcp_listing", RecordListing, self._mcp.record_listing),
                    ),
                    Endpoint(
                        "mcp_classify",
                        subjects.MCP_CLASSIFY,
                        self._endpoint("mcp_classify", ClassifyTool, self._mcp.classify),
                    ),
                ]
            ),
        ]

    async def _decoded(
        self, name: str, kind: type, decoder: msgspec.json.Decoder[Any], request: Request
    ) -> Any:
        """The request's message, or None once it was answered 400 (it does not decode)."""
        try:
            return decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            self._rt.metrics.failed.labels(name, "undecodable").inc()
            await request.respond_error("400", f"invalid {kind.__name__}: {exc}")
            return None

    def _endpoint(
        self, name: str, kind: type, handle: Callable[..., Awaitable[msgspec.Struct]]
    ) -> Callable[[Request], Awaitable[None]]:
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(kind)
        metrics = self._rt.metrics

        async def serve(request: Request) -> None:
            started = time.perf_counter()
            message = await self._decoded(name, kind, decoder, request)
            if message is None:
                return
            try:
                # Continue the caller's trace: one run is one trace, request/reply included.
                with self._rt.tracer.start_as_current_span(
                    f"governance {name}",
                    context=extract_context(request.headers),
                    kind=SpanKind.SERVER,
                ):
                    answer = await handle(message)
            except NotFound as exc:
                metrics.failed.labels(name, "not_found").inc()
                await request.respond_error("404", str(exc)[:500])
                return
            except RegistrationRefused as exc:
                metrics.failed.labels(name, "refused").inc()
                log.warning("%s refused: %s", name, exc)
                await request.respond_error("403", str(exc)[:500])
                return
            except Exception as exc:
                metrics.failed.labels(name, "error").inc()
                log.warning("%s failed: %r", name, exc)
                await request.respond_error("500", f"{name} failed")
                return
            await request.respond(self._encoder.encode(answer))
            metrics.handled.labels(name).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - started)

        return serve

    def _call(self, ask: DecideRequest) -> Call:
        contract = ACTIONS.get(ask.tool)
        # Read tools (retrieval executes them) are classified by their shared contract.
        read_tool = READ_TOOLS.get(ask.tool) if contract is None else None
        family = contract.family if contract else read_tool.family if read_tool else None
        # A call to another agent (`agent:<name>`, the planner's) hands the conversation to that
        # agent and runs nothing itself: each capability the callee uses is decided on its own.
        # So it is unclassified (no family, no grant names it) with the conversation's scope;
        # policy refusals and deny rules (lines 1-2) still come first.
        scope = (
            contract.scope
            if contract
            else "conversation"
            if ask.tool.startswith(AGENT_CALL_PREFIX)
            else "external"
        )
        return Call(
            tool=ask.tool,
            family=family,
            connector=contract.connector if contract else None,
            agent=ask.agent,
            first_argument=ask.first_argument,
            scope=scope,
            profile_fact=contract.profile_fact if contract else False,
            grantable=contract.grant_may_cover() if contract else True,
        )

    async def _mcp_family(
        self, ask: DecideRequest, call: Call
    ) -> tuple[Call, str | None, str | None]:
        """An `mcp:` call with the family the operator classified (None: nobody did), why
        it is refused whatever else holds (the tool is not the one classified: its live digest
        differs, or retrieval did not list it), and, for an unclassified tool, what its ask
        must say first (it has the definition of a classified tool under another name, or the
        name of another server's tool: services/governance/mcp.py). An unreadable store leaves
        it unclassified, which nothing sensitive passes (fail closed)."""
        try:
            found = None if self._mcp is None else await self._mcp.lookup(ask.tenant, ask.tool)
            if found is None:
                flags = (
                    []
                    if self._mcp is None or ask.tool_digest is None
                    else await self._mcp.flags(ask.tenant, ask.tool, ask.tool_digest)
                )
                if ask.tool_digest is not None and not flags:
                    flags = [f"{ask.tool} (served {ask.tool_digest}) was never classified"]
                return call, None, "; ".join(flags) or None
        except Exception as exc:
            log.warning("mcp classification unreadable: %r", exc)
            return call, "the classification of MCP tools cannot be read: refused", None
        call = msgspec.structs.replace(call, family=found.family)
        if ask.tool_digest is None:
            return (
                call,
                f"{ask.tool} was not listed by its server: a tool never listed is never called",
                None,
            )
        if ask.tool_digest != found.digest:
            # Both digests in full: the journaled refusal says what was served and what the
            # operator had classified, so an auditor can find both listings.
            changed = (
                f"{ask.tool} changed since it was classified (served {ask.tool_digest}, "
                f"classified {found.digest}): an operator must look at it and classify it "
                "again (writ mcp show, writ mcp classify)"
            )
            return call, changed, None
        return call, None, None

    async def _facts(self, reads: list[ToRead]) -> list[Facts | None]:
        """The facts of each call, in one statement; each on its own again if that failed
        (perhaps another call's read failed it). None where it cannot be read: a failure to
        read is a failure to know, which `decide` fails closed on."""
        try:
            return list(await self._store.facts_many(reads))
        except Exception as exc:
            log.warning("facts unreadable together: %r", exc)
        facts: list[Facts | None] = []
        for read in reads:
            try:
                facts.append((await self._store.facts_many([read]))[0])
            except Exception as exc:
                log.warning("governance store unreadable: %r", exc)
                facts.append(None)
        return facts

    async def _recorded(self, ruled: list[ToRecord]) -> list[str | None]:
        """Record the decisions: the allows and denies in one transaction; each on its own if
        that failed (another's row may be what failed it); each ask on its own, with its
        pending decision. Their ids, None where one could not be recorded."""
        ids: list[str | None] = [None] * len(ruled)
        settled = [i for i, r in enumerate(ruled) if r.ruling.verdict != "ask"]
        alone = [i for i, r in enumerate(ruled) if r.ruling.verdict == "ask"]
        if settled:
            try:
                for i, decision_id in zip(
                    settled, await self._store.record_many([ruled[i] for i in settled]), strict=True
                ):
                    ids[i] = decision_id
            except Exception as exc:
                if len(settled) > 1:
                    log.warning("cannot record %d decisions together: %r", len(settled), exc)
                    alone += settled
                else:
                    log.warning("cannot record decision: %r", exc)
        for i in sorted(alone):
            r = ruled[i]
            try:
                ids[i] = await self._store.record(
                    tenant=r.tenant,
                    run_id=r.run_id,
                    principal=r.principal,
                    call=r.call,
                    ruling=r.ruling,
                    policy_version=r.policy_version,
                    proposal_id=r.proposal_id,
                    attended=r.attended,
                    ask_open_s=r.ask_open_s,
                )
            except Exception as exc:
                log.warning("cannot record decision: %r", exc)
        return ids

    async def decide_all(
        self, asks: list[DecideRequest], parents: list[Span] | None = None
    ) -> list[Decision]:
        """Decide each call and record its decision (and its pending decision, for an ask):
        the facts of all of them read in one statement, their allows and denies recorded in
        one transaction. `parents`: each call's span (a `governance decide` span is its
        child)."""
        spans = [
            self._rt.tracer.start_span(
                "governance decide",
                context=None if parents is None else trace.set_span_in_context(parents[i]),
            )
            for i in range(len(asks))
        ]
        try:
            calls = [self._call(ask) for ask in asks]
            refusals: list[str | None] = [None] * len(asks)
            notes: list[str | None] = [None] * len(asks)
            for i, ask in enumerate(asks):
                if parse_capability(ask.tool) is not None:
                    calls[i], refusals[i], notes[i] = await self._mcp_family(ask, calls[i])
            facts = await self._facts(
                [
                    ToRead(
                        tenant=ask.tenant,
                        call=call,
                        principal=ask.principal,
                        run_id=ask.run_id,
                        approval_id=ask.approval_id,
                    )
                    for ask, call in zip(asks, calls, strict=True)
                ]
            )
            ruled = []
            for ask, call, known, refusal, note in zip(
                asks, calls, facts, refusals, notes, strict=True
            ):
                ruling = decide(call, known)
                if refusal is not None:  # like an org refusal: before anything that allows
                    ruling = Ruling(verdict="deny", line=1, reason=refusal)
                elif note is not None and ruling.verdict != "allow":
                    # The person asked is told first why this tool looks like another.
                    ruling = msgspec.structs.replace(
                        ruling, reason=f"{note}; {ruling.reason}"[:512]
                    )
                ruled.append(
                    ToRecord(
                        tenant=ask.tenant,
                        run_id=ask.run_id,
                        principal=ask.principal,
                        call=call,
                        ruling=ruling,
                        policy_version=known.policy_version if known else "unreadable",
                        proposal_id=ask.proposal_id,
                        attended=known.attended if known else False,
                        ask_open_s=ask.ask_open_s,
                    )
                )
            decisions = []
            for r, decision_id, span in zip(ruled, await self._recorded(ruled), spans, strict=True):
                if decision_id is None:
                    # An allow nobody can find later is not an allow, and an ask nobody can
                    # answer is a deny: deny what cannot be recorded (reads excepted).
                    decision_id = str(uuid.uuid4())
                    ruling = decide(r.call, None)
                    r = msgspec.structs.replace(
                        r,
                        ruling=msgspec.structs.replace(
                            ruling,
                            reason=SENSITIVE_UNREADABLE
                            if ruling.verdict == "deny"
                            else ruling.reason,
                        ),
                    )
                span.set_attribute("writ.decision.verdict", r.ruling.verdict)
                span.set_attribute("writ.decision.line", r.ruling.line)
                decisions.append(self._decision(r, decision_id))
            return decisions
        finally:
            for span in spans:
                span.end()

    def _decision(self, ruled: ToRecord, decision_id: str) -> Decision:
        ruling, call = ruled.ruling, ruled.call
        self._decisions.labels(str(ruling.line), ruling.verdict).inc()
        return Decision(
            decision_id=decision_id,
            verdict=ruling.verdict,
            line=ruling.line,
            family=call.family or "unclassified",
            reason=ruling.reason,
            policy_version=ruled.policy_version,
            options=list(ruling.options),
            pending_id=decision_id if ruling.verdict == "ask" else None,
        )

    async def _decide_requests(self, requests: list[Request]) -> None:
        """`decide` requests that arrived together, decided together (`decide_all`)."""
        await self._together(
            "decide",
            requests,
            DecideRequest,
            self._ask_decoder,
            lambda ask: [ask],
            lambda decisions: decisions[0],
        )

    async def _decide_batches(self, requests: list[Request]) -> None:
        """`decide_batch` requests that arrived together, their calls decided together."""
        await self._together(
            "decide_batch",
            requests,
            DecideBatch,
            self._batch_decoder,
            lambda batch: batch.requests,
            lambda decisions: Decisions(decisions=decisions),
        )

    async def _together(
        self,
        name: str,
        requests: list[Request],
        kind: type,
        decoder: msgspec.json.Decoder[Any],
        asks_of: Callable[[Any], list[DecideRequest]],
        answer_of: Callable[[list[Decision]], msgspec.Struct],
    ) -> None:
        """Decode each request (400 for one that does not), decide all their calls at once
        (`decide_all`), answer each request with its own calls' decisions."""
        started = time.perf_counter()
        metrics = self._rt.metrics
        taken: list[tuple[Request, int, int]] = []  # a request, its first call, how many
        asks: list[DecideRequest] = []
        spans: list[Span] = []
        parents: list[Span] = []
        try:
            for request in requests:
                message = await self._decoded(name, kind, decoder, request)
                if message is None:
                    continue
                # Continue the caller's trace: one run is one trace, request/reply included.
                span = self._rt.tracer.start_span(
                    f"governance {name}",
                    context=extract_context(request.headers),
                    kind=SpanKind.SERVER,
                )
                spans.append(span)
                mine = asks_of(message)
                taken.append((request, len(asks), len(mine)))
                asks += mine
                parents += [span] * len(mine)
            decisions = await self.decide_all(asks, parents) if asks else []
            for request, first, count in taken:
                await request.respond(
                    self._encoder.encode(answer_of(decisions[first : first + count]))
                )
                metrics.handled.labels(name).inc()
                metrics.latency.labels(name).observe(time.perf_counter() - started)
        finally:
            for span in spans:
                span.end()

    async def register_run(self, run: RegisterRun) -> RunRegistered:
        """Record what ingress verified about a run before it starts, and its budget; refuse
        a registration of a known run that asks more than it was registered with."""
        wider = widening(await self._store.registered(run.tenant, run.run_id), run)
        if wider:
            raise RegistrationRefused(
                f"run {run.run_id} is registered already; this would widen {wider}"
            )
        await self._store.register_run(run, self._budget_defaults.limits_for(run.agent, run.budget))
        return RunRegistered(run_id=run.run_id)

    async def register_turn(self, turn: RegisterTurn) -> RunRegistered:
        """Register a chat turn's run (from the planner): no grants of its own
        (`registration.turn_run`)."""
        run = turn_run(turn)
        if run is None:
            raise RegistrationRefused(
                f"run {turn.run_id} is not a turn of session {turn.session_id}"
            )
        return await self.register_run(run)

    async def reserve(self, ask: ReserveBudget) -> BudgetReserved | BudgetRefused:
        """Reserve a step's budget, or refuse naming what ran out; a store that cannot be read
        reserves nothing (fail closed)."""
        try:
            answer = await self._store.reserve(
                tenant=ask.tenant,
                run_id=ask.run_id,
                step_key=ask.step_key,
                provider_calls=ask.provider_calls,
                tokens=ask.tokens,
                capability_calls=ask.capability_calls,
                limit=ask.limit,
                settle=ask.settle,
                up_to=ask.up_to,
            )
        except Exception as exc:  # cannot know what is left: nothing is left (nor settled)
            log.warning("budget store unreadable: %r", exc)
            return BudgetRefused(
                run_id=ask.run_id,
                step_key=ask.step_key,
                budget="unavailable",
                reason="governance cannot read its budget store",
            )
        if isinstance(answer, BudgetRefused) and answer.budget not in (
            "unavailable",
            "unknown_run",
        ):
            self._exhausted.labels(answer.budget).inc()
        return answer

    async def settle(self, ask: SettleBudget) -> BudgetSettled:
        """Close a reservation with what the step used (404: no such reservation)."""
        settled = await self._store.settle(
            tenant=ask.tenant,
            run_id=ask.run_id,
            reservation_id=ask.reservation_id,
            provider_calls=ask.provider_calls,
            tokens=ask.tokens,
            capability_calls=ask.capability_calls,
            release=ask.release,
        )
        if settled is None:
            raise NotFound("no such reservation for this run")
        return settled

    async def list_pending(self, ask: ListPending) -> PendingDecisions:
        """The tenant's decisions waiting for a person."""
        decisions, total, cursor = await self._store.pending_page(ask)
        return PendingDecisions(decisions=decisions, total=total, next_cursor=cursor)

    # -- answers ----------------------------------------------------------------------------

    async def _on_answer(self, delivery: Delivery[AnswerDecision]) -> None:
        answer = delivery.message
        outcome = await self._store.answer(
            tenant=answer.tenant,
            pending_id=answer.pending_id,
            answer=answer.answer,
            answered_by=answer.principal,
            reason=answer.reason,
            never_always=self._never_always,
        )
        code: str | None = None
        if isinstance(outcome, Answered):
            await self._announce(outcome)
            accepted, message = True, f"answered {answer.answer}"
        else:
            accepted, message, code = False, outcome.reason, outcome.code
        await publish(
            self._rt.js,
            subjects.result(answer.tenant),
            DecisionResult(
                request_id=answer.request_id,
                pending_id=answer.pending_id,
                accepted=accepted,
                message=message[:512],
                code=code,
            ),
            msg_id=f"decision-result:{answer.tenant}:{answer.request_id}",
        )

    async def _answer_endpoint(self, request: Request) -> None:
        """Admission records an approval by proposal id here and waits for what it became.

        Nothing is announced: the caller makes the one pending -> executing claim itself.
        Errors: 403 the approver may not answer, 409 already answered, 410 nothing to answer.
        """
        try:
            answer = msgspec.json.decode(request.data, type=AnswerDecision)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid AnswerDecision: {exc}")
            return
        self._rt.faults.raise_if("governance.answer")
        with self._rt.tracer.start_as_current_span(
            "governance answer", context=extract_context(request.headers), kind=SpanKind.SERVER
        ):
            if await self._store.revoked(answer.tenant, answer.principal):
                await request.respond_error("403", "the approver's access was revoked")
                return
            outcome = await self._store.answer(
                tenant=answer.tenant,
                pending_id=answer.pending_id,
                answer=answer.answer,
                answered_by=answer.principal,
                reason=answer.reason,
                same_again=True,
                proposal_id=answer.proposal_id,
                never_always=self._never_always,
            )
        if isinstance(outcome, NotAnswerable):
            code = (
                "409"
                if outcome.reason.startswith("already answered")
                else "410"
                if outcome.reason.startswith("no such") or outcome.code == "EXPIRED"
                else "422"
                if outcome.code in ("INVALID_ANSWER", "PROPOSAL_REQUIRED")
                else "403"
            )
            await request.respond_error(code, outcome.reason[:500])
            return
        await request.respond(
            self._encoder.encode(
                DecisionAnswered(
                    tenant=outcome.tenant,
                    pending_id=outcome.pending_id,
                    run_id=outcome.run_id,
                    proposal_id=outcome.proposal_id,
                    answer=outcome.answer,
                    reason=outcome.reason[:512],
                    answered_by=outcome.answered_by[:512],
                    decision_id=outcome.decision_id,
                    line=outcome.line,
                    policy_version=outcome.policy_version,
                )
            )
        )

    async def _announce(self, answered: Answered) -> None:
        await publish(
            self._rt.js,
            subjects.answered(answered.tenant),
            DecisionAnswered(
                tenant=answered.tenant,
                pending_id=answered.pending_id,
                run_id=answered.run_id,
                proposal_id=answered.proposal_id,
                answer=answered.answer,
                reason=answered.reason[:512],
                answered_by=answered.answered_by[:512],
                decision_id=answered.decision_id,
                line=answered.line,
                policy_version=answered.policy_version,
            ),
            msg_id=f"answered:{answered.pending_id}",
        )

    async def deny_overdue(self) -> None:
        """An ask nobody answered in time is a deny: an attended one after five minutes, any
        other once its proposal expired (the decision closes with it)."""
        for tenant, pending_id, why in await self._store.overdue():
            outcome = await self._store.answer(
                tenant=tenant,
                pending_id=pending_id,
                answer="deny",
                answered_by="nobody",
                reason=why,
                by_clock=True,
            )
            if isinstance(outcome, Answered):
                await self._announce(outcome)

    # -- policy -----------------------------------------------------------------------------

    async def load_policies(self) -> None:
        """(Re)load every changed `<tenant>.json` in the policy folder."""
        if self._policy_dir is None or not self._policy_dir.is_dir():
            return
        present = {path.stem for path in self._policy_dir.glob("*.json")}
        known = (
            set(self._policy_seen) if self._policy_seen else set(await self._store.policy_tenants())
        )  # on start: what an earlier process loaded
        for tenant in sorted(known - present):
            # The organisation withdrew the file: back to no org policy (the defaults).
            await self._store.drop_policy(tenant)
            self._policy_seen.pop(tenant, None)
            log.info("policy for %s withdrawn", tenant)
        for path in sorted(self._policy_dir.glob("*.json")):
            stat = path.stat()
            stamp = (stat.st_mtime, stat.st_size)
            tenant = path.stem
            if self._policy_seen.get(tenant) == stamp:
                continue
            policy = load_policy(path, tenant, self._policy_keys)
            await self._store.save_policy(policy)
            self._policy_seen[tenant] = stamp
            if policy.status == "valid":
                log.info("policy %s loaded for %s", policy.version, tenant)
            else:
                log.warning(
                    "policy for %s REFUSED (%s): sensitive calls denied", tenant, policy.refusal
                )

    async def _every(self, period: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await anyio.sleep(period)
            try:
                await job()
            except Exception as exc:
                log.warning("%s failed: %r", getattr(job, "__name__", "job"), exc)
