"""`Client` (async) and `SyncClient`: Writ's HTTP API (`/api/v1`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, TypeVar

import anyio
import httpx
import msgspec

from writ_client._handle import RunHandle
from writ_client._keys import new_key
from writ_client._paging import every
from writ_client._session import Session, decode_event, read_sse
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
from writ_client._wire.sessions import (
    AnySessionEvent,
    PlanAnswered,
    SessionAccepted,
    SessionList,
    SessionOpKind,
    SessionSummary,
    SessionView,
)
from writ_client.credentials import HostCredentials
from writ_client.errors import (
    InvalidRequest,
    InvalidResponse,
    Timeout,
    Unavailable,
    WritError,
    error,
)
from writ_client.issuer import Tokens

__all__ = ["Client", "new_key"]

T = TypeVar("T")
_ENCODER: Final = msgspec.json.Encoder()
_PATHS: Final = {"message": "messages"}  # a session op's route, where it is not the op


class Client:
    """The HTTP API for one principal of one tenant.

    Every POST carries an Idempotency-Key (a fresh one unless given), and a retry after a lost
    response or an outage sends the same key again: retrying is safe by construction.
    """

    def __init__(
        self,
        base_url: str,
        issuer: Tokens,
        principal: str,
        *,
        roles: Sequence[str] = (),
        retries: int = 3,
        timeout_s: float = 60.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._issuer, self._principal, self._roles = issuer, principal, tuple(roles)
        self._retries = retries
        self._http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s)

    @classmethod
    def from_credentials(
        cls, credentials: HostCredentials, principal: str, **options: Any
    ) -> Client:
        """A client on a host credentials folder's HTTP API (`HostCredentials.from_dir`)."""
        if credentials.api_url is None:
            raise InvalidRequest("INVALID_REQUEST", "the credentials name no HTTP API")
        return cls(credentials.api_url, credentials.issuer, principal, **options)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        reply: type[T],
        *,
        body: Any = None,
        key: str | None = None,
        params: dict[str, Any] | None = None,
        accept: tuple[int, ...] = (200, 202),
    ) -> tuple[int, T]:
        content = None if body is None else _ENCODER.encode(body)
        delay = 0.2
        for attempt in range(self._retries + 1):
            headers = {
                "Authorization": "Bearer " + self._issuer.token(self._principal, roles=self._roles),
                "Content-Type": "application/json",
            }
            if key is not None:
                headers["Idempotency-Key"] = key
            try:
                response = await self._http.request(
                    method, path, content=content, headers=headers, params=params
                )
            except httpx.TransportError as exc:
                failure: WritError = Unavailable("NETWORK", repr(exc))
            else:
                if response.status_code in accept:
                    try:
                        return response.status_code, msgspec.json.decode(
                            response.content, type=reply
                        )
                    except msgspec.DecodeError as exc:
                        raise InvalidResponse("INVALID_RESPONSE", str(exc)) from exc
                failure = _problem(response)
            if not failure.retryable or attempt == self._retries:
                raise failure
            await anyio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    # -- runs -----------------------------------------------------------------------------

    async def start_run(
        self,
        agent: str,
        input: str,
        *,
        attended: bool = False,
        grants: Sequence[str] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunAccepted:
        """Start a run; `request_id` (the Idempotency-Key) names it: the same id, one run."""
        body = {"agent": agent, "input": input, "attended": attended, "grants": list(grants)}
        if budget is not None:
            body["budget"] = msgspec.to_builtins(budget)
        return (
            await self._call("POST", "/runs", RunAccepted, body=body, key=request_id or new_key())
        )[1]

    async def get_run(self, run_id: str) -> RunView:
        """Where a run stands."""
        return (await self._call("GET", f"/runs/{run_id}", RunView))[1]

    async def wait(self, run_id: str, *, after: int = -1, timeout_s: float = 60.0) -> RunResult:
        """The run's `RunResult` once it has one whose `version` is above `after` (the version
        of the last result the caller saw; -1: any, `awaiting_human` included).

        Raises:
            Timeout: none within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            params: dict[str, Any] = {"timeout_s": round(min(remaining, 30.0), 1)}
            if after >= 0:
                params["after"] = after
            try:
                status, raw = await self._call(
                    "GET", f"/runs/{run_id}/wait", msgspec.Raw, params=params
                )
            except WritError as exc:
                if exc.code == "TIMEOUT":
                    continue  # nothing newer yet: ask again while time is left
                if exc.code != "NOT_FOUND":
                    raise
                await anyio.sleep(0.1)  # not started yet
                continue
            if status == 200:  # 202: not yet, a RunView of where it stands
                return msgspec.json.decode(raw, type=RunResult)
        raise Timeout("TIMEOUT", f"run {run_id} has no result after {timeout_s}s")

    async def start(
        self,
        agent: str,
        input: str,
        *,
        attended: bool = False,
        grants: Sequence[str] = (),
        budget: RunBudget | None = None,
        request_id: str | None = None,
    ) -> RunHandle:
        """Start a run (as `start_run`) and return its handle."""
        accepted = await self.start_run(
            agent, input, attended=attended, grants=grants, budget=budget, request_id=request_id
        )
        return RunHandle(self, accepted.run_id, request_id=accepted.request_id)

    def handle(self, run_id: str) -> RunHandle:
        """A handle on an existing run of this tenant."""
        return RunHandle(self, run_id)

    async def run(
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
        """Start a run and wait for its first result (`awaiting_human` included)."""
        accepted = await self.start_run(
            agent, input, attended=attended, grants=grants, budget=budget, request_id=request_id
        )
        return await self.wait(accepted.run_id, timeout_s=timeout_s)

    async def cancel(self, run_id: str, *, request_id: str | None = None) -> RunAccepted:
        """Cancel a run (idempotent, accepted while it starts); `wait` gets its result."""
        return (
            await self._call(
                "POST", f"/runs/{run_id}/cancel", RunAccepted, key=request_id or new_key("cancel")
            )
        )[1]

    async def events(
        self, run_id: str, *, after: int = -1
    ) -> AsyncIterator[StepRecorded | RunResult]:
        """The run's timeline: each committed step (`StepRecorded`), then its `RunResult`.
        A dropped connection is resumed right after the last step seen (`Last-Event-ID`)."""
        last, delay = after, 0.2
        while True:
            headers = {
                "Authorization": "Bearer " + self._issuer.token(self._principal, roles=self._roles),
                "Last-Event-ID": str(last),
            }
            try:
                async with self._http.stream(
                    "GET", f"/runs/{run_id}/events", headers=headers, timeout=None
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                        raise _problem(response)
                    event, data = "", ""
                    async for line in response.aiter_lines():
                        if line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:"):
                            data = line[5:].strip()
                        elif not line and data:
                            if event == "result":
                                yield msgspec.json.decode(data, type=RunResult)
                                return
                            step = msgspec.json.decode(data, type=StepRecorded)
                            last = step.seq
                            yield step
                            event, data, delay = "", "", 0.2
            except httpx.TransportError:
                await anyio.sleep(delay)  # resume after `last`: no gap, no duplicate
                delay = min(delay * 2, 5.0)

    # -- commands -------------------------------------------------------------------------

    async def submit_command(
        self,
        agent: str,
        operation_key: str,
        action: str,
        arguments: dict[str, Any],
        *,
        expected_revision: str | None = None,
        request_id: str | None = None,
    ) -> CommandResult:
        """Do exactly this under the host's own operation key; its `CommandResult`."""
        body = {
            "agent": agent,
            "operation_key": operation_key,
            "action": action,
            "arguments": arguments,
            "expected_revision": expected_revision,
        }
        return (
            await self._call(
                "POST", "/commands", CommandResult, body=body, key=request_id or new_key("cmd")
            )
        )[1]

    async def command(self, operation_key: str) -> CommandResult:
        """The recorded state of the command under this key."""
        return (await self._call("GET", f"/commands/{operation_key}", CommandResult))[1]

    # -- people ---------------------------------------------------------------------------

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
        params: dict[str, Any] = {"limit": limit}
        for name, value in (("cursor", cursor), ("requester", requester), ("agent", agent)):
            if value is not None:
                params[name] = value
        return (await self._call("GET", "/pending-decisions", PendingDecisions, params=params))[1]

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

    async def decide(
        self,
        pending_id: str,
        answer: str = "once",
        *,
        reason: str = "",
        request_id: str | None = None,
        proposal_id: str | None = None,
    ) -> DecisionResult:
        """Answer a pending decision (`once`, `always`, `deny`); one about a proposal names
        it (`proposal_id`), or it is refused with `PROPOSAL_REQUIRED`."""
        body: dict[str, str] = {"pending_id": pending_id, "answer": answer, "reason": reason}
        if proposal_id is not None:
            body["proposal_id"] = proposal_id
        return (
            await self._call(
                "POST",
                "/pending-decisions/decide",
                DecisionResult,
                body=body,
                key=request_id or new_key("decide"),
            )
        )[1]

    async def proposals(
        self,
        state: str | None = None,
        *,
        cursor: str | None = None,
        limit: int = 100,
        requester: str | None = None,
        agent: str | None = None,
    ) -> Proposals:
        """One page of the tenant's proposals, newest first (in `state`, those `requester`
        asked or of `agent`, if given): pass its `next_cursor` as `cursor` for the next page
        (`iter_proposals` does)."""
        params: dict[str, Any] = {"limit": limit}
        for name, value in (
            ("state", state or None),
            ("cursor", cursor),
            ("requester", requester),
            ("agent", agent),
        ):
            if value is not None:
                params[name] = value
        return (await self._call("GET", "/proposals", Proposals, params=params))[1]

    def iter_proposals(
        self, state: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[ProposalDetail]:
        """Every proposal (in `state`, if given), page after page, each once."""
        return every(
            lambda cursor: self.proposals(state, cursor=cursor, limit=page_size),
            lambda page: page.proposals,
            lambda page: page.next_cursor,
        )

    async def proposal(self, proposal_id: str) -> ProposalDetail:
        """One proposal: its frozen preview, request hash and expiry."""
        return (await self._call("GET", f"/proposals/{proposal_id}", ProposalDetail))[1]

    async def approve(
        self,
        proposal_id: str,
        *,
        reason: str = "",
        request_id: str | None = None,
        grant: str = "once",
    ) -> ApprovalResult:
        """Approve exactly the frozen proposal (`grant="always"`: and let the agent's calls of
        its family run without asking, where the decision offers it)."""
        return (
            await self._call(
                "POST",
                f"/proposals/{proposal_id}/approve",
                ApprovalResult,
                body={"reason": reason, "grant": grant},
                key=request_id or new_key("approve"),
            )
        )[1]

    async def reject(
        self, proposal_id: str, reason: str, *, request_id: str | None = None
    ) -> ApprovalResult:
        """Reject a proposal, saying why."""
        return (
            await self._call(
                "POST",
                f"/proposals/{proposal_id}/reject",
                ApprovalResult,
                body={"reason": reason},
                key=request_id or new_key("reject"),
            )
        )[1]

    async def review(
        self,
        pending_id: str,
        answer: str = "approve",
        *,
        comment: str = "",
        request_id: str | None = None,
    ) -> ReviewResult:
        """Answer the review a run's agent asked for."""
        return (
            await self._call(
                "POST",
                f"/reviews/{pending_id}",
                ReviewResult,
                body={"answer": answer, "comment": comment},
                key=request_id or new_key("review"),
            )
        )[1]

    async def replay(self, run_id: str) -> ReplayReport:
        """Replay a run offline from the journal (needs the auditor role)."""
        return (await self._call("POST", f"/audit/replay/{run_id}", ReplayReport))[1]

    # -- chat sessions --------------------------------------------------------------------

    async def open_session(
        self, agent: str, *, plan_mode: bool = False, request_id: str | None = None
    ) -> Session:
        """Open a chat session with `agent`; the same `request_id`, the same session."""
        accepted = await self._write(
            "/sessions",
            SessionAccepted,
            {"agent": agent, "plan_mode": plan_mode},
            request_id,
            "session",
        )
        return Session(self, accepted.session_id)

    async def sessions(self, *, cursor: str | None = None, limit: int = 50) -> SessionList:
        """One page of this principal's sessions, newest first: pass its `next` as `cursor`
        for the next page (`iter_sessions` does)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        return (await self._call("GET", "/sessions", SessionList, params=params))[1]

    def iter_sessions(self, *, page_size: int = 50) -> AsyncIterator[SessionSummary]:
        """Every session of this principal, page after page, each once."""
        return every(
            lambda cursor: self.sessions(cursor=cursor, limit=page_size),
            lambda page: page.sessions,
            lambda page: page.next,
        )

    def session(self, session_id: str, *, last_event_id: int = 0) -> Session:
        """An existing session of this principal (its events read from `last_event_id`)."""
        return Session(self, session_id, last_event_id=last_event_id)

    async def approve_plan(
        self, plan_id: str, *, reason: str = "", request_id: str | None = None
    ) -> PlanAnswered:
        """Approve a session's proposed plan by its id."""
        return await self._write(
            f"/plans/{plan_id}/approve", PlanAnswered, {"reason": reason}, request_id, "plan"
        )

    async def reject_plan(
        self, plan_id: str, reason: str, *, request_id: str | None = None
    ) -> PlanAnswered:
        """Reject a session's proposed plan, saying why."""
        return await self._write(
            f"/plans/{plan_id}/reject", PlanAnswered, {"reason": reason}, request_id, "plan"
        )

    async def _get(self, path: str, reply: type[T]) -> T:
        return (await self._call("GET", path, reply))[1]

    async def _write(
        self, path: str, reply: type[T], body: Any, request_id: str | None, prefix: str
    ) -> T:
        return (
            await self._call(
                "POST",
                path,
                reply,
                body=body,
                key=request_id or new_key(prefix),
                accept=(200, 201, 202),
            )
        )[1]

    async def _session_write(
        self, op: SessionOpKind, session_id: str, request_id: str | None, **fields: Any
    ) -> SessionAccepted:
        path = f"/sessions/{session_id}/{_PATHS.get(op, op)}"
        return await self._write(path, SessionAccepted, fields or None, request_id, op)

    async def _session_view(self, session_id: str) -> SessionView:
        return await self._get(f"/sessions/{session_id}", SessionView)

    async def _session_events(
        self, session_id: str, after: int
    ) -> AsyncIterator[tuple[int, AnySessionEvent | None]]:
        async for seq, data in self._sse(f"/sessions/{session_id}/events", after):
            yield seq, decode_event(data)

    async def _sse(self, path: str, last_event_id: int) -> AsyncIterator[tuple[int, bytes]]:
        """The events of an SSE route after `last_event_id`, as (id, data)."""
        headers = {
            "Authorization": "Bearer " + self._issuer.token(self._principal, roles=self._roles),
            "Last-Event-ID": str(last_event_id),
        }
        async with self._http.stream("GET", path, headers=headers, timeout=None) as response:
            if response.status_code != 200:
                await response.aread()
                raise _problem(response)
            async for seq, data in read_sse(response):
                yield seq, data


def _problem(response: httpx.Response) -> WritError:
    """The error an RFC 9457 problem document names (by its status, if it is not one)."""
    try:
        document = response.json()
        code, detail = document["code"], document.get("detail", "")
    except (ValueError, KeyError, TypeError):
        code = "INTERNAL" if response.status_code >= 500 else "INVALID_REQUEST"
        detail = response.text[:300]
    return error(code, detail, status=response.status_code)
