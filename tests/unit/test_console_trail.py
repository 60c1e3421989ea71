"""A proposal's trail as the console reads it: every step from the journals, each checked
against its journal and against what the record says now."""

from __future__ import annotations

import html
from typing import Any

from services.ingress.console._i18n import rendering
from services.ingress.console._trail import trail_rows, trail_section


def _entry(seq: int, kind: str, at: str, **payload: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": kind,
        "subject": "s",
        "recorded_at": f"2026-12-01T10:00:{at}+00:00",
        "payload": payload,
        "verified": True,
        "problem": None,
    }


def _trail(**proposal: Any) -> dict[str, Any]:
    return {
        "proposal": {
            "proposal_id": "prop_x",
            "state": "completed",
            "command_state": "succeeded",
            "requester": "alice@acme.example",
            "approved_by": "lead@acme.example",
            **proposal,
        },
        "journals": [
            {
                "service": "admission",
                "ok": True,
                "found": [
                    _entry(
                        3,
                        "proposal.pending",
                        "01",
                        principal="alice@acme.example",
                        agent="refund-assistant",
                        action="payment.refund",
                    ),
                    _entry(9, "proposal.approved", "05", approved_by="lead@acme.example", line=5),
                ],
            },
            {
                "service": "governance",
                "ok": True,
                "found": [
                    _entry(4, "decision", "02", verdict="ask", line=5, policy_version="p1"),
                    _entry(
                        8, "pending.answered", "04", answer="once", answered_by="lead@acme.example"
                    ),
                ],
            },
            {
                "service": "dispatcher",
                "ok": True,
                "found": [
                    _entry(2, "attempt.started", "06", connector="payments", lease_epoch=1),
                    _entry(3, "command.succeeded", "07", receipt="re_1"),
                ],
            },
        ],
    }


def test_every_step_in_order_each_verified() -> None:
    rows = trail_rows(_trail())
    assert [(r.step, r.who) for r in rows] == [
        ("Proposed", "alice@acme.example"),
        ("Decided", "governance"),
        ("Answered", "lead@acme.example"),
        ("Approved", "lead@acme.example"),
        ("Attempt", "payments"),
        ("Outcome", ""),
    ]
    assert all(r.verified for r in rows)
    assert rows[-1].what == "succeeded, receipt re_1" and rows[0].journal == "admission #3"
    assert "All 6 rows check out" in trail_section(_trail(), html.escape)


def test_a_row_its_journal_does_not_verify_is_named_with_why() -> None:
    trail = _trail()
    trail["journals"][0]["found"][1].update(verified=False, problem="row 12: bad MAC")
    rows = {r.step: r for r in trail_rows(trail)}
    assert not rows["Approved"].verified and rows["Approved"].problem == "row 12: bad MAC"
    assert rows["Proposed"].verified
    said = trail_section(trail, html.escape)
    assert "1 of 6 rows failed verification: Approved (row 12: bad MAC)" in said
    assert 'data-step="Approved" data-verified="false"' in said


def test_a_record_that_disagrees_with_its_journal_fails_the_row() -> None:
    rows = {r.step: r for r in trail_rows(_trail(approved_by="mallory@acme.example"))}
    assert rows["Approved"].problem == (
        "the record says approved by mallory@acme.example, the journal lead@acme.example"
    )


def test_a_step_the_record_claims_and_no_journal_proves_fails() -> None:
    trail = _trail()
    trail["journals"][2]["found"] = []  # the dispatcher's journal says nothing of it
    rows = trail_rows(trail)
    assert (rows[-1].step, rows[-1].verified, rows[-1].journal) == ("Outcome", False, "")
    assert "no journal entry proves it" in (rows[-1].problem or "")


def test_an_unreadable_trail_says_so() -> None:
    assert "could not be read" in trail_section(None, html.escape)


def test_a_revision_asked_is_the_step_that_ended_it() -> None:
    trail = _trail(state="rejected", command_state=None, approved_by=None)
    trail["journals"][0]["found"][1] = _entry(
        9, "proposal.revision_asked", "05", rejected_by="lead@acme.example", reason="r: cheaper"
    )
    trail["journals"][2]["found"] = []
    rows = trail_rows(trail)
    assert ("Revision asked", "lead@acme.example", "r: cheaper") in [
        (r.step, r.who, r.what) for r in rows
    ]
    assert all(r.verified for r in rows), rows  # no "Rejected" step is missing


def test_a_french_trail_writes_its_times_the_french_way() -> None:
    with rendering("fr"):
        page = trail_section(_trail(), html.escape)
    assert "<td>1 déc. 2026 à 10:00:" in page and "2026-12-01T10:00:" not in page
    with rendering("en"):
        assert "2026-12-01T10:00:" in trail_section(_trail(), html.escape)


def test_a_french_trail_says_decides_reason_in_french_and_free_text_as_written() -> None:
    trail = _trail()
    decided = trail["journals"][1]["found"][0]
    decided["payload"]["reason"] = (
        "a consequential action (money, access, sending outside) is asked every time"
    )
    answered = trail["journals"][1]["found"][1]
    answered["payload"]["reason"] = "fine by me"
    with rendering("fr"):
        page = trail_section(trail, html.escape)
    assert "une action lourde de conséquences (argent, accès, envoi à l&#x27;extérieur)" in page
    assert "is asked every time" not in page
    assert "once: fine by me" in page  # an approver's own words stay as written
