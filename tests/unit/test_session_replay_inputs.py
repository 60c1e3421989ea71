"""What a chat turn's replay reads of its session (`store._replay._of_turn`), and the in-process
registry a close cancels a turn's model call through (`sessions/_inflight.py`)."""

from __future__ import annotations

import anyio
import pytest

from services.planner.journal_entries import Captured
from services.planner.sessions._inflight import InFlightCalls
from services.planner.store._replay import _of_turn


def _plan(seq: int, plan_id: str, turn: int) -> Captured:
    return Captured(
        seq=seq, kind="session.PlanProposed", payload={"plan": {"plan_id": plan_id, "turn": turn}}
    )


def _decided(seq: int, plan_id: str) -> Captured:
    return Captured(seq=seq, kind="session.PlanDecided", payload={"plan_id": plan_id})


def test_a_turn_reads_its_own_plans_and_whether_the_session_plans_nothing_else() -> None:
    run = "ses-abc-t3"
    entries = [
        Captured(seq=1, kind="session.SessionOpened", payload={"plan_mode": True}),
        _plan(2, "plan-copied", 1),
        _decided(3, "plan-copied"),  # a fork's copy: turn 1
        Captured(seq=9, kind="run.started", payload={}),
        _plan(11, "plan-mine", 3),
        _decided(14, "plan-mine"),
        _plan(12, "plan-later", 4),  # the next turn's
        Captured(seq=10, kind="session.UserMessage", payload={"turn": 3}),
        Captured(seq=13, kind="step.decision", payload={}),
    ]
    kept = _of_turn(entries, run)
    assert [(c.seq, c.kind) for c in kept] == [
        (1, "session.SessionOpened"),
        (9, "run.started"),
        (11, "session.PlanProposed"),
        (13, "step.decision"),
        (14, "session.PlanDecided"),
    ]


@pytest.mark.anyio
async def test_a_turns_model_calls_are_cancelled_by_its_run_id_only() -> None:
    calls = InFlightCalls(nc=None)  # type: ignore[arg-type]  # cancelling needs no NATS
    assert calls.cancel("ses-x-t1") == 0
    with calls.watch("ses-x-t1") as mine, calls.watch("ses-y-t1") as other:
        with mine:
            assert calls.cancel("ses-x-t1") == 1
            await anyio.sleep(1)  # cancelled at once, not after a second
        assert mine.cancelled_caught and not other.cancel_called
    assert calls.cancel("ses-x-t1") == 0  # gone once the call is over
