"""Ingress: authenticates hosts' requests and starts runs. It holds issuers' public keys only.

Approvers' answers go on verified: a `HumanDecision` to governance, an `ApproveProposal` to
admission, a `ReviewDecision` to the planner's review endpoint (request/reply: the approver
learns on `writ.out.results.<tenant>` whether the run took it).
"""

from __future__ import annotations

import logging

import anyio
import anyio.abc
import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from prometheus_client import Counter

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.deadline import timed_request
from libs.errors import ConfigError, RetryableError
from libs.provision import bind_consumer, host_consumers
from libs.runstart import start_run
from libs.runtime import Runtime
from schemas import subjects
from schemas.control import CancelRun, RunCancelRequested, run_cancel
from schemas.governance import AnswerDecision, RegisterRun
from schemas.host import (
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    ErrorInfo,
    HumanDecision,
    ReviewDecision,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from schemas.ingress import ProposalAnswer
from schemas.planner import REVIEW, ProposeCommand, ReviewAnswer, ReviewTaken
from services.ingress._owners import Owners
from services.ingress.logic import (
    DECODERS,
    MAX_TOKEN_TTL_S,
    NO_REVIEW,
    Rejection,
    TenantKey,
    Verified,
    authorize,
    command_run_id,
    console_audience,
    review_target,
    review_verdict,
    verify_request,
    verify_token,
)

__all__ = ["IngressService"]

log = logging.getLogger("writ.ingress")

_REVIEW_TAKEN_DECODER = msgspec.json.Decoder(ReviewTaken)


def inbox(tenant: str) -> ConsumerSpec:
    """Ingress's durable consumer of what one tenant's host sends but run requests
    (`subjects.tenant_streams`)."""
    return host_consumers(tenant)[0]


def runs_inbox(tenant: str) -> ConsumerSpec:
    """Ingress's durable consumer of one tenant's run requests, fetched apart so no burst of
    other messages queues a run's start behind it."""
    return host_consumers(tenant)[1]


class IngressService:
    """Verifies each `RunRequest` and starts its run (`libs/runstart.py`), or tells the host why
    not."""

    def __init__(
        self,
        *,
        rt: Runtime,
        keys: dict[str, TenantKey],
        audience: str,
        max_request_bytes: int,
        review_timeout_s: float = 30.0,
        agents: frozenset[str] | None = None,
        max_token_ttl_s: float = MAX_TOKEN_TTL_S,
        watch_s: float = 1.0,
    ) -> None:
        # `registered`: every tenant with an issuer key, as the keys file says now (changed in
        # place when it changes). `_keys`: the ones served, whose streams exist and whose
        # consumer is bound: both doors verify against these alone, so a tenant registered
        # before its streams exist is refused (UNKNOWN_TENANT), never accepted and lost.
        self._rt, self._registered, self._agents = rt, keys, agents
        self._keys: dict[str, TenantKey] = {}
        self._serving: dict[str, anyio.CancelScope] = {}
        self._unprovisioned: set[str] = set()  # logged once each
        # Registered tenants ingress has tried to bind since it started. One not tried yet
        # (ingress starting, or just registered) is answered UNAVAILABLE, to be retried:
        # calling it unknown would end a host's request for good over a moment's wait. Once
        # tried and not served it is UNKNOWN_TENANT: the bus cannot tell ingress apart a
        # tenant it was never given permissions for from one whose leader is being elected.
        self._tried: set[str] = set()
        self._watch_s = watch_s
        self._max_ttl = max_token_ttl_s
        self._audience, self._max_bytes = audience, max_request_bytes
        # The planner resumes the run before it answers (its next model decision included).
        self._review_timeout = review_timeout_s
        self._owners = Owners(rt.js)
        self._dropped = Counter(
            "writ_ingress_dropped_total",
            "Host messages dropped unanswered: no known tenant to answer (unknown_tenant), or "
            "two request ids, either of which an answer could contradict (ambiguous_id)",
            ["reason"],
            registry=rt.registry,
        )
        for reason in ("unknown_tenant", "ambiguous_id"):
            self._dropped.labels(reason=reason)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume each served tenant's host messages until stopped, following the registry.

        Each tenant's streams and ingress's consumer on them are provisioned
        (libs/provision.py, `writ tenant add`), for the tenants with an issuer key only: a
        host message on any other tenant's subject is refused by the server and stored
        nowhere, and results can exist only for tenants Writ holds. Every `watch_s` the
        registered tenants are compared with the served ones: a new one is served once its
        consumer and result stream exist (until then it is refused on both doors, logged
        once); one no longer registered stops being served at once. Ingress creates nothing.
        """
        for tenant in self._registered:
            if not subjects.valid_tenant(tenant):
                raise ConfigError(f"tenant {tenant!r} cannot name a subject or a stream")
        async with anyio.create_task_group() as tg:
            await self._follow(tg)
            task_status.started()
            while not self._rt.stopping.is_set():
                with anyio.move_on_after(self._watch_s):
                    await self._rt.stopping.wait()
                await self._follow(tg)

    async def _follow(self, tg: anyio.abc.TaskGroup) -> None:
        """Serve the registered tenants that are provisioned; stop serving the others."""
        registered = dict(self._registered)
        for tenant in [t for t in self._serving if t not in registered]:
            self._keys.pop(tenant, None)
            self._serving.pop(tenant).cancel()
            log.info("tenant %s is no longer served", tenant)
        for tenant, key in registered.items():
            if tenant in self._serving:
                self._keys[tenant] = key  # re-keyed: the new key from now on
                continue
            if not subjects.valid_tenant(tenant) or self._rt.stopping.is_set():
                continue
            try:
                for spec in host_consumers(tenant):
                    await bind_consumer(self._rt.js, spec, patience_s=self._watch_s)
                await self._rt.js.stream_info(subjects.out_stream(tenant))
            except Exception as exc:  # not provisioned (yet), or the bus busy: next pass
                self._tried.add(tenant)
                if tenant not in self._unprovisioned:
                    self._unprovisioned.add(tenant)
                    log.error("tenant %s is not served (refused on both doors): %r", tenant, exc)
                continue
            scope = anyio.CancelScope()
            self._serving[tenant] = scope
            tg.start_soon(self._serve, tenant, scope)
            self._keys[tenant] = key
            self._unprovisioned.discard(tenant)
            self._tried.add(tenant)
            log.info("tenant %s is served", tenant)

    async def _serve(self, tenant: str, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                for spec in host_consumers(tenant):  # runs, and the rest, each its own loop
                    tg.start_soon(self._consume, spec)
        if scope.cancelled_caught and self._serving:
            # Every tenant's consumers are ingress's two durables, which readiness follows by
            # name: the ones that stopped said so for all, and the others still fetch.
            for spec in host_consumers(next(iter(self._serving))):
                self._rt.health.consumer_bound(spec.stream, spec.durable)

    async def _consume(self, spec: ConsumerSpec) -> None:
        await run_actor(
            js=self._rt.js,
            spec=spec,
            decoder=None,
            handler=self.handle,
            metrics=self._rt.metrics,
            tracer=self._rt.tracer,
            stopping=self._rt.stopping,
            health=self._rt.health,
            backoff_max_s=self._rt.retry_backoff_max_s,
            outage_limit_s=self._rt.outage_limit_s,
        )

    async def handle(self, delivery: Delivery[bytes]) -> None:
        """Verify one request, command or decision; pass it on, or tell the host why not."""
        self._rt.faults.raise_if("ingress.handle")
        tenant = delivery.subject.rsplit(".", 1)[-1]
        # requests | commands | decisions | approvals | reviews
        kind = delivery.subject.split(".")[2]
        outcome = self.verify(
            kind, delivery.message, tenant=tenant, request_id=delivery.headers.get("Nats-Msg-Id")
        )
        if not isinstance(outcome, Rejection):
            outcome = await self.first_use(outcome)
        if isinstance(outcome, Rejection):
            await self._reject(tenant, kind, outcome, delivery.msg.metadata.sequence.stream)
            return
        review = await self.hand_on(outcome)
        if review is not None:
            await publish(
                self._rt.js,
                subjects.result(outcome.tenant),
                review,
                msg_id=f"review-result:{outcome.tenant}:{review.request_id}",
            )

    def verify(
        self,
        kind: str,
        body: bytes,
        *,
        tenant: str,
        request_id: str | None,
        signed_in: bool = False,
    ) -> Verified | Rejection:
        """Bound, decode, authenticate and authorize one host message of `kind` (either door:
        the HTTP API rebuilds the NATS message and verifies it here). `signed_in`: the token
        is a console session's, from a sign-in link (only the console's own calls say so)."""
        if unserved := self._unserved(tenant, request_id):
            return unserved
        with self._rt.tracer.start_as_current_span("ingress verify") as span:
            outcome = authorize(
                verify_request(
                    body,
                    subject_tenant=tenant,
                    header_request_id=request_id,
                    keys=self._keys,
                    audience=console_audience(self._audience) if signed_in else self._audience,
                    max_bytes=self._max_bytes,
                    max_ttl_s=self._max_ttl,
                    decoder=DECODERS[kind],
                ),
                kind,
            )
            span.set_attribute("writ.verified", not isinstance(outcome, Rejection))
        if (
            not isinstance(outcome, Rejection)
            and isinstance(outcome.request, SubmitCommand | RunRequest)
            and self._agents is not None
            and outcome.request.agent not in self._agents
        ):
            outcome = Rejection(
                code="UNKNOWN_AGENT",
                request_id=outcome.request.request_id,
                message=f"no manifest declares agent {outcome.request.agent!r}",
            )
        return outcome

    def _unserved(self, tenant: str, request_id: str | None) -> Rejection | None:
        """`UNAVAILABLE` for a registered tenant ingress has not tried to bind yet: it has
        just started, or the tenant was just registered."""
        if tenant in self._keys or tenant not in self._registered or tenant in self._tried:
            return None
        return Rejection(
            code="UNAVAILABLE",
            request_id=request_id or "",
            message=f"tenant {tenant!r} is not served yet (ingress is binding it); retry",
        )

    async def first_use(self, outcome: Verified) -> Verified | Rejection:
        """The verified message, or `CONFLICT` when another principal of the tenant used its
        request id (or its command's operation key) first (`services/ingress/_owners.py`).

        Raises:
            RetryableError: who used it first cannot be read now; nothing was handed on.
        """
        return await self._owners.check(outcome) or outcome

    def check_token(
        self, token: str, *, tenant: str, request_id: str = "", signed_in: bool = False
    ) -> tuple[str, list[str]] | Rejection:
        """A token alone (the HTTP API's reads): its (principal, roles), or why not. An API
        token, or with `signed_in` a console sign-in token (never both)."""
        if unserved := self._unserved(tenant, request_id):
            return unserved
        return verify_token(
            token,
            tenant=tenant,
            keys=self._keys,
            audience=console_audience(self._audience) if signed_in else self._audience,
            request_id=request_id,
            max_ttl_s=self._max_ttl,
        )

    async def hand_on(self, outcome: Verified) -> ReviewResult | None:
        """Pass a verified message on, as both doors do; a review's answer comes back (the
        planner tells at once whether the run took it), the others' on the results stream.

        Raises:
            RetryableError: the next service did not take it; nothing was half-done that a
                retry under the same request id would do twice.
        """
        request, tenant = outcome.request, outcome.tenant
        if isinstance(request, SubmitCommand):
            await self._submit(outcome, request)
        elif isinstance(request, HumanDecision) and request.proposal_id is not None:
            # An answer that names its proposal is an answer to the proposal (admission checks
            # that the decision is that proposal's): once or always approve it, deny rejects.
            await publish(
                self._rt.js,
                subjects.proposal_answer(tenant),
                ProposalAnswer(
                    tenant=tenant,
                    request_id=request.request_id,
                    approver=outcome.principal,
                    proposal_id=request.proposal_id,
                    answer="reject" if request.answer == "deny" else "approve",
                    grant="always" if request.answer == "always" else "once",
                    reason=request.reason,
                    pending_id=request.pending_id,
                ),
                msg_id=f"proposal-answer:{tenant}:{request.request_id}",
            )
        elif isinstance(request, HumanDecision):
            await publish(
                self._rt.js,
                subjects.answer(tenant),
                AnswerDecision(
                    tenant=tenant,
                    principal=outcome.principal,
                    request_id=request.request_id,
                    pending_id=request.pending_id,
                    answer=request.answer,
                    reason=request.reason,
                ),
                msg_id=f"answer:{tenant}:{request.request_id}",
            )
        elif isinstance(request, ApproveProposal):
            # The approver's identity comes from the verified token; the message names the
            # proposal and nothing else that was approved.
            await publish(
                self._rt.js,
                subjects.proposal_answer(tenant),
                ProposalAnswer(
                    tenant=tenant,
                    request_id=request.request_id,
                    approver=outcome.principal,
                    proposal_id=request.proposal_id,
                    answer=request.answer,
                    grant=request.grant,
                    reason=request.reason,
                ),
                msg_id=f"proposal-answer:{tenant}:{request.request_id}",
            )
        elif isinstance(request, ReviewDecision):
            return await self._review(outcome, request)
        elif isinstance(request, CancelRun):
            # One cancellation per run whoever asks again: the planner answers with the run's
            # result either way.
            await publish(
                self._rt.js,
                run_cancel(tenant),
                RunCancelRequested(
                    tenant=tenant,
                    run_id=request.run_id,
                    principal=outcome.principal,
                    request_id=request.request_id,
                ),
                msg_id=f"cancel:{tenant}:{request.run_id}",
            )
        else:
            await self._start(outcome, request)
        return None

    async def _reject(self, tenant: str, kind: str, rejection: Rejection, seq: int) -> None:
        if tenant not in self._keys:
            # Nobody Writ knows could read an answer there: counted, not stored.
            self._dropped.labels(reason="unknown_tenant").inc()
            return
        if not rejection.answerable:
            # A message whose Nats-Msg-Id is not its request_id: a result under either id
            # could follow one that id has already (a `succeeded`, then a `rejected`). One
            # result per request id: this one gets none, and is counted.
            self._dropped.labels(reason="ambiguous_id").inc()
            return
        error = ErrorInfo(code=rejection.code, message=rejection.message[:512])
        answer: RunResult | CommandResult | DecisionResult | ApprovalResult | ReviewResult
        if kind == "reviews":
            answer = ReviewResult(
                request_id=rejection.request_id,
                pending_id="",
                accepted=False,
                code=rejection.code,
                message=f"{rejection.code}: {rejection.message}"[:512],
            )
        elif kind == "approvals":
            answer = ApprovalResult(
                request_id=rejection.request_id,
                proposal_id="",
                status="not_approvable",
                code=rejection.code,
                reason=f"{rejection.code}: {rejection.message}"[:500],
            )
        elif kind == "commands":
            # A key another principal used first is a conflict, as any other change a key
            # binds is (the command contract's `conflict`), revealing nothing of the first.
            answer = CommandResult(
                request_id=rejection.request_id,
                operation_key="",
                status="conflict" if rejection.code == "CONFLICT" else "rejected",
                error=error,
            )
        elif kind == "decisions":
            answer = DecisionResult(
                request_id=rejection.request_id,
                pending_id="",
                accepted=False,
                code=rejection.code,
                message=f"{rejection.code}: {rejection.message}"[:512],
            )
        else:
            answer = RunResult(request_id=rejection.request_id, status="rejected", error=error)
        await publish(
            self._rt.js, subjects.result(tenant), answer, msg_id=f"rejected:{tenant}:{seq}"
        )

    async def _start(self, outcome: Verified, request: RunRequest) -> None:
        # Governance learns from ingress, not from the planner, whether a person watches the
        # run and which families the host granted for it; the planner learns who the run is
        # for from ingress too, with the evidence retrieval found (`libs/runstart.py`).
        await start_run(
            self._rt.nc,
            self._rt.js,
            RegisterRun(
                tenant=outcome.tenant,
                run_id=outcome.run_id,
                principal=outcome.principal,
                agent=request.agent,
                attended=request.attended,
                grants=request.grants,
                budget=request.budget,
            ),
            request_id=request.request_id,
            text=request.input,
        )

    async def _submit(self, outcome: Verified, command: SubmitCommand) -> None:
        # A host's own command skips the planner: straight to admission's contract checks.
        await publish(
            self._rt.js,
            subjects.proposal(outcome.tenant),
            ProposeCommand(
                run_id=command_run_id(outcome.tenant, command.operation_key),
                step=0,
                tenant=outcome.tenant,
                principal=outcome.principal,
                agent=command.agent,
                action=command.action,
                arguments=command.arguments,
                expected_revision=command.expected_revision,
                operation_key=command.operation_key,
                request_id=command.request_id,
            ),
            msg_id=f"submitted:{outcome.tenant}:{command.request_id}",
        )

    async def _review(self, outcome: Verified, decision: ReviewDecision) -> ReviewResult:
        """Hand a verified review answer to the planner; what it became, for the approver.

        Raises:
            RetryableError: the planner did not answer in time, or failed; the answer is
                redelivered, never taken as accepted.
        """
        target = review_target(decision.pending_id)
        verdict: tuple[bool, str] = (False, NO_REVIEW)
        if target is not None:
            # Built from verified fields only: the tenant and reviewer come from the token.
            answer = ReviewAnswer(
                tenant=outcome.tenant,
                run_id=target[0],
                step=target[1],
                answer=decision.answer,
                reviewer=outcome.principal,
                reason=decision.comment,
            )
            try:
                reply = await timed_request(
                    self._rt.nc, REVIEW, msgspec.json.encode(answer), timeout=self._review_timeout
                )
            except (NatsTimeoutError, NoRespondersError) as exc:
                raise RetryableError(f"the planner did not answer the review: {exc!r}") from exc
            headers = reply.headers or {}
            code = headers.get("Nats-Service-Error-Code")
            status = None if code else _REVIEW_TAKEN_DECODER.decode(reply.data).status
            judged = review_verdict(
                code,
                headers.get("Nats-Service-Error", ""),
                answer=decision.answer,
                run_status=status,
            )
            if judged is None:
                raise RetryableError(f"the planner failed to take the review ({code})")
            verdict = judged
        accepted, message = verdict
        code = None if accepted else "UNKNOWN_REVIEW" if message == NO_REVIEW else "INVALID_REQUEST"
        return ReviewResult(
            request_id=decision.request_id,
            code=code,
            pending_id=decision.pending_id,
            accepted=accepted,
            message=message,
        )
