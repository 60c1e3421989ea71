"""`writ policy whatif`'s core: journaled decisions, built by governance's own `decision_row`
from real calls and facts, ruled again with governance's `decide` under a candidate."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from actions import ACTIONS
from services.governance.logic import Call, Facts, Rule, Ruling, decide
from services.governance.store._records import decision_row
from writ.whatif import (
    Amount,
    Candidate,
    JournaledDecision,
    Threshold,
    render,
    report_digest,
    whatif,
)

REFUND = ACTIONS["payment.refund"]
# (amount in cents, currency): the journaled refunds of the window.
REFUNDS = [(12000, "EUR"), (49999, "EUR"), (50000, "EUR"), (65000, "EUR"), (120000, "EUR")]
REFUNDS += [(90000, "USD")]


def journaled(call: Call, facts: Facts | None, *, proposal_id: str | None = None) -> dict[str, Any]:
    """A decision's journal payload as governance writes it, read back from JSON."""
    ruling = decide(call, facts)
    _, _, event = decision_row(
        tenant="acme",
        run_id="run-1",
        principal="p@acme.example",
        call=call,
        ruling=ruling,
        policy_version=facts.policy_version if facts else "unreadable",
        proposal_id=proposal_id,
        attended=False,
        facts=facts,
    )
    return json.loads(json.dumps(event, default=str))


def refund_call() -> Call:
    return Call(
        tool="payment.refund",
        family=REFUND.family,
        connector=REFUND.connector,
        agent="refund-assistant",
        first_argument="pay_1",
        grantable=REFUND.grant_may_cover(),
    )


def note_call() -> Call:
    return Call(
        tool="crm.note.create",
        family="write_delete",
        connector="crm",
        agent="assistant",
        first_argument="ACME-42",
    )


FACTS = Facts(
    policy_version="v1",
    standing_families=frozenset({"write_delete"}),
    rules=(
        Rule(tool="crm.note.create", effect="deny", arg_prefix="GLOBEX-"),
        Rule(tool="other.tool", effect="deny"),  # names no call here: not journaled
    ),
)


def window() -> tuple[list[dict[str, Any]], dict[str, Amount]]:
    """Each refund asked at admission and, approved, allowed at dispatch; a note a standing
    grant allows, one a deny rule refuses, and a read."""
    events, amounts = [], {}
    for i, (cents, currency) in enumerate(REFUNDS):
        op = f"prop-{i}"
        for approved in (False, True):
            e = journaled(refund_call(), msgspec.structs.replace(FACTS, approved=approved))
            events.append(e)
            amounts[e["decision_id"]] = Amount(operation=op, amount_cents=cents, currency=currency)
    events.append(journaled(note_call(), FACTS))
    events.append(journaled(msgspec.structs.replace(note_call(), first_argument="GLOBEX-1"), FACTS))
    events.append(
        journaled(Call(tool="crm.read", family="read", connector="crm", agent="assistant"), FACTS)
    )
    return events, amounts


def run(candidate: Candidate, events: list[dict[str, Any]], amounts: dict[str, Amount]) -> Any:
    decisions = [msgspec.convert(e, JournaledDecision) for e in events]
    return whatif(
        tenant="acme",
        candidate=candidate,
        candidate_digest="d",
        since="s",
        until="u",
        decisions=decisions,
        amounts=amounts,
    )


def test_the_journal_row_keeps_the_facts_and_only_the_rules_naming_the_call() -> None:
    [event] = [journaled(note_call(), FACTS)]
    assert event["call"] == {
        "scope": "external",
        "connector": "crm",
        "profile_fact": False,
        "grantable": True,
        "digest": None,
    }
    assert event["facts"]["standing_families"] == ["write_delete"]
    assert [r["tool"] for r in event["facts"]["rules"]] == ["crm.note.create"]
    assert journaled(note_call(), None)["facts"] is None


def test_the_recorded_policy_as_candidate_flips_nothing() -> None:
    events, amounts = window()
    report = run(Candidate(version="same"), events, amounts)
    assert report.decisions == report.redecided == len(events)
    assert report.flips == [] and report.not_redecidable == []


def test_refunds_above_500_eur_denied_flip_exactly_those_refunds() -> None:
    events, amounts = window()
    candidate = msgspec.convert(
        {
            "version": "refunds-500",
            "thresholds": [
                {
                    "tool": "payment.refund",
                    "currency": "EUR",
                    "above_cents": 50000,
                    "verdict": "deny",
                }
            ],
        },
        Candidate,
    )
    report = run(candidate, events, amounts)
    assert report.redecided == len(events)
    flipped = sorted((f.operation, f.amount_cents, f.before, f.after) for f in report.flips)
    assert flipped == [
        ("prop-3", 65000, "allow", "deny"),
        ("prop-3", 65000, "ask", "deny"),
        ("prop-4", 120000, "allow", "deny"),
        ("prop-4", 120000, "ask", "deny"),
    ]
    assert report.approvals_not_needed == []
    assert all(f.tool == "payment.refund" and f.currency == "EUR" for f in report.flips)


def test_an_ask_threshold_on_refunds_flips_nothing_they_are_asked_already() -> None:
    """Money is asked every time, and an approved call was asked: an `ask` threshold adds
    nothing to refunds, and the report says so rather than inventing flips."""
    events, amounts = window()
    candidate = Candidate(
        version="ask-500",
        thresholds=[
            msgspec.convert(
                {
                    "tool": "payment.refund",
                    "currency": "EUR",
                    "above_cents": 50000,
                    "verdict": "ask",
                },
                type=Threshold,
            )
        ],
    )
    report = run(candidate, events, amounts)
    assert report.flips == []
    # It says why: the two EUR refunds above 500.00, each asked and then approved.
    [effect] = report.thresholds
    assert (effect.covered, effect.raised) == (4, 0)
    assert effect.unchanged_because == [
        "already ask: a consequential action (money, access, sending outside) is asked every time",
        "a person was asked and approved this very call",
    ]
    assert "the candidate changes nothing for them" in render(report)


def test_an_ask_threshold_flips_an_allowed_call_on_a_larger_amount() -> None:
    events, amounts = window()
    note = events[-3]
    amounts[note["decision_id"]] = Amount(operation="op-note", amount_cents=70000, currency="EUR")
    candidate = msgspec.convert(
        {
            "version": "notes-ask",
            "thresholds": [
                {
                    "tool": "crm.note.create",
                    "currency": "EUR",
                    "above_cents": 50000,
                    "verdict": "ask",
                }
            ],
        },
        Candidate,
    )
    report = run(candidate, events, amounts)
    [flip] = report.flips
    assert (flip.decision_id, flip.before, flip.after) == (note["decision_id"], "allow", "ask")
    [effect] = report.thresholds
    assert (effect.covered, effect.raised, effect.unchanged_because) == (1, 1, [])
    assert "changes nothing" not in render(report)


def test_a_candidate_without_the_deny_rule_and_a_narrow_allow_lists_approvals_not_needed() -> None:
    events, amounts = window()
    code = Call(
        tool="shell.exec",
        family="execute_code",
        connector=None,
        agent="assistant",
        first_argument="git status",
    )
    events.append(journaled(code, msgspec.structs.replace(FACTS, developer_mode=True)))
    candidate = msgspec.convert(
        {
            "version": "looser",
            "rules": [{"tool": "shell.exec", "effect": "allow", "arg_prefix": "git status"}],
        },
        Candidate,
    )
    report = run(candidate, events, amounts)
    changed = sorted((f.tool, f.before, f.after) for f in report.flips)
    assert changed == [("crm.note.create", "deny", "allow"), ("shell.exec", "ask", "allow")]
    assert [(f.tool, f.before) for f in report.approvals_not_needed] == [("shell.exec", "ask")]


def test_a_decision_without_facts_or_not_reproduced_is_listed_not_guessed() -> None:
    events, amounts = window()
    old = {k: v for k, v in events[-1].items() if k not in ("call", "facts")}
    mcp_refused = dict(events[-2], verdict="deny", line=1)  # refused outside `decide`
    report = run(
        Candidate(version="x", refused_tools=["crm.note.create"]),
        [old, mcp_refused],
        amounts,
    )
    assert report.redecided == 0 and report.flips == []
    assert [n.split(": ")[1] for n in report.not_redecidable] == [
        "facts not recorded",
        "journaled verdict not reproduced",
    ]


def test_the_candidate_and_its_report_refuse_what_they_do_not_know() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"version": "x", "grants": ["money"]}, Candidate)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(
            {
                "version": "x",
                "thresholds": [
                    {"tool": "t", "currency": "eur", "above_cents": 1, "verdict": "ask"}
                ],
            },
            Candidate,
        )
    events, amounts = window()
    report = run(Candidate(version="same"), events, amounts)
    tampered = msgspec.structs.replace(report, redecided=report.redecided - 1)
    assert report_digest(report) != report_digest(tampered)
    assert report_digest(report) == report_digest(run(Candidate(version="same"), events, amounts))


def test_a_refused_store_still_rules_the_same() -> None:
    """A decision ruled on no facts (store unreadable) is ruled again on none."""
    read = Call(tool="crm.read", family="read", connector="crm", agent="assistant")
    event = journaled(refund_call(), None)
    assert event["verdict"] == "deny"
    report = run(Candidate(version="x"), [event, journaled(read, None)], {})
    assert report.redecided == 2 and report.flips == []
    assert decide(read, None) == Ruling(
        verdict="allow", line=3, reason="plain read; policy unavailable"
    )


def test_a_window_is_a_positive_whole_number_of_one_unit() -> None:
    from datetime import timedelta

    from writ.whatif.cli import parse_duration

    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("90m") == timedelta(minutes=90)
    for bad in ("0d", "7", "1w", "-1h", "7d\n", "1.5h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
