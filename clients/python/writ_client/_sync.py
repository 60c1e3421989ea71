"""`SyncClient` and `SyncRunHandle`: `Client` for blocking code. Each method runs the async
one on a private event loop thread (the same retries, keys and resumption, no second copy);
streams are plain iterators."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import anyio.from_thread

from writ_client._handle import RunHandle
from writ_client._http import Client
from writ_client._session import SyncSession, iterate
from writ_client._wire.api import RunAccepted, RunView
from writ_client._wire.governance import PendingDecision, PendingDecisions, RunBudget
from writ_client._wire.host import (
    ApprovalResult,
    CommandResult,
    DecisionResult,
    ReviewResult,
    RunResult,
)
from writ_client._wire.planner import ReplayReport, StepRecorded
from writ_client._wire.reads import ProposalDetail, Proposals
from writ_client._wire.sessions import PlanAnswered, SessionList, SessionSummary
from writ_client.credentials import HostCredentials
from writ_client.errors import InvalidRequest
from writ_client.issuer import Tokens

__all__ = ["SyncClient", "SyncRunHandle"]

T = TypeVar("T")


class SyncRunHandle:
    """`RunHandle`, blocking."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, handle: RunHandle) -> None:
        self._portal, self._handle = portal, handle

    def __repr__(self) -> str:
        return f"Sync{self._handle!r}"

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._handle.run_id

    @property
    def last(self) -> RunResult | None:
        """The last result this handle saw."""
        return self._handle.last

    def wait(self, *, timeout_s: float = 60.0) -> RunResult:
        """`RunHandle.wait`: the run's next result, newer than the last seen."""
        return self._portal.call(lambda: self._handle.wait(timeout_s=timeout_s))

    def result(self, *, timeout_s: float = 60.0) -> RunResult:
        """`RunHandle.result`: the run's last result, once it has ended."""
        return self._portal.call(lambda: self._handle.result(timeout_s=timeout_s))

    def cancel(self, *, request_id: str | None = None) -> None:
        """`RunHandle.cancel`: ask for the run to be cancelled."""
        self._portal.call(lambda: self._handle.cancel(request_id=request_id))


class SyncClient:
    """`Client`'s methods, blocking: a session is a `SyncSession`, a run handle a
    `SyncRunHandle`, and `events()` a plain iterator. Close it (`with`, or `close()`)."""

    def __init__(self, base_url: str, issuer: Tokens, principal: str, **options: Any) -> None:
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            self._client: Client = self._portal.call(
                lambda: _make(base_url, issuer, principal, options)
            )
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    @classmethod
    def from_credentials(
        cls, credentials: HostCredentials, principal: str, **options: Any
    ) -> SyncClient:
        """A client on a host credentials folder's HTTP API (`HostCredentials.from_dir`)."""
        if credentials.api_url is None:
            raise InvalidRequest("INVALID_REQUEST", "the credentials name no HTTP API")
        return cls(credentials.api_url, credentials.issuer, principal, **options)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and the event loop thread."""
        try:
            self._portal.call(self._client.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        return self._portal.call(call)

    # -- runs -----------------------------------------------------------------------------

    def start_run(
        self,
        agent: str,
        input: str,
        *,
        attended: bool = False,
        grants: Sequence[str] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunAccepted:
        """`Client.start_run`: start a run; the same `request_id`, the same run."""
        return self._call(
            lambda: self._client.start_run(
                agent,
                input,
                attended=attended,
                grants=grants,
                budget=budget,
                request_id=request_id,
            )
        )

    def start(
        self,
        agent: str,
        input: str,
        *,
        attended: bool = False,
        grants: Sequence[str] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> SyncRunHandle:
        """`Client.start`: start a run and return its handle."""
        handle = self._call(
            lambda: self._client.start(
                agent,
                input,
                attended=attended,
                grants=grants,
                budget=budget,
                request_id=request_id,
            )
        )
        return SyncRunHandle(self._portal, handle)

    def handle(self, run_id: str) -> SyncRunHandle:
        """`Client.handle`: a handle on an existing run."""
        return SyncRunHandle(self._portal, self._client.handle(run_id))

    def run(
        self,
        agent: str,
        input: str,
        *,
        timeout_s: float = 60.0,
        attended: bool = False,
        grants: Sequence[str] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunResult:
        """`Client.run`: start a run and wait for its first result."""
        return self._call(
            lambda: self._client.run(
                agent,
                input,
                timeout_s=timeout_s,
                attended=attended,
                grants=grants,
                budget=budget,
                request_id=request_id,
            )
        )

    def get_run(self, run_id: str) -> RunView:
        """`Client.get_run`: where a run stands."""
        return self._call(lambda: self._client.get_run(run_id))

    def wait(self, run_id: str, *, after: int = -1, timeout_s: float = 60.0) -> RunResult:
        """`Client.wait`: the run's result newer than version `after`."""
        return self._call(lambda: self._client.wait(run_id, after=after, timeout_s=timeout_s))

    def cancel(self, run_id: str, *, request_id: str | None = None) -> RunAccepted:
        """`Client.cancel`: cancel a run (idempotent)."""
        return self._call(lambda: self._client.cancel(run_id, request_id=request_id))

    def events(self, run_id: str, *, after: int = -1) -> Iterator[StepRecorded | RunResult]:
        """`Client.events`, as an iterator: each committed step, then the `RunResult`."""
        return iterate(self._portal, self._client.events(run_id, after=after))

    # -- commands -------------------------------------------------------------------------

    def submit_command(
        self,
        agent: str,
        operation_key: str,
        action: str,
        arguments: dict[str, Any],
        *,
        expected_revision: str | None = None,
        request_id: str | None = None,
    ) -> CommandResult:
        """`Client.submit_command`: do exactly this under the host's operation key."""
        return self._call(
            lambda: self._client.submit_command(
                agent,
                operation_key,
                action,
                arguments,
                expected_revision=expected_revision,
                request_id=request_id,
            )
        )

    def command(self, operation_key: str) -> CommandResult:
        """`Client.command`: the recorded state of the command under this key."""
        return self._call(lambda: self._client.command(operation_key))

    # -- people ---------------------------------------------------------------------------

    def pending(
        self,
        *,
        cursor: str | None = None,
        limit: int = 500,
        requester: str | None = None,
        agent: str | None = None,
    ) -> PendingDecisions:
        """`Client.pending`: one page of the tenant's decisions waiting for a person."""
        return self._call(
            lambda: self._client.pending(
                cursor=cursor, limit=limit, requester=requester, agent=agent
            )
        )

    def iter_pending(
        self, *, page_size: int = 500, requester: str | None = None, agent: str | None = None
    ) -> Iterator[PendingDecision]:
        """`Client.iter_pending`: every decision waiting for a person, page after page."""
        return iterate(
            self._portal,
            self._client.iter_pending(page_size=page_size, requester=requester, agent=agent),
        )

    def decide(
        self,
        pending_id: str,
        answer: str = "once",
        *,
        reason: str = "",
        request_id: str | None = None,
        proposal_id: str | None = None,
    ) -> DecisionResult:
        """`Client.decide`: answer a pending decision."""
        return self._call(
            lambda: self._client.decide(
                pending_id,
                answer,
                reason=reason,
                request_id=request_id,
                proposal_id=proposal_id,
            )
        )

    def proposals(
        self,
        state: str | None = None,
        *,
        cursor: str | None = None,
        limit: int = 100,
        requester: str | None = None,
        agent: str | None = None,
    ) -> Proposals:
        """`Client.proposals`: one page of the tenant's proposals."""
        return self._call(
            lambda: self._client.proposals(
                state, cursor=cursor, limit=limit, requester=requester, agent=agent
            )
        )

    def iter_proposals(
        self, state: str | None = None, *, page_size: int = 100
    ) -> Iterator[ProposalDetail]:
        """`Client.iter_proposals`: every proposal, page after page."""
        return iterate(self._portal, self._client.iter_proposals(state, page_size=page_size))

    def proposal(self, proposal_id: str) -> ProposalDetail:
        """`Client.proposal`: one proposal."""
        return self._call(lambda: self._client.proposal(proposal_id))

    def approve(
        self,
        proposal_id: str,
        *,
        reason: str = "",
        request_id: str | None = None,
        grant: str = "once",
    ) -> ApprovalResult:
        """`Client.approve`: approve exactly the frozen proposal."""
        return self._call(
            lambda: self._client.approve(
                proposal_id, reason=reason, request_id=request_id, grant=grant
            )
        )

    def reject(
        self, proposal_id: str, reason: str, *, request_id: str | None = None
    ) -> ApprovalResult:
        """`Client.reject`: reject a proposal, saying why."""
        return self._call(lambda: self._client.reject(proposal_id, reason, request_id=request_id))

    def review(
        self,
        pending_id: str,
        answer: str = "approve",
        *,
        comment: str = "",
        request_id: str | None = None,
    ) -> ReviewResult:
        """`Client.review`: answer the review a run's agent asked for."""
        return self._call(
            lambda: self._client.review(pending_id, answer, comment=comment, request_id=request_id)
        )

    def replay(self, run_id: str) -> ReplayReport:
        """`Client.replay`: replay a run offline from the journal."""
        return self._call(lambda: self._client.replay(run_id))

    # -- chat sessions --------------------------------------------------------------------

    def open_session(
        self, agent: str, *, plan_mode: bool = False, request_id: str | None = None
    ) -> SyncSession:
        """`Client.open_session`: open a chat session with `agent`."""
        session = self._call(
            lambda: self._client.open_session(agent, plan_mode=plan_mode, request_id=request_id)
        )
        return SyncSession(self._portal, session)

    def session(self, session_id: str, *, last_event_id: int = 0) -> SyncSession:
        """`Client.session`: an existing session of this principal."""
        return SyncSession(
            self._portal, self._client.session(session_id, last_event_id=last_event_id)
        )

    def sessions(self, *, cursor: str | None = None, limit: int = 50) -> SessionList:
        """`Client.sessions`: one page of this principal's sessions."""
        return self._call(lambda: self._client.sessions(cursor=cursor, limit=limit))

    def iter_sessions(self, *, page_size: int = 50) -> Iterator[SessionSummary]:
        """`Client.iter_sessions`: every session, page after page."""
        return iterate(self._portal, self._client.iter_sessions(page_size=page_size))

    def approve_plan(
        self, plan_id: str, *, reason: str = "", request_id: str | None = None
    ) -> PlanAnswered:
        """`Client.approve_plan`: approve a session's proposed plan."""
        return self._call(
            lambda: self._client.approve_plan(plan_id, reason=reason, request_id=request_id)
        )

    def reject_plan(
        self, plan_id: str, reason: str, *, request_id: str | None = None
    ) -> PlanAnswered:
        """`Client.reject_plan`: reject a session's proposed plan."""
        return self._call(lambda: self._client.reject_plan(plan_id, reason, request_id=request_id))


async def _make(base_url: str, issuer: Tokens, principal: str, options: dict[str, Any]) -> Client:
    return Client(base_url, issuer, principal, **options)
