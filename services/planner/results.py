"""What a run's end (or stop) publishes: its `RunResult` for the host, or — for a branch run —
the wake of the run that called it (`BranchChanged`), each with a `Nats-Msg-Id` derived from
the run's state, so a redelivery publishes nothing new."""

from __future__ import annotations

from typing import Any, Final

from schemas import subjects
from schemas.host import ActionResult, ErrorInfo, ProposalView, RunResult, RunStatus
from schemas.planner import BranchChanged
from services.planner.effects import Effect
from services.planner.snapshot import branch_of
from services.planner.store import RunRow, Step

# A run's state as the host reads it; a state a run does not end in reads as failed.
_HOST_STATUS: Final[dict[str, RunStatus]] = {
    "succeeded": "succeeded",
    "failed": "failed",
    "awaiting_human": "awaiting_human",
    "cancelled": "cancelled",
}

__all__ = ["result_effect"]


def result_effect(
    run: RunRow,
    steps: list[Step],
    *,
    pending_id: str | None = None,
    proposal: ProposalView | None = None,
) -> Effect:
    """The message a run that ended or stopped where `run` says publishes."""
    actions = [
        _action_result(s.payload)
        for s in steps
        if s.kind == "observation" and "operation_id" in s.payload
    ]
    error = (
        ErrorInfo(code=run.error_code, message=(run.error_message or "")[:512])
        if run.error_code
        else None
    )
    status = _HOST_STATUS.get(run.status, "failed")
    if (branch := branch_of(run.manifest)) is not None:
        # A branch answers the run that called it, not the host: that run is woken to
        # observe how the branch ended (read from the store, so a duplicate changes nothing).
        return (
            subjects.branch(run.tenant),
            BranchChanged(tenant=run.tenant, run_id=branch["parent_run_id"]),
            f"branch:{run.run_id}:{run.status}:{len(steps)}",
        )
    result = RunResult(
        request_id=run.request_id,
        run_id=run.run_id,
        status=status,
        error=error,
        answer=run.answer,
        actions=actions,
        pending_id=pending_id,
        proposal=proposal,
        version=run.state_version,
    )
    return (subjects.result(run.tenant), result, f"result:{run.run_id}:{run.status}:{len(steps)}")


def _action_result(payload: dict[str, Any]) -> ActionResult:
    return ActionResult(
        action=payload["action"],
        operation_id=payload["operation_id"],
        state=payload["state"],
        receipt=payload.get("receipt"),
        reason=payload.get("reason"),
        outcome=payload.get("outcome"),
        correlation_id=payload.get("correlation_id"),
    )
