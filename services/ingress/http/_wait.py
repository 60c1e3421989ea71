"""Where a run stands and waiting for news of it: what `GET /runs/{id}`, `GET
/runs/{id}/wait` and the NATS reads `run` and `wait` answer alike."""

from __future__ import annotations

import time
from typing import Final, cast

import msgspec

from schemas.api import RunView
from schemas.host import ProposalView, RunResult, RunStatus
from schemas.reads import PROPOSALS_LIST, RUN_STATUS, GetRun, ListProposals, Proposals
from services.ingress.http._api import Api
from services.ingress.http._problems import ApiError

__all__ = ["FINAL_RUN", "run_result", "run_view", "wait_news"]

# A run that got this far has answered its host (a person may let it go on).
FINAL_RUN: Final = frozenset({"succeeded", "failed", "awaiting_human", "cancelled"})


def run_result(view: RunView) -> RunResult:
    """The `RunResult` a host got (or gets) for a run that stands where `view` says."""
    return RunResult(
        request_id=view.request_id,
        status=cast(RunStatus, view.status),  # asked only of a run that has ended
        run_id=view.run_id,
        error=view.error,
        answer=view.answer,
        actions=view.actions,
        pending_id=view.pending_id,
        proposal=view.proposal,
        version=view.version,
    )


async def _proposal_of(
    api: Api, tenant: str, run_id: str, pending_id: str | None
) -> ProposalView | None:
    """The proposal the run waits on (or, once it no longer waits, the last it made), in
    every state: what a person answers is where its frozen preview is shown."""
    found = await api.ask(
        PROPOSALS_LIST, ListProposals(tenant=tenant, run_id=run_id, limit=20), Proposals
    )
    if not found.proposals:
        return None
    waited = [p for p in found.proposals if pending_id and p.decision_id == pending_id]
    p = (waited or found.proposals)[0]
    return ProposalView(
        proposal_id=p.proposal_id,
        action=p.action,
        preview=p.preview,
        expires_at=p.expires_at or "",
    )


async def run_view(api: Api, tenant: str, run_id: str) -> RunView:
    """The run as the planner recorded it, with its proposal."""
    view = await api.ask(RUN_STATUS, GetRun(tenant=tenant, run_id=run_id), RunView)
    if view.proposal is not None:
        return view
    proposal = await _proposal_of(api, tenant, view.run_id, view.pending_id)
    return msgspec.structs.replace(view, proposal=proposal)


async def wait_news(
    api: Api, tenant: str, run_id: str, *, after: int, timeout_s: float
) -> RunResult | RunView:
    """The run's result once it has one whose `version` is above `after` (`after=-1`: any
    result), or, after `timeout_s`, the run as it stands (a `RunView`: no news).

    Raises:
        ApiError: `NOT_FOUND` if the run was not found within the wait.
    """
    deadline = time.monotonic() + timeout_s
    view: RunView | None = None
    async with api.results.watch(tenant, run_id) as waiter:
        while True:
            try:
                view = await run_view(api, tenant, run_id)
            except ApiError as exc:
                if exc.code != "NOT_FOUND":
                    raise
            if view is not None and view.status in FINAL_RUN and view.version > after:
                return run_result(view)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or waiter.closing:  # stopping: the run as it stands, now
                break
            # The result event ends the wait at once; the poll covers a missed one.
            got = await waiter.next(min(remaining, 2.0))
            if isinstance(got, RunResult) and got.version > after:
                if got.proposal is None and got.run_id is not None:
                    proposal = await _proposal_of(api, tenant, got.run_id, got.pending_id)
                    got = msgspec.structs.replace(got, proposal=proposal)
                return got
    if view is None:
        raise ApiError("NOT_FOUND", "no such run")
    return view
