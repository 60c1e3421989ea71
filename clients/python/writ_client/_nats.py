"""`NatsClient`: the host subjects (`writ.in.*.<tenant>`, `writ.out.results.<tenant>`), with
`Nats-Msg-Id` = the request id, so a re-publish after a lost acknowledgement is a duplicate."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import anyio
import msgspec

from writ_client._bus import ASK_S, Bus, connect, decode, raise_service_error
from writ_client._handle import RunHandle
from writ_client._keys import new_key
from writ_client._nats_reads import run_events, session_ask, session_events
from writ_client._paging import every
from writ_client._session import Session
from writ_client._wire import subjects
from writ_client._wire.api import RunAccepted, RunView
from writ_client._wire.base import Family
from writ_client._wire.control import CancelRun, cancel
from writ_client._wire.governance import Answer, PendingDecision, PendingDecisions, RunBudget
from writ_client._wire.host import (
    ApprovalAnswer,
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    HumanDecision,
    ReviewDecision,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from writ_client._wire.host_reads import HostRead, host_read
from writ_client._wire.planner import ReplayReport, StepRecorded
from writ_client._wire.reads import ProposalDetail, Proposals, ProposalState
from writ_client._wire.sessions import (
    AnySessionEvent,
    PlanAnswered,
    SessionAccepted,
    SessionList,
    SessionOpKind,
    SessionReply,
    SessionSummary,
    SessionView,
)
from writ_client.credentials import HostCredentials, NatsLogin
from writ_client.errors import (
    InvalidRequest,
    Timeout,
    WritError,
    error,
)
from writ_client.issuer import Tokens

if TYPE_CHECKING:
    from nats.aio.client import Client as Nats

__all__ = ["NatsClient"]

T = TypeVar("T")
_RESULTS: Final = msgspec.json.Decoder(
    RunResult | CommandResult | DecisionResult | ApprovalResult | ReviewResult
)
_ENCODER: Final = msgspec.json.Encoder()


class NatsClient:
    """The host subjects for one principal of one tenant (needs `writ-client[nats]`).

    Reads (a run, its timeline, pending decisions, proposals, replay) are request/reply on
    `writ.api.<tenant>.<read>`, answered by ingress as the HTTP API's GETs are.

    Built on a connection made elsewhere (`NatsClient(nc, ...)`), it cannot see the server's
    permission violations (nats-py reports them to that connection's `error_cb`): a refused
    subject then ends as a timeout. `connect` and `from_credentials` see them.
    """

    def __init__(
        self, nc: Nats | Bus, issuer: Tokens, principal: str, *, roles: Sequence[str] = ()
    ) -> None:
        self._bus = nc if isinstance(nc, Bus) else Bus(nc)
        self._nc = self._bus.nc
        self._issuer, self._principal, self._roles = issuer, principal, tuple(roles)
        self._tenant = issuer.tenant

    @classmethod
    async def connect(
        cls,
        url: str,
        issuer: Tokens,
        principal: str,
        *,
        roles: Sequence[str] = (),
        user: str | None = None,
        password: str | None = None,
        creds: str | Path | None = None,
        inbox_prefix: str | None = None,
        **nats_options: Any,
    ) -> NatsClient:
        """Connect to NATS as the tenant's host and return a client on that connection.

        `url` may carry `user:password@`; `creds` is a NATS creds file instead. The inbox
        prefix defaults to the user's own (`_INBOX.<user>`), the only one a host may use.

        Raises:
            AuthenticationError: NATS refused the user, password or creds.
            PermissionDenied: replies cannot arrive under the inbox prefix.
            Unavailable: no NATS server answered.
        """
        login = NatsLogin.parse(
            url, user=user, password=password, creds=creds, inbox_prefix=inbox_prefix
        )
        return cls(await connect(login, **nats_options), issuer, principal, roles=roles)

    @classmethod
    async def from_credentials(
        cls, credentials: HostCredentials, principal: str, *, roles: Sequence[str] = ()
    ) -> NatsClient:
        """Connect with a host credentials folder's NATS login (`HostCredentials.from_dir`)."""
        if credentials.nats is None:
            raise InvalidRequest("INVALID_REQUEST", "the credentials name no NATS server")
        bus = await connect(credentials.nats)
        return cls(bus, credentials.issuer, principal, roles=roles)

    async def __aenter__(self) -> NatsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection."""
        await self._nc.close()

    def _token(self) -> str:
        return self._issuer.token(self._principal, roles=self._roles)

    async def _send(
        self,
        subject: str,
        message: msgspec.Struct,
        request_id: str,
        kind: type[T],
        *,
        key: str | None = None,
        timeout_s: float = 60.0,
        final: Any = None,
    ) -> T:
        """Publish (retrying the same id on an outage) and wait for its first answer."""
        sub = await self._nc.subscribe(subjects.result(self._tenant))
        try:
            await self._publish(subject, message, request_id)
            deadline = time.monotonic() + timeout_s
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    msg = await self._bus.guarded(lambda: sub.next_msg(timeout=remaining))
                except TimeoutError:  # nats-py's TimeoutError is the builtin's
                    break
                try:
                    result = _RESULTS.decode(msg.data)
                except msgspec.DecodeError:
                    continue
                if result.request_id != (key or request_id):
                    continue
                if (
                    isinstance(result, RunResult | CommandResult)
                    and result.status == "rejected"
                    and result.error is not None
                ):
                    raise error(result.error.code, result.error.message)
                if isinstance(result, kind) and (final is None or final(result)):
                    return result
        finally:
            await sub.unsubscribe()
        raise Timeout("TIMEOUT", f"no answer to {request_id} within {timeout_s}s")

    async def _publish(self, subject: str, message: msgspec.Struct, request_id: str) -> None:
        await self._bus.publish(subject, _ENCODER.encode(message), request_id)

    async def start_run(
        self,
        agent: str,
        input: str,
        *,
        attended: bool = False,
        grants: Sequence[Family] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunAccepted:
        """Publish a `RunRequest`. Its run id comes with its result (`run`)."""
        request_id = request_id or new_key()
        message = RunRequest(
            request_id=request_id,
            token=self._token(),
            agent=agent,
            input=input,
            attended=attended,
            grants=list(grants),
            budget=budget,
        )
        await self._publish(subjects.request(self._tenant), message, request_id)
        return RunAccepted(run_id="", request_id=request_id, links={})

    async def run(
        self,
        agent: str,
        input: str,
        *,
        timeout_s: float = 60.0,
        attended: bool = False,
        grants: Sequence[Family] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunResult:
        """Publish a `RunRequest` and wait for its `RunResult`."""
        request_id = request_id or new_key()
        message = RunRequest(
            request_id=request_id,
            token=self._token(),
            agent=agent,
            input=input,
            attended=attended,
            grants=list(grants),
            budget=budget,
        )
        return await self._send(
            subjects.request(self._tenant), message, request_id, RunResult, timeout_s=timeout_s
        )

    async def start(
        self,
        agent: str,
        input: str,
        *,
        timeout_s: float = 60.0,
        attended: bool = False,
        grants: Sequence[Family] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunHandle:
        """Publish a `RunRequest` and return the run's handle once its first `RunResult`
        came (over NATS a run's id comes with its first result; `handle.last` is it).

        Raises:
            WritError: the request was refused (its code), or `Timeout`.
        """
        first = await self.run(
            agent,
            input,
            timeout_s=timeout_s,
            attended=attended,
            grants=grants,
            budget=budget,
            request_id=request_id,
        )
        assert first.run_id is not None  # a refused request raised
        return RunHandle(self, first.run_id, request_id=first.request_id, last=first)

    def handle(self, run_id: str) -> RunHandle:
        """A handle on an existing run of this tenant."""
        return RunHandle(self, run_id)

    async def wait(self, run_id: str, *, after: int = -1, timeout_s: float = 60.0) -> RunResult:
        """The run's `RunResult` once it has one whose `version` is above `after` (the version
        of the last result the caller saw; -1: any), read as `writ.api.<tenant>.wait`.

        Raises:
            Timeout: none within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                return await self._read(
                    "wait",
                    RunResult,
                    run_id=run_id,
                    after=after,
                    timeout_s=round(min(remaining, ASK_S - 5), 1),
                )
            except WritError as exc:
                if exc.code not in ("TIMEOUT", "NOT_FOUND"):
                    raise
                if exc.code == "NOT_FOUND":
                    await anyio.sleep(0.1)  # not started yet
        raise Timeout("TIMEOUT", f"run {run_id} has no result after {timeout_s}s")

    async def cancel(self, run_id: str, *, request_id: str | None = None) -> None:
        """Publish a `CancelRun`; the run's `RunResult` (`cancelled`, or how it had ended)
        follows on the results stream under the run's own request id."""
        request_id = request_id or new_key("cancel")
        message = CancelRun(request_id=request_id, token=self._token(), run_id=run_id)
        await self._publish(cancel(self._tenant), message, request_id)

    async def submit_command(
        self,
        agent: str,
        operation_key: str,
        action: str,
        arguments: dict[str, Any],
        *,
        expected_revision: str | None = None,
        request_id: str | None = None,
        timeout_s: float = 60.0,
    ) -> CommandResult:
        """Publish a `SubmitCommand`; its first settled `CommandResult`."""
        request_id = request_id or new_key("cmd")
        message = SubmitCommand(
            request_id=request_id,
            token=self._token(),
            agent=agent,
            operation_key=operation_key,
            action=action,
            arguments=arguments,
            expected_revision=expected_revision,
        )
        return await self._send(
            subjects.command_request(self._tenant),
            message,
            request_id,
            CommandResult,
            timeout_s=timeout_s,
            final=lambda r: r.status not in ("pending", "dispatching"),
        )

    async def decide(
        self,
        pending_id: str,
        answer: Answer = "once",
        *,
        reason: str = "",
        request_id: str | None = None,
        proposal_id: str | None = None,
    ) -> DecisionResult:
        """Publish a `HumanDecision`; whether it was taken (one about a proposal names it)."""
        request_id = request_id or new_key("decide")
        message = HumanDecision(
            request_id=request_id,
            token=self._token(),
            pending_id=pending_id,
            answer=answer,
            reason=reason,
            proposal_id=proposal_id,
        )
        return await self._send(
            subjects.human_decision(self._tenant), message, request_id, DecisionResult
        )

    async def _proposal(
        self, proposal_id: str, answer: ApprovalAnswer, reason: str, request_id: str | None
    ) -> ApprovalResult:
        request_id = request_id or new_key(answer)
        message = ApproveProposal(
            request_id=request_id,
            token=self._token(),
            proposal_id=proposal_id,
            answer=answer,
            reason=reason,
        )
        return await self._send(
            subjects.approval(self._tenant), message, request_id, ApprovalResult
        )

    async def approve(
        self, proposal_id: str, *, reason: str = "", request_id: str | None = None
    ) -> ApprovalResult:
        """Publish an `ApproveProposal` (approve)."""
        return await self._proposal(proposal_id, "approve", reason, request_id)

    async def reject(
        self, proposal_id: str, reason: str, *, request_id: str | None = None
    ) -> ApprovalResult:
        """Publish an `ApproveProposal` (reject)."""
        return await self._proposal(proposal_id, "reject", reason, request_id)

    async def review(
        self,
        pending_id: str,
        answer: ApprovalAnswer = "approve",
        *,
        comment: str = "",
        request_id: str | None = None,
    ) -> ReviewResult:
        """Publish a `ReviewDecision`; whether the run took it."""
        request_id = request_id or new_key("review")
        message = ReviewDecision(
            request_id=request_id,
            token=self._token(),
            pending_id=pending_id,
            answer=answer,
            comment=comment,
        )
        return await self._send(subjects.review(self._tenant), message, request_id, ReviewResult)

    async def _read(self, read: str, reply: type[T], **fields: Any) -> T:
        """One host read (`writ.api.<tenant>.<read>`), as the HTTP API's GETs answer it."""
        ask = HostRead(token=self._token(), **fields)
        msg = await self._bus.ask(host_read(self._tenant, read), ask)
        raise_service_error(msg.headers)
        return decode(msg.data, reply)

    async def get_run(self, run_id: str) -> RunView:
        """Where a run stands."""
        return await self._read("run", RunView, run_id=run_id)

    async def command(self, operation_key: str) -> CommandResult:
        """The recorded state of the command under this key."""
        return await self._read("command", CommandResult, operation_key=operation_key)

    async def pending(
        self,
        *,
        cursor: str | None = None,
        limit: int = 500,
        requester: str | None = None,
        agent: str | None = None,
    ) -> PendingDecisions:
        """One page of the tenant's decisions waiting for a person, oldest first (needs the
        approver role), those `requester` asked or of `agent` if given: pass its
        `next_cursor` as `cursor` for the next page (`iter_pending` does)."""
        return await self._read(
            "pending",
            PendingDecisions,
            cursor=cursor,
            limit=limit,
            requester=requester,
            agent=agent,
        )

    def iter_pending(
        self, *, page_size: int = 500, requester: str | None = None, agent: str | None = None
    ) -> AsyncIterator[PendingDecision]:
        """Every decision waiting for a person (as `pending` filters), page after page,
        each once."""
        return every(
            lambda cursor: self.pending(
                cursor=cursor, limit=page_size, requester=requester, agent=agent
            ),
            lambda page: page.decisions,
            lambda page: page.next_cursor,
        )

    async def proposals(
        self,
        state: ProposalState | None = None,
        *,
        cursor: str | None = None,
        limit: int = 100,
        requester: str | None = None,
        agent: str | None = None,
    ) -> Proposals:
        """One page of the tenant's proposals, newest first (in `state`, those `requester`
        asked or of `agent`, if given): pass its `next_cursor` as `cursor` for the next page
        (`iter_proposals` does)."""
        return await self._read(
            "proposals",
            Proposals,
            state=state,
            cursor=cursor,
            limit=limit,
            requester=requester,
            agent=agent,
        )

    def iter_proposals(
        self, state: ProposalState | None = None, *, page_size: int = 100
    ) -> AsyncIterator[ProposalDetail]:
        """Every proposal (in `state`, if given), page after page, each once."""
        return every(
            lambda cursor: self.proposals(state, cursor=cursor, limit=page_size),
            lambda page: page.proposals,
            lambda page: page.next_cursor,
        )

    async def proposal(self, proposal_id: str) -> ProposalDetail:
        """One proposal: its frozen preview, request hash and expiry."""
        return await self._read("proposal", ProposalDetail, proposal_id=proposal_id)

    async def replay(self, run_id: str) -> ReplayReport:
        """Replay a run offline from the journal (needs the auditor role)."""
        return await self._read("replay", ReplayReport, run_id=run_id)

    def events(
        self, run_id: str, *, after: int = -1, poll_s: float = 0.25
    ) -> AsyncIterator[StepRecorded | RunResult]:
        """The run's committed steps after `after`, then its `RunResult`: read in turns, so a
        lost connection resumes right after the last step seen."""
        return run_events(self._read, run_id, after, poll_s)

    # -- chat sessions (`writ.api.<tenant>.session`, request/reply) ------------------------

    async def open_session(
        self, agent: str, *, plan_mode: bool = False, request_id: str | None = None
    ) -> Session:
        """Open a chat session with `agent`; the same `request_id`, the same session."""
        reply = await self._session_ask(
            "open", request_id or new_key("session"), agent=agent, plan_mode=plan_mode
        )
        assert reply.accepted is not None
        return Session(self, reply.accepted.session_id)

    async def sessions(self, *, cursor: str | None = None, limit: int = 50) -> SessionList:
        """One page of this principal's sessions, newest first: pass its `next` as `cursor`
        for the next page (`iter_sessions` does)."""
        reply = await self._session_ask("list", None, cursor=cursor, limit=limit)
        assert reply.sessions is not None
        return reply.sessions

    def iter_sessions(self, *, page_size: int = 50) -> AsyncIterator[SessionSummary]:
        """Every session of this principal, page after page, each once."""
        return every(
            lambda cursor: self.sessions(cursor=cursor, limit=page_size),
            lambda page: page.sessions,
            lambda page: page.next,
        )

    def session(self, session_id: str, *, last_event_id: int = 0) -> Session:
        """An existing session of this principal (its events read after `last_event_id`)."""
        return Session(self, session_id, last_event_id=last_event_id)

    async def approve_plan(
        self, plan_id: str, *, reason: str = "", request_id: str | None = None
    ) -> PlanAnswered:
        """Approve a session's proposed plan by its id."""
        reply = await self._session_ask(
            "approve_plan", request_id or new_key("plan"), plan_id=plan_id, reason=reason
        )
        assert reply.plan is not None
        return reply.plan

    async def reject_plan(
        self, plan_id: str, reason: str, *, request_id: str | None = None
    ) -> PlanAnswered:
        """Reject a session's proposed plan, saying why."""
        reply = await self._session_ask(
            "reject_plan", request_id or new_key("plan"), plan_id=plan_id, reason=reason
        )
        assert reply.plan is not None
        return reply.plan

    async def _session_write(
        self,
        op: SessionOpKind,
        session_id: str,
        request_id: str | None,
        **fields: Any,
    ) -> SessionAccepted:
        reply = await self._session_ask(
            op, request_id or new_key(op), session_id=session_id, **fields
        )
        assert reply.accepted is not None
        return reply.accepted

    async def _session_view(self, session_id: str) -> SessionView:
        reply = await self._session_ask("get", None, session_id=session_id)
        assert reply.view is not None
        return reply.view

    def _session_events(
        self, session_id: str, after: int, *, poll_s: float = 0.2
    ) -> AsyncIterator[tuple[int, AnySessionEvent | None]]:
        """The session's events after stream sequence `after`, read in batches."""
        return session_events(self._session_ask, session_id, after, poll_s=poll_s)

    async def _session_ask(
        self,
        op: SessionOpKind | Literal["events"],
        key: str | None,
        *,
        retries: int = 3,
        **fields: Any,
    ) -> SessionReply:
        """One session operation; a write is retried under its key on an outage."""
        return await session_ask(
            self._bus, self._token, self._tenant, op, key, retries=retries, **fields
        )
