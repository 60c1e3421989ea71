"""An approved plan as a contract (`services/planner/sessions/_execute.py`): Writ takes the
frozen steps in order, ends the plan at the first that does not succeed, and lists every step
with its outcome."""

from __future__ import annotations

from typing import Any

from schemas.sessions import PlanStep
from services.planner.provider import SelectCapability
from services.planner.sessions._execute import (
    PLAN_STEP_FAILED,
    PLAN_STEP_KEY,
    model_payload,
    plan_next,
    plan_outcomes,
    plan_taken,
)
from services.planner.store import Step

NOTES = [{"customer_id": "ACME-42", "body": f"note {i}"} for i in range(3)]
PLAN = [
    PlanStep(index=i, capability="crm.note.create", arguments=n, preview=n, request=n)
    for i, n in enumerate(NOTES)
]


def planned_then_approved() -> list[Step]:
    steps: list[Step] = []
    for i, note in enumerate(NOTES):
        steps.append(
            Step(
                seq=2 * i,
                kind="decision",
                payload={
                    "decision": "select_capability",
                    "capability": "crm.note.create",
                    "arguments": note,
                },
            )
        )
        steps.append(Step(seq=2 * i + 1, kind="observation", payload={"refused": "PLANNED"}))
    steps.append(Step(seq=6, kind="decision", payload={"decision": "answer_directly"}))
    steps.append(Step(seq=7, kind="observation", payload={"review": "approve"}))
    return steps


def take(steps: list[Step], index: int, outcome: dict[str, Any]) -> None:
    seq = steps[-1].seq + 1
    payload = {
        "decision": "select_capability",
        "capability": "crm.note.create",
        "arguments": NOTES[index],
        PLAN_STEP_KEY: index,
    }
    steps.append(Step(seq=seq, kind="decision", payload=payload))
    steps.append(Step(seq=seq + 1, kind="observation", payload=outcome))


def test_nothing_is_taken_before_the_approval_is_observed() -> None:
    assert plan_next(planned_then_approved()[:-1], PLAN) is None


def test_the_steps_are_taken_in_order_then_the_model_is_asked() -> None:
    steps = planned_then_approved()
    for i in range(3):
        assert plan_next(steps, PLAN) == SelectCapability(
            capability="crm.note.create", arguments=NOTES[i]
        )
        take(steps, i, {"operation_id": f"op{i}", "state": "succeeded"})
    assert plan_next(steps, PLAN) is None  # every step ran: the model answers
    assert [(o.index, o.outcome, o.operation_id) for o in plan_outcomes(steps, PLAN)] == [
        (0, "succeeded", "op0"),
        (1, "succeeded", "op1"),
        (2, "succeeded", "op2"),
    ]


def test_a_step_that_did_not_succeed_ends_the_plan_with_a_typed_code() -> None:
    steps = planned_then_approved()
    take(steps, 0, {"operation_id": "op0", "state": "succeeded"})
    take(steps, 1, {"operation_id": "op1", "state": "failed", "reason": "boom"})
    code, reason = plan_next(steps, PLAN)  # type: ignore[misc]
    assert code == PLAN_STEP_FAILED
    assert "step 2 of the approved plan (crm.note.create) ended failed" in reason
    assert "its 1 later step(s) not run" in reason
    assert [o.outcome for o in plan_outcomes(steps, PLAN)] == ["succeeded", "failed", "not_run"]


def test_a_refused_step_ends_the_plan_with_its_check() -> None:
    steps = planned_then_approved()
    take(steps, 0, {"refused": "PLAN_STALE", "reason": "amount_cents changed"})
    stop = plan_next(steps, PLAN)
    assert isinstance(stop, tuple) and stop[0] == "PLAN_STALE"
    assert [o.outcome for o in plan_outcomes(steps, PLAN)] == [
        "refused: PLAN_STALE",
        "not_run",
        "not_run",
    ]


def test_a_plan_step_mark_is_not_part_of_the_models_decision() -> None:
    payload = {"decision": "select_capability", "capability": "x", "arguments": {}}
    assert plan_taken(payload) is None
    marked = {**payload, PLAN_STEP_KEY: 2}
    assert plan_taken(marked) == 2 and model_payload(marked) == payload
    assert plan_taken({**payload, PLAN_STEP_KEY: True}) is None
