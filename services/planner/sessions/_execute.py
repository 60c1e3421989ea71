"""An approved plan as a contract Writ carries out itself (`_plans.py`): which step comes
next, when the plan ends, and what became of each step. Pure: the loop and `writ audit replay`
both ask it."""

from __future__ import annotations

from typing import Any, Final

from schemas.sessions import PlanStep, PlanStepOutcome
from services.planner.provider import SelectCapability
from services.planner.store import Step

__all__ = [
    "PLAN_STEP_FAILED",
    "PLAN_STEP_KEY",
    "model_payload",
    "plan_next",
    "plan_outcomes",
    "plan_taken",
    "step_outcome",
]

# A decision Writ took from an approved plan holds the step's index under this key (a model's
# decision never does: its schema forbids unknown fields).
PLAN_STEP_KEY: Final = "plan_step"
# An approved step whose call ran and did not succeed: the plan ends there.
PLAN_STEP_FAILED: Final = "PLAN_STEP_FAILED"


def plan_taken(payload: dict[str, Any]) -> int | None:
    """The index of the approved plan's step a recorded decision is (Writ took it, no model
    call), or None for a model's decision."""
    index = payload.get(PLAN_STEP_KEY)
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def model_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A recorded decision as the decision protocol reads it (a plan step's mark left out)."""
    return {k: v for k, v in payload.items() if k != PLAN_STEP_KEY}


def step_outcome(observation: dict[str, Any] | None) -> tuple[str, bool]:
    """(what a plan step's observation says became of it, whether the plan may go on)."""
    if observation is None:
        return "not_run", False
    if observation.get("refused"):
        return f"refused: {observation['refused']}", False
    if "state" in observation:
        state = str(observation["state"])
        return state, state == "succeeded"
    if "agent" in observation:
        outcome = "answered" if observation.get("executed") and "answer" in observation else None
        outcome = outcome or str(observation.get("outcome", "failed"))
        return outcome, outcome == "answered"
    return ("read", True) if observation.get("executed") else ("not_run", False)


def _approved_at(steps: list[Step]) -> int | None:
    return max(
        (s.seq for s in steps if s.kind == "observation" and s.payload.get("review") == "approve"),
        default=None,
    )


def _taken(steps: list[Step], after: int) -> list[tuple[Step, dict[str, Any] | None]]:
    """The plan steps Writ took after step `after`, each with its observation (if any yet)."""
    by_seq = {s.seq: s for s in steps}
    out = []
    for s in steps:
        if s.seq > after and s.kind == "decision" and plan_taken(s.payload) is not None:
            seen = by_seq.get(s.seq + 1)
            out.append(
                (s, seen.payload if seen is not None and seen.kind == "observation" else None)
            )
    return out


def plan_next(
    steps: list[Step], planned: list[PlanStep]
) -> SelectCapability | tuple[str, str] | None:
    """Under an approved plan whose approval is observed in `steps`: the next step for Writ to
    take (its frozen request, no model call); or the plan's end, (code, reason), when the last
    step taken could not run or did not succeed; or None when there is nothing to take (no
    approval observed yet, or every step taken: the model is asked what comes after) (pure:
    the loop and `writ audit replay` both ask it)."""
    approved_at = _approved_at(steps)
    if approved_at is None:
        return None
    taken = _taken(steps, approved_at)
    index = 0
    if taken:
        last, seen = taken[-1]
        if seen is None:
            return None  # its outcome is still to come
        outcome, ok = step_outcome(seen)
        index = int(plan_taken(last.payload) or 0)
        if not ok:
            code = str(seen["refused"]) if seen.get("refused") else PLAN_STEP_FAILED
            left = len(planned) - index - 1
            name = planned[index].capability if index < len(planned) else "?"
            why = seen.get("reason") or ""
            return code[:64], (
                f"step {index + 1} of the approved plan ({name}) ended {outcome}: {why}; "
                "the plan ends here"
                + (f", its {left} later step(s) not run" if left > 0 else "")
                + "; any change needs a new plan"
            )[:512]
        index += 1
    if index >= len(planned):
        return None
    step = planned[index]
    return SelectCapability(
        capability=step.capability,
        arguments=step.request if step.request is not None else step.arguments,
    )


def plan_outcomes(steps: list[Step], planned: list[PlanStep]) -> list[PlanStepOutcome]:
    """Every step of the approved plan with what became of it (`not_run` for those the plan
    never reached)."""
    approved_at = _approved_at(steps)
    taken = (
        {}
        if approved_at is None
        else {plan_taken(s.payload): (s, seen) for s, seen in _taken(steps, approved_at)}
    )
    out = []
    for step in planned:
        s, seen = taken.get(step.index, (None, None))
        outcome = "not_run" if s is None else step_outcome(seen)[0]
        out.append(
            PlanStepOutcome(
                index=step.index,
                capability=step.capability,
                outcome=outcome[:128],
                operation_id=None if seen is None else seen.get("operation_id"),
            )
        )
    return out
