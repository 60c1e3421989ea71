"""The console's pure parts: what a page shows and how, what a form may carry, CSRF."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from actions import ACTIONS
from services.ingress.console._asks import decision_page
from services.ingress.console._pages import (
    outcome_box,
    proposal_final,
    proposal_page,
    time_left,
)
from services.ingress.console._session import Viewer
from services.ingress.console._web import DecideForm as _DecideForm
from services.ingress.console._web import Form as _Form
from services.ingress.console._web import RejectForm as _RejectForm

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def viewer(
    principal: str = "ops@acme.example",
    token: str = "t1",
    roles: frozenset[str] = frozenset({"approver"}),
) -> Viewer:
    return Viewer(
        tenant="acme", principal=principal, roles=roles, token=token, expires=NOW.timestamp() + 600
    )


def proposal(**fields: object) -> dict[str, object]:
    return {
        "proposal_id": "prop_1",
        "run_id": "run-1",
        "action": "crm.note.create",
        "preview": {"customer_id": "ACME-42", "body": "<script>alert(1)</script> & more"},
        "request_hash": "ab" * 32,
        "state": "pending",
        "requester": "alice@acme.example",
        "agent": "crm-assistant",
        "created_at": NOW.isoformat(),
        "expires_at": (NOW + timedelta(hours=1)).isoformat(),
        **fields,
    }


def test_a_preview_is_shown_in_words_escaped_never_as_json() -> None:
    page = proposal_page(viewer(), proposal(), now=NOW)
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert 'data-field="Customer record">ACME-42<' in page
    assert '"customer_id"' not in page
    assert 'id="approve"' in page and 'name="csrf"' in page


def test_a_preview_its_contract_cannot_decode_is_not_shown_at_all() -> None:
    page = proposal_page(viewer(), proposal(preview={"customer_id": 42}), now=NOW)
    assert "cannot be shown" in page and "42" not in page.split("What approving it does")[1][:300]


def test_the_requester_is_offered_no_approve_button_and_told_why() -> None:
    page = proposal_page(viewer("alice@acme.example"), proposal(), now=NOW)
    assert 'id="approve"' not in page and "another approver must approve it" in page
    assert 'id="reject"' in page


def test_an_expired_proposal_offers_no_answer() -> None:
    page = proposal_page(
        viewer(), proposal(expires_at=(NOW - timedelta(seconds=1)).isoformat()), now=NOW
    )
    assert 'id="approve"' not in page and 'id="reject"' not in page
    assert "can no longer be approved" in page
    assert time_left((NOW - timedelta(seconds=1)).isoformat(), NOW) == "expired"
    assert time_left((NOW + timedelta(seconds=90)).isoformat(), NOW) == "1m 30s"


def test_an_auditor_without_the_approver_role_cannot_answer() -> None:
    page = proposal_page(viewer(roles=frozenset({"auditor"})), proposal(), now=NOW)
    assert 'id="approve"' not in page and "Only approvers" in page


@pytest.mark.parametrize(
    ("command", "final", "said"),
    [
        ("pending", False, "outcome: pending"),
        ("dispatching", False, "outcome: pending"),
        ("succeeded", True, "outcome: succeeded (receipt re_1)"),
        ("unknown", True, "outcome: needs_reconciliation"),
        ("revision_required", True, "outcome: revision_required"),
    ],
)
def test_the_page_follows_a_command_until_its_outcome(command: str, final: bool, said: str) -> None:
    p = proposal(state="executing", command_state=command, receipt="re_1", approved_by="ops")
    assert proposal_final(p) is final
    box = outcome_box(p, NOW)
    assert said in box and f'data-final="{str(final).lower()}"' in box


def test_a_revision_required_says_why() -> None:
    p = proposal(
        state="executing",
        command_state="revision_required",
        approved_by="ops",
        command_reason="the line's discount changed since it was proposed",
    )
    assert (
        "outcome: revision_required: the line&#x27;s discount changed since it was proposed"
    ) in outcome_box(p, NOW)


def test_a_decision_offers_only_the_answers_its_case_allows() -> None:
    decision = {
        "pending_id": "p1",
        "run_id": "r1",
        "agent": "a",
        "principal": "alice",
        "tool": "tool:shell.run",
        "family": "execute_code",
        "first_argument": "ls",
        "reason": "code",
        "options": ["once", "deny"],
        "attended": False,
        "deadline": None,
        "created_at": NOW.isoformat(),
    }
    page = decision_page(viewer(), decision, now=NOW)
    assert 'value="once"' in page and 'value="deny"' in page and 'value="always"' not in page


def test_the_csrf_token_is_the_sessions_own_and_is_checked_in_constant_time() -> None:
    one, other = viewer(token="token-one"), viewer(token="token-two")
    assert one.csrf != other.csrf and len(one.csrf) == 64
    assert one.csrf_ok(one.csrf) and not one.csrf_ok(other.csrf) and not one.csrf_ok("")


def test_forms_are_closed_and_bounded() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"csrf": "x", "amount_cents": "1"}, _Form)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"csrf": "x", "reason": ""}, _RejectForm)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"csrf": "x", "reason": "r" * 501}, _RejectForm)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"csrf": "x", "answer": "forever"}, _DecideForm)


def test_every_action_describes_its_preview_in_plain_text_lines() -> None:
    email = ACTIONS["email.draft.apply"]
    lines = email.describe(
        email.decode_preview(
            {"subject": "Hi", "segment": "juniors", "recipients": 12, "body": "Hello"}
        )
    )
    assert lines == [("Audience", "12 recipients (juniors)"), ("Subject", "Hi"), ("Body", "Hello")]
    charge = ACTIONS["payment.charge.create"]  # money as an amount and a currency
    assert charge.describe(
        charge.decode_preview(
            {
                "customer_id": "ACME-42",
                "amount_cents": 1200,
                "currency": "EUR",
                "description": "Fee",
            }
        )
    ) == [
        ("Customer", "ACME-42"),
        ("Amount to charge", "12.00 EUR"),
        ("Description", "Fee"),
    ]


@pytest.mark.parametrize(
    ("state", "command", "kind"),
    [
        ("pending", None, "waiting"),
        ("executing", "pending", "pending"),
        ("completed", "succeeded", "succeeded"),
        ("completed", "revision_required", "revision_required"),
        ("completed", "unknown", "needs_reconciliation"),
        ("completed", "failed", "terminal_failure"),
        ("rejected", None, "rejected"),
        ("expired", None, "expired"),
    ],
)
def test_the_outcome_colour_follows_the_typed_outcome_not_the_proposal(
    state: str, command: str | None, kind: str
) -> None:
    box = outcome_box(proposal(state=state, command_state=command, approved_by="ops"), NOW)
    assert f'data-outcome="{kind}"' in box and f"outcome-{kind}" in box


def test_a_hosts_raw_error_body_is_summarised_and_a_failure_gives_its_correlation_id() -> None:
    raw = '{"error": {"code": 412, "detail": "revision r3 != r4", "trace": "..."}}'
    box = outcome_box(
        proposal(
            state="completed",
            command_state="revision_required",
            approved_by="ops",
            command_reason=raw,
        ),
        NOW,
    )
    assert "revision r3" not in box and "operators&#x27; records" in box
    failed = outcome_box(
        proposal(
            state="completed",
            command_state="failed",
            approved_by="ops",
            operation_id="op-9",
            command_reason="Traceback: boom",
        ),
        NOW,
    )
    assert "correlation id op-9" in failed and "Traceback" not in failed


def test_a_runs_headline_states_what_writ_recorded_before_the_models_words() -> None:
    from services.ingress.console._run_pages import run_page

    run = {
        "run_id": "run-1",
        "status": "succeeded",
        "agent": "refund-assistant",
        "answer": "The missing discount was refunded.",
        "actions": [
            {
                "action": "payment.refund",
                "operation_id": "op-1",
                "state": "revision_required",
                "outcome": "revision_required",
                "reason": "the line's discount changed since it was proposed",
            }
        ],
    }
    page = run_page(viewer(), run, [], journals=None, replay=None)
    recorded = page.index('id="run-recorded"')
    assert recorded < page.index('id="run-answer"')
    assert "payment.refund: revision_required" in page[recorded:]
    assert "The agent wrote:" in page


def test_a_proposal_page_has_a_live_region_for_its_outcome() -> None:
    page = proposal_page(viewer(), proposal(), now=NOW)
    assert '<p id="announce" class="visually-hidden" role="status" aria-live="polite">' in page


def test_a_proposal_page_says_who_approved_it_and_when() -> None:
    page = proposal_page(
        viewer(),
        proposal(
            state="completed",
            command_state="succeeded",
            approved_by="ops@acme.example",
            approved_at="2026-12-07T10:00:00+00:00",
        ),
        now=NOW,
    )
    assert 'id="approved">by ops@acme.example at 2026-12-07T10:00:00+00:00' in page
    assert 'id="approved"' not in proposal_page(viewer(), proposal(), now=NOW)


@pytest.mark.parametrize(("status", "kind"), [("awaiting_human", "notice"), ("failed", "problem")])
def test_a_run_waiting_for_a_person_is_told_not_flagged(status: str, kind: str) -> None:
    from services.ingress.console._run_pages import run_page

    run = {
        "run_id": "run-1",
        "status": status,
        "agent": "billing-assistant",
        "error": {"code": "AWAITING_HUMAN", "message": "payment.charge.create needs a person"},
        "actions": [],
    }
    page = run_page(viewer(), run, [], journals=None, replay=None)
    assert f'<p class="{kind}" id="run-error">AWAITING_HUMAN: ' in page


def test_a_waiting_runs_note_is_in_french_for_a_french_approver() -> None:
    from services.ingress.console._i18n import rendering
    from services.ingress.console._run_pages import run_page

    run = {
        "run_id": "run-1",
        "status": "awaiting_human",
        "agent": "billing-assistant",
        "error": {
            "code": "AWAITING_HUMAN",
            "message": "payment.charge.create needs a person's decision: "
            "a consequential action (money, access, sending outside) is asked every time",
        },
        "actions": [],
    }
    with rendering("fr"):
        page = run_page(viewer(), run, [], journals=None, replay=None)
    assert (
        "payment.charge.create attend la décision d&#x27;une personne : une action lourde" in page
    )


def test_a_host_commands_proposal_links_to_no_run_and_an_agents_does() -> None:
    page = proposal_page(viewer(), proposal(), now=NOW)  # no run: a host's own command
    assert 'href="/console/runs/run-1"' not in page
    assert "none: the host submitted this command itself" in page
    run = {"run_id": "run-1", "status": "awaiting_human", "agent": "a", "evidence": []}
    page = proposal_page(viewer(), proposal(), now=NOW, run=run)
    assert '<a id="run-link" href="/console/runs/run-1">run-1</a>' in page
