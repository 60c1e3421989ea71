"""The console in English and French: a catalog with both languages for every message, French
pages with no English left on them, amounts and times written the French way, and the locale
chosen from the switch's cookie or Accept-Language."""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest

from schemas.mcp import (
    ClassifiedTool,
    ListedTool,
    RegisteredServer,
    RegisteredServers,
    ServerListing,
    ToolStatus,
)
from services.ingress.console._asks import decision_page, review_page
from services.ingress.console._i18n import (
    CATALOG,
    LABELS,
    amount,
    caption,
    negotiate,
    rendering,
    stamp,
    t,
)
from services.ingress.console._mcp import index_page, server_page, tool_page
from services.ingress.console._pages import (
    evidence_list,
    h,
    inbox_page,
    inbox_rows,
    message_page,
    outcome_box,
    proposal_page,
)
from services.ingress.console._run_pages import run_page
from services.ingress.console._session import ConsoleRefused, Viewer
from services.ingress.console._trail import trail_section

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
NBSP, NNBSP = "\u00a0", "\u202f"


def _viewer(principal: str = "ops@acme.example", roles: tuple[str, ...] = ("approver",)) -> Viewer:
    return Viewer(
        tenant="acme",
        principal=principal,
        roles=frozenset(roles),
        token="t1",
        expires=NOW.timestamp() + 600,
    )


def _charge(**fields: object) -> dict[str, object]:
    return {
        "proposal_id": "prop_1",
        "run_id": "run-1",
        "action": "payment.charge.create",
        "preview": {
            "customer_id": "ACME-42",
            "amount_cents": 4900,
            "currency": "EUR",
            "description": "Expedited shipping",
        },
        "request_hash": "ab" * 32,
        "state": "pending",
        "requester": "alice@acme.example",
        "agent": "billing-assistant",
        "created_at": NOW.isoformat(),
        "expires_at": (NOW + timedelta(hours=1)).isoformat(),
        "facts_read_at": NOW.isoformat(),
        "decision_id": "d-1",
        "decision_line": 5,
        "policy_version": "v1",
        **fields,
    }


_RUN = {"run_id": "run-1", "status": "awaiting_human", "agent": "billing-assistant"}
_ITEM = {
    "kind": "proposal",
    "id": "prop_1",
    "agent": "billing-assistant",
    "href": "/console/proposals/prop_1",
    "what": "payment.charge.create",
    "requester": "alice@acme.example",
    "created_at": NOW.isoformat(),
    "expires_at": None,
}
_DECISION = {
    "pending_id": "pend-1",
    "tool": "lookup",
    "family": "read",
    "agent": "billing-assistant",
    "first_argument": "ACME-42",
    "reason": "line 3",
    "principal": "alice@acme.example",
    "created_at": NOW.isoformat(),
    "deadline": None,
    "run_id": "run-1",
    "options": ["once", "always", "deny"],
}


def _inbox(**counts: int | None) -> str:
    return inbox_page(
        _viewer(roles=("approver", "auditor")),
        [_ITEM],
        filters={
            "kind": "",
            "agent": "",
            "action": "",
            "requester": "",
            "older_than_min": None,
            "cursor": "c1",
        },
        agents=["billing-assistant"],
        actions=["payment.charge.create"],
        counts=counts or {"proposal": 1, "decision": 0, "review": 0},
        next_cursor="c2",
        problems=[],
        now=NOW,
        more_decisions=True,
    )


_DIGEST, _OLD = "a" * 64, "b" * 64
_LISTING = ServerListing(
    ok=True,
    digest="c" * 64,
    tools=[ToolStatus(name="find", digest=_DIGEST, state="changed", family="read", flags=["x"])],
    exposed=["find"],
    shown=ListedTool(
        name="find",
        description="Finds",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        digest=_DIGEST,
    ),
    classified=ClassifiedTool(
        family="read", digest=_OLD, description="Found", classified_by="op@acme.example"
    ),
)
_OPERATOR = ("operator",)
# Every kind of journal row a proposal's trail composes words for.
_JOURNALED = {
    "proposal": _charge(state="completed", approved_by="x@acme.example"),
    "journals": [
        {
            "service": "admission",
            "found": [
                {"kind": kind, "seq": None, "verified": True, "payload": payload}
                for kind, payload in (
                    ("proposal.pending", {"principal": "a", "agent": "b", "action": "c"}),
                    ("proposal.rejected", {"principal": "a", "agent": "b", "reason": "r"}),
                    ("proposal.approved", {"approved_by": "a", "line": 5, "policy_version": "v"}),
                    ("command.admitted", {"principal": "a", "line": 5, "policy_version": "v"}),
                    ("command.authorized", {"kid": "k1"}),
                    ("decision", {"verdict": "ask", "line": 5, "policy_version": "v"}),
                    ("attempt.started", {"connector": "payments", "lease_epoch": 1}),
                    ("command.reconciled", {"state": "succeeded", "receipt": "ch_1"}),
                )
            ],
        }
    ],
}

# Every page and every state of a page the console renders from this module's parts.
PAGES: dict[str, Callable[[], str]] = {
    "inbox": _inbox,
    "inbox, empty rows": lambda: inbox_rows([], NOW),
    "proposal, pending": lambda: proposal_page(
        _viewer(), _charge(), now=NOW, run=_RUN, options=["once", "always", "deny"]
    ),
    "proposal, four eyes": lambda: proposal_page(
        _viewer(), _charge(approvals_needed=2, approvals=["bob@acme.example"]), now=NOW
    ),
    "proposal, four eyes, one no longer counting": lambda: proposal_page(
        _viewer(),
        _charge(
            approvals_needed=2,
            approvals=["bob@acme.example"],
            approvals_given=[
                {
                    "approver": "eve@acme.example",
                    "approved_at": NOW.isoformat(),
                    "counts": False,
                    "code": "APPROVER_REVOKED",
                    "reason": "the approver's access was revoked after they approved",
                },
                {"approver": "bob@acme.example", "approved_at": NOW.isoformat(), "counts": True},
            ],
        ),
        now=NOW,
    ),
    "proposal, rejected with a reason": lambda: proposal_page(
        _viewer(), _charge(state="rejected", reason="rejected by bob@acme.example"), now=NOW
    ),
    "proposal, own approval": lambda: proposal_page(
        _viewer("bob@acme.example"),
        _charge(approvals_needed=2, approvals=["bob@acme.example"]),
        now=NOW,
    ),
    "proposal, own request": lambda: proposal_page(
        _viewer("alice@acme.example"), _charge(), now=NOW
    ),
    "proposal, auditor": lambda: proposal_page(_viewer(roles=("auditor",)), _charge(), now=NOW),
    "proposal, expired": lambda: proposal_page(
        _viewer(), _charge(expires_at=(NOW - timedelta(seconds=1)).isoformat()), now=NOW
    ),
    "proposal, answered and done": lambda: proposal_page(
        _viewer(),
        _charge(
            state="completed",
            command_state="succeeded",
            approved_by="bob@acme.example",
            approved_at=NOW.isoformat(),
            receipt="ch_1",
        ),
        now=NOW,
        answered="x",
    ),
    "proposal, undecodable preview": lambda: proposal_page(
        _viewer(), _charge(preview={"customer_id": 42}), now=NOW
    ),
    "outcome, unknown": lambda: outcome_box(
        _charge(state="executing", command_state="unknown", approved_by="b"), NOW
    ),
    "outcome, failed": lambda: outcome_box(
        _charge(state="executing", command_state="failed", approved_by="b", operation_id="o"),
        NOW,
    ),
    "outcome, refused by the host": lambda: outcome_box(
        _charge(
            state="completed",
            command_state="denied",
            approved_by="b",
            command_reason='{"error": "no"}',
        ),
        NOW,
    ),
    "outcome, expired": lambda: outcome_box(_charge(state="expired"), NOW),
    "evidence, none": lambda: evidence_list(None),
    "evidence, empty": lambda: evidence_list({"evidence": []}),
    "decision": lambda: decision_page(_viewer(), _DECISION, now=NOW),
    "review": lambda: review_page(_viewer(), "review-run-1-1", prompt="Vérifier les totaux"),
    "message": lambda: message_page("Title", "text", _viewer()),
    "run": lambda: run_page(
        _viewer(roles=("auditor",)),
        {
            **_RUN,
            "answer": "Fait.",
            "pending_id": "pend-1",
            "actions": [
                {
                    "action": "payment.charge.create",
                    "operation_id": "op-1",
                    "state": "done",
                    "outcome": "succeeded",
                }
            ],
        },
        [{"seq": 1, "kind": "tool", "summary": "lu"}],
        journals={"ok": True, "journals": []},
        replay={"verdict": "ok", "entries": 1},
    ),
    "trail, unproven": lambda: trail_section({"proposal": _charge(), "journals": []}, h),
    "trail, journaled": lambda: trail_section(_JOURNALED, h),
    "trail, approver differs": lambda: trail_section(
        {**_JOURNALED, "proposal": _charge(state="completed", approved_by="y@acme.example")}, h
    ),
    "sign-in refused": lambda: message_page(
        t("sign_in_refused"), ConsoleRefused("refused_link_expired", minutes="10").reason
    ),
    "mcp, servers": lambda: index_page(
        _viewer(roles=_OPERATOR),
        RegisteredServers(
            servers=[RegisteredServer(name="crm", transport="stdio", exposed=["find"])]
        ),
    ),
    "mcp, no server": lambda: index_page(_viewer(roles=_OPERATOR), RegisteredServers()),
    "mcp, a server": lambda: server_page(_viewer(roles=_OPERATOR), "crm", _LISTING),
    "mcp, a changed tool": lambda: tool_page(_viewer(roles=_OPERATOR), "crm", "find", _LISTING),
    "mcp, a tool no longer listed": lambda: tool_page(
        _viewer(roles=_OPERATOR),
        "crm",
        "gone",
        ServerListing(ok=True, digest="c" * 64, classified=_LISTING.classified),
        answered=t("mcp_digest_changed"),
    ),
}


class _Text(HTMLParser):
    """What a person reads on a page: its text, and the words attributes say aloud."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.parts.extend(v or "" for k, v in attrs if k in ("aria-label", "title", "alt"))


def _read(page: str) -> str:
    reader = _Text()
    reader.feed(page)
    return " ".join(reader.parts)


def _said(piece: str, text: str) -> bool:
    """Whether `piece` stands as words in `text` (not inside a word or an id like review-1)."""
    return re.search(rf"(?<![\w-]){re.escape(piece)}(?![\w-])", text) is not None


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def _english_only() -> set[str]:
    """Every piece of English text the catalog holds that its French does not say."""
    pieces: set[str] = set()
    for msg in CATALOG.values():
        if msg.en == msg.fr:
            continue
        for literal, *_ in string.Formatter().parse(msg.en):
            piece = literal.strip(" ;:.,()—-")
            if len(piece) >= 3 and piece not in msg.fr:
                pieces.add(piece)
    pieces.update(en for en, fr in LABELS.items() if en != fr)
    return pieces


def test_every_message_has_both_languages_with_the_same_fields() -> None:
    for key, msg in CATALOG.items():
        assert msg.en.strip() and msg.fr.strip(), key
        assert _fields(msg.en) == _fields(msg.fr), key
    for en, fr in LABELS.items():
        assert en.strip() and fr.strip()


@pytest.mark.parametrize("name", sorted(PAGES))
def test_no_english_is_left_on_the_french_pages(name: str) -> None:
    with rendering("fr"):
        page = PAGES[name]()
    read = _read(page)
    left = sorted(p for p in _english_only() if _said(p, read))
    assert left == [], f"{name}: {left}\n{read}"
    if page.startswith("<!doctype"):
        assert '<html lang="fr">' in page
        assert 'id="lang-en"' in page and 'id="lang-fr"' not in page


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_english_pages_speak_english(name: str) -> None:
    with rendering("en"):
        page = PAGES[name]()
    if page.startswith("<!doctype"):
        assert '<html lang="en">' in page and 'id="lang-fr"' in page
    french = [msg.fr for msg in CATALOG.values() if msg.fr != msg.en and "{" not in msg.fr]
    assert [f for f in french if _said(f, _read(page))] == []


def test_the_french_proposal_writes_the_amount_and_the_time_the_french_way() -> None:
    with rendering("fr"):
        page = proposal_page(_viewer(), _charge(), now=NOW)
    assert f'data-field="Amount to charge">49,00{NBSP}€<' in page
    assert "Montant à débiter" in page and "49.00 EUR" not in page
    assert "2 déc. 2026 à 12:00:00 (UTC)" in page
    with rendering("en"):
        page = proposal_page(_viewer(), _charge(), now=NOW)
    assert 'data-field="Amount to charge">49.00 EUR<' in page


@pytest.mark.parametrize(
    ("written", "french"),
    [
        ("49.00 EUR", f"49,00{NBSP}€"),
        ("1,234,567.89 EUR", f"1{NNBSP}234{NNBSP}567,89{NBSP}€"),
        ("-15.00 USD", f"-15,00{NBSP}$US"),
        ("300.00 JPY", f"300,00{NBSP}JPY"),
        ("card ending 4242", "card ending 4242"),
        ("12.5 EUR", "12.5 EUR"),
    ],
)
def test_amounts_in_french(written: str, french: str) -> None:
    with rendering("fr"):
        assert amount(written) == french
    with rendering("en"):
        assert amount(written) == written


def test_times_and_labels_in_french() -> None:
    with rendering("fr"):
        assert stamp("2026-08-01T07:05:09+02:00") == "1 août 2026 à 05:05:09 (UTC)"
        assert stamp("not a time") == "not a time"
        assert caption("Amount to refund") == "Montant à rembourser"
        assert caption("Priority") == "Priority"  # a label the catalog lacks: as written


@pytest.mark.parametrize(
    ("cookie", "header", "chosen"),
    [
        (None, None, "en"),
        (None, "fr-CA,fr;q=0.9,en;q=0.8", "fr"),
        (None, "en-US,fr;q=0.9", "en"),
        (None, "de-DE,fr;q=0.5,en;q=0.4", "fr"),
        (None, "de", "en"),
        (None, "fr;q=0", "en"),
        (None, "fr;q=abc,en", "en"),
        ("fr", "en-US", "fr"),
        ("en", "fr", "en"),
        ("xx", "fr", "fr"),
        (None, "fr" + ",x" * 10_000, "fr"),
    ],
)
def test_the_switch_wins_then_accept_language_then_english(
    cookie: str | None, header: str | None, chosen: str
) -> None:
    assert negotiate(cookie, header) == chosen
