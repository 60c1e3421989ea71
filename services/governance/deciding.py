"""Governance's `decide`: each capability call classified, its facts read, ruled
(`logic.decide`) and recorded; concurrent asks decided together (docs/design.md §4)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from nats.micro.request import Request
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from prometheus_client import Counter

from actions import ACTIONS
from libs.runtime import Runtime
from libs.telemetry import extract_context
from schemas.governance import (
    AGENT_CALL_PREFIX,
    DecideBatch,
    DecideRequest,
    Decision,
    Decisions,
)
from schemas.mcp import parse_capability
from schemas.retrieval import READ_TOOLS
from services.governance.logic import SENSITIVE_UNREADABLE, Call, Facts, Ruling, decide
from services.governance.mcp import McpRegistry
from services.governance.serving import decoded
from services.governance.store import GovernanceStore, ToRead, ToRecord

__all__ = ["Decider"]

log = logging.getLogger("writ.governance")


class Decider:
    """Decides capability calls, alone or together, and records each decision."""

    def __init__(
        self, *, rt: Runtime, store: GovernanceStore, mcp: McpRegistry | None = None
    ) -> None:
        self._rt, self._store, self._mcp = rt, store, mcp
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
        # A tool classified as sending outside is asked every time, as such a contract is: no
        # standing or run grant covers it, whatever it names.
        call = msgspec.structs.replace(
            call,
            family=found.family,
            grantable=found.family != "send_external",
            digest=found.digest,
        )
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
                    facts=r.facts,
                    approval_id=r.approval_id,
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
                        facts=known,
                        approval_id=ask.approval_id,
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

    async def decide_requests(self, requests: list[Request]) -> None:
        """`decide` requests that arrived together, decided together (`decide_all`)."""
        await self._together(
            "decide",
            requests,
            DecideRequest,
            self._ask_decoder,
            lambda ask: [ask],
            lambda decisions: decisions[0],
        )

    async def decide_batches(self, requests: list[Request]) -> None:
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
                message = await decoded(self._rt, name, kind, decoder, request)
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
