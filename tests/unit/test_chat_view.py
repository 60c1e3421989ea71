"""`writ chat`'s rendering of session events and its parsing of input lines (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from writ.chat import Action, ChatView, parse, render
from writ_client.types import (
    DecisionAsked,
    DecisionTaken,
    PlanDecided,
    PlanProposed,
    PlanStep,
    PlanView,
    ProposalMade,
    StepAdmitted,
    StepDispatched,
    TextDelta,
    TextReset,
    TurnEnded,
    TurnStarted,
    WriterNote,
)

S = "ses-1"


def delta(text: str, index: int = 0, attempt: int = 1) -> TextDelta:
    return TextDelta(session_id=S, n=3, turn=1, step=0, attempt=attempt, index=index, text=text)


def ended(answer: str | None = "Done.", **kw: Any) -> TurnEnded:
    return TurnEnded(
        session_id=S,
        n=9,
        turn=1,
        run_id="ses-1-t1",
        status=kw.pop("status", "succeeded"),
        answer=answer,
        **kw,
    )


def test_deltas_print_as_they_come_and_the_streamed_answer_is_not_printed_again() -> None:
    view = ChatView()
    out = render(TurnStarted(session_id=S, n=2, turn=1, run_id="ses-1-t1"), view)
    out += render(delta("The note "), view) + render(delta("is on the record.", 1), view)
    out += render(ended("The note is on the record."), view)
    assert out == "[turn 1]\nagent: The note is on the record.\n[turn 1 succeeded]\n"


def test_a_reset_is_shown_and_the_next_attempt_starts_a_fresh_line() -> None:
    view = ChatView()
    out = render(delta("The no"), view)
    out += render(
        TextReset(
            session_id=S, n=3, turn=1, step=0, attempt=1, reason="the stream was cut before its end"
        ),
        view,
    )
    out += render(delta("The note.", attempt=2), view) + render(ended("The note."), view)
    assert out == (
        "agent: The no\n[the model's answer was interrupted (the stream was cut "
        "before its end); it starts again]\nagent: The note.\n[turn 1 succeeded]\n"
    )


def test_an_answer_that_was_not_streamed_is_printed_at_the_turns_end() -> None:
    view = ChatView()
    assert render(ended("Done."), view) == "agent: Done.\n[turn 1 succeeded]\n"
    # Another step's streamed text (a plan's explanation) is not the final answer.
    out = render(delta("My plan: one note."), view) + render(ended("Done."), view)
    assert out == "agent: My plan: one note.\nagent: Done.\n[turn 1 succeeded]\n"
    failed = ended(None, status="failed", code="BUDGET_EXHAUSTED", correlation_id="corr-9")
    assert render(failed, view) == ("[turn 1 failed: BUDGET_EXHAUSTED (correlation id corr-9)]\n")


def test_a_plan_is_shown_with_its_steps_and_asked_in_place() -> None:
    view = ChatView()
    plan = PlanView(
        plan_id="plan-7",
        session_id=S,
        turn=1,
        state="proposed",
        digest="0" * 64,
        steps=[
            PlanStep(index=0, capability="crm.customer.read"),
            PlanStep(index=1, capability="crm.note.create", arguments={"customer_id": "ACME-42"}),
        ],
    )
    out = render(PlanProposed(session_id=S, n=4, turn=1, plan=plan), view)
    assert out == (
        "[plan plan-7]\n    1. crm.customer.read\n"
        "    2. crm.note.create customer_id='ACME-42'\n"
        "approve this plan? y to approve, anything else rejects it with that "
        "reason\n"
    )
    assert view.asking == ("plan", "plan-7")
    assert parse("y\n", view) == Action("approve")
    assert parse("no, read the invoice first", view) == Action(
        "reject", "no, read the invoice first"
    )
    assert parse("/reject", view) == Action("reject", "rejected in the chat")
    assert parse("/pause", view) == Action("pause")  # commands still work while it asks
    render(PlanDecided(session_id=S, n=5, plan_id="plan-7", answer="approved"), view)
    assert view.asking is None and parse("y", view) == Action("message", "y")


def test_a_decision_asked_and_writs_notes_are_shown_on_their_own_lines() -> None:
    view = ChatView()
    out = render(delta("Let me"), view)
    out += render(
        DecisionAsked(
            session_id=S, n=4, turn=1, step=1, pending_id="pend-1", message="send_external"
        ),
        view,
    )
    out += render(WriterNote(session_id=S, n=5, turn=1, text="refused"), view)
    assert out == (
        "agent: Let me\n[waiting for a person's decision pend-1: send_external]\n"
        "allow it? y (once), always, or n (deny)\nwrit: refused\n"
    )
    assert view.asking == ("decision", "pend-1")
    assert [parse(x, view) for x in ("y", "always", "N", "deny")] == [
        Action("decide", "once"),
        Action("decide", "always"),
        Action("decide", "deny"),
        Action("decide", "deny"),
    ]
    assert parse("what is it?", view) == Action("message", "what is it?")
    render(
        DecisionTaken(session_id=S, n=6, turn=1, step=1, pending_id="pend-1", answer="once"), view
    )
    assert view.asking is None


def test_a_proposal_is_asked_in_place_until_the_turn_ends() -> None:
    view = ChatView()
    out = render(
        ProposalMade(
            session_id=S,
            n=4,
            turn=1,
            step=1,
            action="crm.note.create",
            proposal_id="prop-1",
            preview={"body": "Delayed"},
        ),
        view,
    )
    assert out == (
        "[proposal prop-1: crm.note.create body='Delayed']\n"
        "approve this action? y to approve, anything else rejects it with that "
        "reason\n"
    )
    assert parse("yes", view) == Action("approve")
    assert parse("not this customer", view) == Action("reject", "not this customer")
    render(ended(), view)
    assert view.asking is None


@pytest.mark.parametrize(
    ("line", "action"),
    [
        ("hello there\n", Action("message", "hello there")),
        ("   \n", Action("nothing")),
        ("/pause", Action("pause")),
        ("/resume", Action("resume")),
        ("/close", Action("close")),
        ("/quit", Action("quit")),
        ("/help", Action("help")),
        ("/inject  mention 7781 ", Action("inject", "mention 7781")),
        ("/inject", Action("invalid", "/inject")),
        ("/fork", Action("fork", "")),
        ("/fork 2", Action("fork", "2")),
        ("/fork two", Action("invalid", "/fork two")),
        ("/pause now", Action("invalid", "/pause now")),
        ("/frobnicate", Action("invalid", "/frobnicate")),
    ],
)
def test_input_lines(line: str, action: Action) -> None:
    assert parse(line, ChatView()) == action


def test_a_commands_admission_and_dispatch_show_as_progress_lines() -> None:
    view = ChatView()
    out = render(StepAdmitted(session_id=S, n=4, turn=1, step=0, operation_id="op-7"), view)
    out += render(StepDispatched(session_id=S, n=5, turn=1, step=0, operation_id="op-7"), view)
    assert out == "  · admitted (operation op-7)\n  · dispatched\n"


def test_a_turns_end_lists_every_step_of_its_approved_plan() -> None:
    from writ_client.types import PlanStepOutcome

    event = TurnEnded(
        session_id=S,
        n=9,
        turn=1,
        run_id="ses-1-t1",
        status="failed",
        code="PLAN_STEP_FAILED",
        plan_steps=[
            PlanStepOutcome(index=0, capability="crm.note.create", outcome="succeeded"),
            PlanStepOutcome(index=1, capability="payment.refund", outcome="failed"),
            PlanStepOutcome(index=2, capability="crm.note.create", outcome="not_run"),
        ],
    )
    assert render(event, ChatView()) == (
        "[turn 1 failed: PLAN_STEP_FAILED]\n"
        "    1. crm.note.create: succeeded\n"
        "    2. payment.refund: failed\n"
        "    3. crm.note.create: not_run\n"
    )
