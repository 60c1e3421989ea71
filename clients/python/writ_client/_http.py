"""`Client` (async) and `SyncClient`: Writ's HTTP API (`/api/v1`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, TypeVar

import anyio
import anyio.from_thread
import httpx
import msgspec

from schemas.api import RunAccepted, RunView
from schemas.governance import PendingDecisions, RunBudget
from schemas.host import ApprovalResult, CommandResult, DecisionResult, ReviewResult, RunResult
from schemas.planner import ReplayReport, StepRecorded
from schemas.reads import ProposalDetail, Proposals
from schemas.sessions import (
    AnySessionEvent,
    PlanAnswered,
    SessionAccepted,
    SessionOpKind,
    SessionView,
)
from writ_client._session import Session, blocking_method, decode_event, read_sse
from writ_client.errors import WritError
from writ_client.issuer import Issuer

__all__ = ["Client", "SyncClient", "new_key"]

T = TypeVar("T")
_ENCODER: Final = msgspec.json.Encoder()
_PATHS: Final = {"message": "messages"}  # a session op's route, where it is not the op


def new_key(prefix: str = "req") -> str:
    """A fresh request id (an Idempotency-Key)."""
    return f"{prefix}-{uuid.uuid4().hex}"


class Client:
    """The HTTP API for one principal of one tenant.

    Every POST carries an Idempotency-Key (a fresh one unless given), and a retry after a lost
    response or an outage sends the same key again: retrying is safe by construction.
    """

    def __init__(
        self,
        base_url: str,
        issuer: Issuer,
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

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
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
                error = WritError("NETWORK", repr(exc))
            else:
                if response.status_code in accept:
                    return response.status_code, msgspec.json.decode(response.content, type=reply)
                error = _problem(response)
            if not error.retryable or attempt == self._retries:
                raise error
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

    async def wait(self, run_id: str, *, timeout_s: float = 60.0) -> RunResult:
        """The run's `RunResult` once it has one (`awaiting_human` included).

        Raises:
            WritError: `TIMEOUT` when it has none within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                status, raw = await self._call(
                    "GET",
                    f"/runs/{run_id}/wait",
                    msgspec.Raw,
                    params={"timeout_s": round(min(remaining, 30.0), 1)},
                )
            except WritError as exc:
                if exc.code != "NOT_FOUND":
                    raise
                await anyio.sleep(0.1)  # not started yet
                continue
            if status == 200:  # 202: not yet, a RunView of where it stands
                return msgspec.json.decode(raw, type=RunResult)
        raise WritError("TIMEOUT", f"run {run_id} has no result after {timeout_s}s")

    async def run(
        self, agent: str, input: str, *, timeout_s: float = 60.0, **options: Any
    ) -> RunResult:
        """Start a run and wait for its result."""
        accepted = await self.start_run(agent, input, **options)
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

    async def pending(self) -> PendingDecisions:
        """The tenant's decisions waiting for a person (needs the approver role)."""
        return (await self._call("GET", "/pending-decisions", PendingDecisions))[1]

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

    async def proposals(self, state: str | None = None) -> Proposals:
        """The tenant's proposals (in `state`, if given)."""
        params = {"state": state} if state else None
        return (await self._call("GET", "/proposals", Proposals, params=params))[1]

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
    try:
        document = response.json()
        code, detail = document["code"], document.get("detail", "")
    except (ValueError, KeyError, TypeError):
        code = "INTERNAL" if response.status_code >= 500 else "INVALID_REQUEST"
        detail = response.text[:300]
    return WritError(code, detail, status=response.status_code)


class SyncClient:
    """`Client`'s methods, blocking: each call runs on a private event loop thread; a session
    (`open_session`, `session`) is a `SyncSession`, whose methods block the same way."""

    def __init__(self, base_url: str, issuer: Issuer, principal: str, **options: Any) -> None:
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._client: Client = self._portal.call(
            lambda: _make(base_url, issuer, principal, options)
        )

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._portal.call(self._client.aclose)
        self._portal_cm.__exit__(None, None, None)

    def __getattr__(self, name: str) -> Any:
        return blocking_method(self._portal, self._client, name)


async def _make(base_url: str, issuer: Issuer, principal: str, options: dict[str, Any]) -> Client:
    return Client(base_url, issuer, principal, **options)
