"""What people answer (pending decisions, proposals, reviews) and what auditors read."""

from __future__ import annotations

import time
from typing import Annotated, Any, Final

import anyio
import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter

from schemas import subjects
from schemas.api import ApproveBody, DecideBody, RejectBody, ReviewBody
from schemas.base import ID_PATTERN
from schemas.governance import ListPending, ListSpend, PendingDecisions, SpendReport
from schemas.host import (
    ApprovalResult,
    ApproveProposal,
    DecisionResult,
    HumanDecision,
    ProposalVerdict,
    ReviewDecision,
    ReviewResult,
)
from schemas.planner import ReplayReport, ReplayRun
from schemas.reads import (
    JOURNALED,
    PROPOSAL_GET,
    PROPOSALS_LIST,
    REVIEWS_LIST,
    GetProposal,
    JournalState,
    JournalStates,
    ListProposals,
    ListReviews,
    PendingReviews,
    ProposalDetail,
    Proposals,
    ProposalState,
    ProposalTrail,
    VerifyJournal,
    journal_verify,
)
from services.ingress.http._api import Api
from services.ingress.http._problems import ApiError, IdempotencyKey, problems
from services.ingress.logic import APPROVER_ROLE, AUDITOR_ROLE, Verified

__all__ = ["people_handlers"]

_ERRORS: Final = problems(
    s400="INVALID_REQUEST: undecodable, an unknown field, a bound exceeded",
    s401="UNAUTHENTICATED, UNKNOWN_TENANT, BAD_SIGNATURE, TOKEN_EXPIRED or INVALID_TOKEN",
    s403="FORBIDDEN: the approver role is missing",
    s409="CONFLICT: the Idempotency-Key was used with another body",
    s413="TOO_LARGE",
    s504="TIMEOUT: no answer in time; ask again, same Idempotency-Key",
)


def people_handlers(api: Api, *, answer_timeout_s: float = 30.0) -> list[HTTPRouteHandler]:
    """The routes of approvers and auditors over `api`."""

    async def _handed_on(outcome: Verified, kind: type[Any]) -> tuple[int, msgspec.Struct]:
        """Hand on, then the first answer of `kind` the owning service published."""
        async with api.results.watch(outcome.tenant, outcome.request.request_id) as waiter:
            await api.door.hand_on(outcome)
            deadline = time.monotonic() + answer_timeout_s
            while (remaining := deadline - time.monotonic()) > 0 and not waiter.closing:
                got = await waiter.next(remaining)
                if isinstance(got, kind):
                    return 200, got
        raise ApiError("TIMEOUT", "no answer came in time; ask again with the same Idempotency-Key")

    @get(
        "/pending-decisions",
        summary="Decisions waiting for a person",
        tags=["people"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: the approver role is missing",
        ),
    )
    async def pending(
        request: Request[Any, Any, Any],
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 500,
        cursor: Annotated[str | None, QueryParameter(max_length=128)] = None,
        newest_first: Annotated[bool, QueryParameter()] = False,
        about_proposal: Annotated[bool | None, QueryParameter()] = None,
        agent: Annotated[str | None, QueryParameter(max_length=128)] = None,
        tool: Annotated[str | None, QueryParameter(max_length=128)] = None,
        requester: Annotated[str | None, QueryParameter(max_length=256)] = None,
        older_than_s: Annotated[int | None, QueryParameter(ge=0, le=366 * 86400)] = None,
        pending_id: Annotated[
            str | None, QueryParameter(max_length=128, pattern=ID_PATTERN)
        ] = None,
    ) -> PendingDecisions:
        """The tenant's unanswered decisions (governance's), for an approver: oldest first (or
        newest), a page of `limit` after `cursor`, `total` in all and `next_cursor`, filtered
        (`about_proposal=false`: only those about calls no proposal stands for; `pending_id`:
        that one decision, however many wait)."""
        caller = api.caller(request, role=APPROVER_ROLE)
        return await api.ask(
            subjects.PENDING_LIST,
            ListPending(
                tenant=caller.tenant,
                limit=limit,
                cursor=cursor,
                newest_first=newest_first,
                about_proposal=about_proposal,
                agent=agent,
                tool=tool,
                principal=requester,
                older_than_s=older_than_s,
                pending_id=pending_id,
            ),
            PendingDecisions,
        )

    @get(
        "/spend",
        summary="Spend against the tenant's caps",
        tags=["people"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: the approver role is missing",
        ),
    )
    async def spend(
        request: Request[Any, Any, Any],
        cap: Annotated[str | None, QueryParameter(max_length=128, pattern=r"^[^\s]+$")] = None,
    ) -> SpendReport:
        """The caller's tenant's spend per cap and window (governance's, newest windows
        first), with each cap's limit, agent and currency: what `writ spend` prints, for an
        approver."""
        caller = api.caller(request, role=APPROVER_ROLE)
        return await api.ask(
            subjects.SPEND_LIST, ListSpend(tenant=caller.tenant, cap=cap), SpendReport
        )

    @post(
        "/pending-decisions/decide",
        status_code=200,
        summary="Answer a pending decision",
        tags=["people"],
        responses=_ERRORS,
    )
    async def decide(
        request: Request[Any, Any, Any], data: JSONBody[DecideBody], idempotency_key: IdempotencyKey
    ) -> DecisionResult:
        """A `HumanDecision`: whether governance took the answer."""

        def build(request_id: str, token: str) -> HumanDecision:
            return HumanDecision(
                request_id=request_id,
                token=token,
                pending_id=data.pending_id,
                answer=data.answer,
                reason=data.reason,
                proposal_id=data.proposal_id,
            )

        return await api.post(  # type: ignore[return-value]
            request,
            kind="decisions",
            body=data,
            build=build,
            answer=lambda outcome: _handed_on(outcome, DecisionResult),
        )

    def _proposal_answer(answer: ProposalVerdict) -> Any:
        async def handle(
            request: Request[Any, Any, Any], proposal_id: str, data: Any, idempotency_key: str
        ) -> ApprovalResult:
            def build(request_id: str, token: str) -> ApproveProposal:
                return ApproveProposal(
                    request_id=request_id,
                    token=token,
                    proposal_id=proposal_id,
                    answer=answer,
                    reason=data.reason,
                    grant=getattr(data, "grant", "once"),
                )

            return await api.post(  # type: ignore[return-value]
                request,
                kind="approvals",
                body=data,
                build=build,
                answer=lambda outcome: _handed_on(outcome, ApprovalResult),
            )

        return handle

    _approve, _reject = _proposal_answer("approve"), _proposal_answer("reject")
    _revise = _proposal_answer("revise")

    @post(
        "/proposals/{proposal_id:str}/approve",
        status_code=200,
        tags=["people"],
        summary="Approve exactly the frozen proposal",
        responses=_ERRORS,
    )
    async def approve(
        request: Request[Any, Any, Any],
        proposal_id: FromPath[str],
        data: JSONBody[ApproveBody],
        idempotency_key: IdempotencyKey,
    ) -> ApprovalResult:
        """An `ApproveProposal` (approve): `claimed` starts the one execution."""
        return await _approve(request, proposal_id, data, idempotency_key)

    @post(
        "/proposals/{proposal_id:str}/reject",
        status_code=200,
        tags=["people"],
        summary="Reject a proposal (a reason is required)",
        responses=_ERRORS,
    )
    async def reject(
        request: Request[Any, Any, Any],
        proposal_id: FromPath[str],
        data: JSONBody[RejectBody],
        idempotency_key: IdempotencyKey,
    ) -> ApprovalResult:
        """An `ApproveProposal` (reject)."""
        return await _reject(request, proposal_id, data, idempotency_key)

    @post(
        "/proposals/{proposal_id:str}/revise",
        status_code=200,
        tags=["people"],
        summary="Send a proposal back for a revision (a reason is required)",
        responses=_ERRORS,
    )
    async def revise(
        request: Request[Any, Any, Any],
        proposal_id: FromPath[str],
        data: JSONBody[RejectBody],
        idempotency_key: IdempotencyKey,
    ) -> ApprovalResult:
        """An `ApproveProposal` (revise): the proposal ends rejected, and its run (or host
        command) gets `REVISION_ASKED` with the reason, what the agent must revise."""
        return await _revise(request, proposal_id, data, idempotency_key)

    @get(
        "/reviews",
        summary="Reviews waiting for a person, newest first",
        tags=["people"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: the approver role is missing",
        ),
    )
    async def reviews(
        request: Request[Any, Any, Any],
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 100,
        pending_id: Annotated[
            str | None, QueryParameter(max_length=128, pattern=ID_PATTERN)
        ] = None,
    ) -> PendingReviews:
        """The tenant's runs stopped at the review their agent asked for (the planner's;
        `pending_id`: that one review, however many wait)."""
        caller = api.caller(request, role=APPROVER_ROLE)
        return await api.ask(
            REVIEWS_LIST,
            ListReviews(tenant=caller.tenant, limit=limit, pending_id=pending_id),
            PendingReviews,
        )

    @post(
        "/reviews/{pending_id:str}",
        status_code=200,
        tags=["people"],
        summary="Answer the review a run's agent asked for",
        responses=_ERRORS,
    )
    async def review(
        request: Request[Any, Any, Any],
        pending_id: FromPath[str],
        data: JSONBody[ReviewBody],
        idempotency_key: IdempotencyKey,
    ) -> ReviewResult:
        """A `ReviewDecision`: whether the run took it (the planner says at once)."""

        def build(request_id: str, token: str) -> ReviewDecision:
            return ReviewDecision(
                request_id=request_id,
                token=token,
                pending_id=pending_id,
                answer=data.answer,
                comment=data.comment,
            )

        async def answer(outcome: Verified) -> tuple[int, msgspec.Struct]:
            return 200, await api.door.hand_on(outcome)

        return await api.post(
            request,
            kind="reviews",
            body=data,  # type: ignore[return-value]
            build=build,
            answer=answer,
        )

    @post(
        "/audit/replay/{run_id:str}",
        status_code=200,
        tags=["audit"],
        summary="Replay a run offline from the journal",
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: the auditor role is missing",
            s404="NOT_FOUND: no such run of the tenant",
        ),
    )
    async def replay(request: Request[Any, Any, Any], run_id: FromPath[str]) -> ReplayReport:
        """The planner's `ReplayReport` (a read: it changes nothing, so it needs no key)."""
        caller = api.caller(request, role=AUDITOR_ROLE)
        return await api.ask(
            subjects.REPLAY,
            ReplayRun(tenant=caller.tenant, run_id=run_id),
            ReplayReport,
            timeout=30.0,
        )

    @get(
        "/proposals",
        summary="Proposals, newest first",
        tags=["people"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: the approver role is missing",
        ),
    )
    async def proposals(
        request: Request[Any, Any, Any],
        wanted: Annotated[ProposalState | None, QueryParameter(name="state")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 100,
        cursor: Annotated[str | None, QueryParameter(max_length=128)] = None,
        action: Annotated[str | None, QueryParameter(max_length=128)] = None,
        agent: Annotated[str | None, QueryParameter(max_length=128)] = None,
        requester: Annotated[str | None, QueryParameter(max_length=256)] = None,
        older_than_s: Annotated[int | None, QueryParameter(ge=0, le=366 * 86400)] = None,
        run_id: Annotated[str | None, QueryParameter(max_length=128)] = None,
        decision_id: Annotated[
            str | None, QueryParameter(max_length=128, pattern=ID_PATTERN)
        ] = None,
    ) -> Proposals:
        """The tenant's proposals (those in `state`, of this contract, agent or requester,
        proposed at least `older_than_s` ago, asked by the decision `decision_id`), newest
        first, each with its frozen preview: a page of `limit`, `total` in all, and
        `next_cursor` for the next page."""
        caller = api.caller(request, role=APPROVER_ROLE)
        return await api.ask(
            PROPOSALS_LIST,
            ListProposals(
                tenant=caller.tenant,
                state=wanted,
                limit=limit,
                cursor=cursor,
                action=action,
                agent=agent,
                requester=requester,
                older_than_s=older_than_s,
                run_id=run_id,
                decision_id=decision_id,
            ),
            Proposals,
        )

    @get(
        "/proposals/{proposal_id:str}",
        summary="One proposal",
        tags=["people"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: neither the approver nor the auditor role",
            s404="NOT_FOUND: no proposal of the tenant under this id",
        ),
    )
    async def proposal(
        request: Request[Any, Any, Any], proposal_id: FromPath[str]
    ) -> ProposalDetail:
        """The frozen preview, the request hash, the expiry, the decision that asked: for
        approvers, and for auditors (read-only: they answer nothing)."""
        caller = api.caller(request)
        if not caller.roles & {APPROVER_ROLE, AUDITOR_ROLE}:
            raise ApiError("FORBIDDEN", "this needs the approver or auditor role")
        return await api.ask(
            PROPOSAL_GET, GetProposal(tenant=caller.tenant, proposal_id=proposal_id), ProposalDetail
        )

    @get(
        "/audit/verify",
        summary="Each audit journal's state",
        tags=["audit"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: the auditor role is missing",
        ),
    )
    async def verify(request: Request[Any, Any, Any]) -> JournalStates:
        """Each journaling service verifies its own chain, checkpoints and signatures (and
        counts the tenant's entries); a service that does not answer is reported not ok."""
        caller = api.caller(request, role=AUDITOR_ROLE)
        states = await _verified(caller.tenant, dict.fromkeys(JOURNALED, []))
        journals = [states[s] for s in JOURNALED]
        return JournalStates(ok=all(j.ok for j in journals), journals=journals)

    async def _verified(tenant: str, asked: dict[str, list[str]]) -> dict[str, JournalState]:
        """Each named journal verified by its service, with its entries about the subjects
        asked of it; a service that does not answer is reported not ok."""
        states: dict[str, JournalState] = {}

        async def one(service: str) -> None:
            try:
                states[service] = await api.ask(
                    journal_verify(service),
                    VerifyJournal(tenant=tenant, subjects=asked[service]),
                    JournalState,
                    timeout=30.0,
                )
            except ApiError as exc:
                states[service] = JournalState(
                    service=service, ok=False, first_problem=f"{exc.code}: {exc.detail}"[:512]
                )

        async with anyio.create_task_group() as tg:
            for service in asked:
                tg.start_soon(one, service)
        return states

    @get(
        "/proposals/{proposal_id:str}/trail",
        summary="A proposal's trail, checked against the audit journals",
        tags=["people"],
        responses=problems(
            s401="UNAUTHENTICATED, BAD_SIGNATURE, TOKEN_EXPIRED, ...",
            s403="FORBIDDEN: neither the approver nor the auditor role",
            s404="NOT_FOUND: no proposal of the tenant under this id",
        ),
    )
    async def trail(request: Request[Any, Any, Any], proposal_id: FromPath[str]) -> ProposalTrail:
        """Who proposed it, the decision that asked, who answered and when, each attempt and
        the outcome: each journal's entries about the proposal, each checked against its
        signed chain (for approvers and auditors)."""
        caller = api.caller(request)
        if not caller.roles & {APPROVER_ROLE, AUDITOR_ROLE}:
            raise ApiError("FORBIDDEN", "this needs the approver or auditor role")
        detail = await api.ask(
            PROPOSAL_GET, GetProposal(tenant=caller.tenant, proposal_id=proposal_id), ProposalDetail
        )
        command = [detail.operation_id] if detail.operation_id else []
        first = await _verified(caller.tenant, {"admission": [detail.proposal_id, *command]})
        # The decisions the proposal's own entries name: the ask, and the approval's allow.
        decisions = {
            str(e.payload["decision_id"])
            for e in first["admission"].found
            if isinstance(e.payload.get("decision_id"), str)
        } | ({detail.decision_id} if detail.decision_id else set())
        rest = await _verified(
            caller.tenant,
            {"governance": sorted(decisions)[:16], "dispatcher": command},
        )
        return ProposalTrail(
            proposal=detail, journals=[first["admission"], rest["governance"], rest["dispatcher"]]
        )

    return [
        pending,
        spend,
        decide,
        proposals,
        proposal,
        trail,
        approve,
        reject,
        revise,
        reviews,
        review,
        replay,
        verify,
    ]
