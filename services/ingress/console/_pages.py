"""The console's HTML, rendered on the server from what the API answered. Every value is
escaped; no page has inline script or style (the Content-Security-Policy forbids both)."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from actions import ACTIONS
from services.ingress.console._i18n import (
    CATALOG,
    LOCALES,
    caption,
    current,
    here,
    said,
    shown,
    stamp,
    t,
)
from services.ingress.console._operators import OPERATOR_ROLE
from services.ingress.console._session import Viewer
from services.ingress.console._trail import trail_section
from services.ingress.logic import APPROVER_ROLE

__all__ = [
    "FINAL_COMMAND",
    "ago",
    "csrf_field",
    "h",
    "evidence_list",
    "inbox_page",
    "inbox_rows",
    "layout",
    "message_page",
    "outcome_box",
    "proposal_final",
    "proposal_page",
    "outcome_said",
    "summary",
    "time_left",
    "when",
]

# A command in one of these states has its outcome: the page stops following it.
FINAL_COMMAND: Final = frozenset(
    {"succeeded", "failed", "denied", "expired", "revision_required", "unknown"}
)
_OUTCOME: Final = {
    "succeeded": "succeeded",
    "unknown": "needs_reconciliation",
    "revision_required": "revision_required",
    "denied": "denied",
    "expired": "expired",
    "failed": "terminal_failure",
    "pending": "pending",
    "dispatching": "pending",
}


def h(value: Any) -> str:
    """Escaped text."""
    return html.escape("" if value is None else str(value), quote=True)


def when(iso: str | None) -> datetime | None:
    """An ISO time as an aware datetime (None: none, or not a time)."""
    if not iso:
        return None
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _span(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def ago(iso: str | None, now: datetime) -> str:
    """How long ago."""
    moment = when(iso)
    return "" if moment is None else _span(max(0.0, (now - moment).total_seconds()))


def time_left(iso: str | None, now: datetime) -> str:
    """Time left before an expiry ("expired" once it passed, "no expiry" without one)."""
    moment = when(iso)
    if moment is None:
        return t("no_expiry")
    left = (moment - now).total_seconds()
    return t("expired") if left <= 0 else _span(left)


def _pages_nav(viewer: Viewer) -> str:
    """The console's pages this viewer may open (the spend page: approvers), the one shown
    marked current."""
    if OPERATOR_ROLE in viewer.roles:
        return ""  # an operator's console is the MCP pages alone
    pages = [("/console/", t("nav_inbox"), "nav-inbox")]
    if APPROVER_ROLE in viewer.roles:
        pages.append(("/console/spend", t("nav_spend"), "nav-spend"))
    path = here().split("?", 1)[0].rstrip("/")
    current_page = ' aria-current="page"'
    links = "".join(
        f'<a href="{href}" id="{key}"{current_page if href.rstrip("/") == path else ""}>{label}</a>'
        for href, label, key in pages
    )
    return f'<nav class="pages" aria-label="{t("pages_nav")}">{links}</nav>'


def layout(title: str, body: str, viewer: Viewer | None = None) -> str:
    """A whole page."""
    who = nav = ""
    if viewer is not None:
        nav = _pages_nav(viewer)
        roles = ", ".join(sorted(viewer.roles))
        who = (
            f'<span class="who" id="who">{h(viewer.principal)} · {h(viewer.tenant)} · '
            f'{h(roles)}</span><form method="post" action="/console/sign-out" '
            f'class="inline">{csrf_field(viewer)}<button type="submit">{t("sign_out")}'
            "</button></form>"
        )
    lang = current()
    # The switch: each other language, by its own name, setting the cookie that keeps it.
    switch = "".join(
        f'<a href="/console/lang/{other}?{h(urlencode({"back": here()}))}" hreflang="{other}" '
        f'lang="{other}" id="lang-{other}">{_NAMES[other]}</a>'
        for other in LOCALES
        if other != lang
    )
    return (
        f'<!doctype html><html lang="{lang}"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)} · {t('site')}</title>"
        f'<link rel="stylesheet" href="/console/static/console.css">'
        f'<script src="/console/static/console.js" defer></script></head><body>'
        f'<header><a href="/console/" class="brand">{t("brand")}</a>{nav}'
        f'<nav class="lang" aria-label="{t("language")}">{switch}</nav>{who}</header>'
        f"<main>{body}</main></body></html>"
    )


_NAMES: Final = {"en": "English", "fr": "Français"}


def csrf_field(viewer: Viewer) -> str:
    """The form's CSRF token, as a hidden field."""
    return f'<input type="hidden" name="csrf" value="{h(viewer.csrf)}">'


def message_page(title: str, text: str, viewer: Viewer | None = None) -> str:
    """A page that only says something (a refusal, a sign-in problem, not found)."""
    return layout(
        title, f'<h1>{h(title)}</h1><p class="message" id="message">{h(text)}</p>', viewer
    )


def count_line(counts: dict[str, int | None]) -> str:
    """How much waits, by kind, as the inbox's heading line says it."""
    count = ", ".join(f"{n} {t('kind_' + k)}" for k, n in counts.items() if n is not None)
    return t("waiting", count=count or t("nothing"))


def inbox_rows(
    items: list[dict[str, Any]], now: datetime, counts: dict[str, int | None] | None = None
) -> str:
    """The inbox's rows (the page polls them), led by the count they are part of, for the
    page to update its count line with (an inert `<template>`)."""
    lead = (
        f'<template id="inbox-count-now" data-count="{h(count_line(counts))}"></template>'
        if counts is not None
        else ""
    )
    if not items:
        return lead + f'<tr class="empty"><td colspan="6">{t("nothing_waiting")}</td></tr>'
    rows = [lead]
    for item in items:
        rows.append(
            f'<tr data-kind="{h(item["kind"])}" data-id="{h(item["id"])}">'
            f"<td>{h(_kind(item['kind']))}</td><td>{h(item['agent'])}</td>"
            f'<td><a href="{h(item["href"])}">{h(item["what"])}</a></td>'
            f"<td>{h(item['requester'])}</td><td>{h(ago(item['created_at'], now))}</td>"
            f'<td class="left">{h(time_left(item["expires_at"], now))}</td></tr>'
        )
    return "".join(rows)


def inbox_page(
    viewer: Viewer,
    items: list[dict[str, Any]],
    *,
    filters: dict[str, Any],
    agents: list[str],
    actions: list[str],
    counts: dict[str, int | None],
    next_cursor: str | None,
    problems: list[str],
    now: datetime,
    more_decisions: bool = False,
) -> str:
    """What waits for the viewer, newest first: counted, filtered, a page at a time."""
    kind, agent, action = filters["kind"], filters["agent"], filters["action"]
    kinds = "".join(
        f'<option value="{k}"{" selected" if k == kind else ""}>{label}</option>'
        for k, label in (
            ("", t("kind_all")),
            ("proposal", t("kind_proposal")),
            ("decision", t("kind_decision")),
            ("review", t("kind_review")),
        )
    )
    agent_options = f'<option value="">{t("all_agents")}</option>' + "".join(
        f'<option value="{h(a)}"{" selected" if a == agent else ""}>{h(a)}</option>'
        for a in sorted({*agents, *([agent] if agent else [])})
    )
    action_options = f'<option value="">{t("all_actions")}</option>' + "".join(
        f'<option value="{h(a)}"{" selected" if a == action else ""}>{h(a)}</option>'
        for a in actions
    )
    query = {k: v for k, v in filters.items() if v and k != "cursor"}
    src = "/console/inbox/rows?" + h(urlencode({**query, "cursor": filters["cursor"]}))
    notes = "".join(f'<p class="problem">{h(p)}</p>' for p in problems)
    if "auditor" in viewer.roles:
        notes += (
            '<form method="get" action="/console/runs" class="find-run" id="find-run">'
            f'<label>{t("open_run")} <input name="run_id" id="run-id" maxlength="128" '
            f'required></label><button type="submit">{t("open")}</button></form>'
        )
    older = t("older_decisions") if kind == "decision" else t("older_proposals")
    paging = (
        f'<a id="next-page" href="/console/?{h(urlencode({**query, "cursor": next_cursor}))}">'
        f"{older}</a>"
        if next_cursor
        else ""
    )
    if more_decisions:
        every = urlencode({**query, "kind": "decision"})
        paging += (
            f' <a id="all-decisions" href="/console/?{h(every)}">'
            f"{h(t('all_decisions', n=counts.get('decision')))}</a>"
        )
    if filters["cursor"]:
        paging = (
            f'<a id="first-page" href="/console/?{h(urlencode(query))}">{t("newest")}</a> ' + paging
        )
    body = (
        f'<h1>{t("inbox")}</h1>{notes}<p id="inbox-count" aria-live="polite">'
        f"{h(count_line(counts))}</p>"
        '<form method="get" action="/console/" class="filters">'
        f'<label>{t("kind")} <select name="kind" id="kind">{kinds}</select></label>'
        f'<label>{t("agent")} <select name="agent" id="agent">{agent_options}</select></label>'
        f'<label>{t("action")} <select name="action" id="action">{action_options}</select>'
        f'</label><label>{t("requester")} <input name="requester" id="requester" '
        f'maxlength="256" value="{h(filters["requester"])}"></label>'
        f'<label>{t("older_than")} <input name="older_than_min" id="older-than" '
        f'inputmode="numeric" pattern="[0-9]*" maxlength="6" '
        f'value="{h(filters["older_than_min"] or "")}"></label>'
        f'<button type="submit" id="filter">{t("filter")}</button></form>'
        f'<table class="inbox"><thead><tr><th>{t("kind")}</th><th>{t("agent")}</th>'
        f"<th>{t('action_or_tool')}</th><th>{t('requester')}</th><th>{t('age')}</th>"
        f"<th>{t('time_left')}</th></tr></thead>"
        f'<tbody id="inbox-rows" data-poll="{src}">{inbox_rows(items, now, counts)}</tbody>'
        f'</table><nav class="paging" aria-label="{t("pages")}">{paging}</nav>'
    )
    return layout(t("inbox"), body, viewer)


def _kind(kind: str) -> str:
    return t("row_" + kind) if kind in ("proposal", "decision", "review") else kind


def _preview_lines(action: str, preview: dict[str, Any]) -> str:
    contract = ACTIONS.get(action)
    try:
        if contract is None:
            raise ValueError(action)
        lines = contract.describe(contract.decode_preview(preview))
    except (ValueError, msgspec.ValidationError):
        return f'<p class="problem">{h(t("preview_mismatch", action=action))}</p>'
    # `data-field` keeps the contract's own label: the same in every language.
    rows = "".join(
        f'<tr><th scope="row">{h(caption(name))}</th><td data-field="{h(name)}">'
        f"{h(shown(text))}</td></tr>"
        for name, text in lines
    )
    return f'<table class="preview" id="preview">{rows}</table>'


def proposal_final(p: dict[str, Any]) -> bool:
    """Whether the proposal has its outcome (nothing more will change)."""
    if p["state"] in ("rejected", "expired", "completed"):
        return True
    return p["state"] == "executing" and p.get("command_state") in FINAL_COMMAND


def outcome_box(p: dict[str, Any], now: datetime) -> str:
    """Where the proposal stands; the page follows it until it is final."""
    state, command = p["state"], p.get("command_state")
    if state == "pending":
        left = time_left(p.get("expires_at"), now)
        text = (
            t("waiting_expired") if left == t("expired") else t("waiting_for_approver", left=left)
        )
    elif state in ("executing", "completed"):
        outcome = _OUTCOME.get(command or "pending", command or "pending")
        text = t("approved_outcome", who=p.get("approved_by") or "?", outcome=outcome_said(outcome))
        if p.get("receipt"):
            text += t("receipt", receipt=p["receipt"])
        if outcome == "needs_reconciliation":
            text += t("reconcile")
        elif outcome == "terminal_failure":
            text += t("terminal", id=p.get("operation_id") or "?")
        elif p.get("command_reason") and command in FINAL_COMMAND - {"succeeded"}:
            text += f": {summary(p['command_reason'])}"
    elif state == "expired":
        text = t("cannot_approve")
    else:
        text = (
            t("state_because", state=_state(state), reason=said(None, p["reason"]))
            if p.get("reason")
            else _state(state)
        )
    final = "true" if proposal_final(p) else "false"
    # The colour follows the typed outcome (or, before there is one, the proposal's state):
    # a revision required is not a success because its proposal was approved.
    kind = (
        _OUTCOME.get(command or "pending", "pending")
        if state in ("executing", "completed")
        else {"pending": "waiting"}.get(state, state)
    )
    return (
        f'<div id="outcome" class="outcome state-{h(state)} outcome-{h(kind)}" '
        f'data-outcome="{h(kind)}" data-final="{final}" '
        f'data-poll="/console/proposals/{h(p["proposal_id"])}/outcome">'
        f'<strong>{h(_state(state))}</strong> — <span id="outcome-text">{h(text)}</span></div>'
    )


def outcome_said(outcome: str) -> str:
    """An outcome in words: English keeps the typed name the API gives."""
    key = "oc_" + outcome
    return outcome if current() == "en" or key not in CATALOG else t(key)


def _state(state: str) -> str:
    key = "st_" + state
    return state if current() == "en" or key not in CATALOG else t(key)


def summary(reason: str) -> str:
    """A command's recorded reason as a person reads it: a host's raw error body (JSON, or
    more than a line) is summarised, never dumped; the operators' records keep it whole."""
    text = reason.strip()
    if text[:1] in ("{", "[") or "\n" in text or len(text) > 200:
        return t("refused_summary")
    return text


def _decision_text(p: dict[str, Any]) -> str:
    text = str(p.get("decision_id") or "")
    if p.get("decision_line") is not None:
        text += t("line_of_decide", line=p["decision_line"])
    if p.get("policy_version"):
        text += t("policy", version=p["policy_version"])
    return text


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return " | ".join(_plain(v) for v in value) or t("none")
    if isinstance(value, dict):
        return "; ".join(f"{str(k).replace('_', ' ')}: {_plain(v)}" for k, v in value.items())
    return t("none") if value is None else str(value)


def _facts(p: dict[str, Any]) -> str:
    """The state the preview was computed from, as read then (not now)."""
    facts = p.get("facts")
    if not isinstance(facts, dict):
        return f'<h2>{t("what_it_stands_on")}</h2><p id="facts-read">{t("reads_nothing")}</p>'
    rows = "".join(
        f'<tr><th scope="row">{h(str(k).replace("_", " "))}</th><td>{h(_plain(v))}</td></tr>'
        for k, v in facts.items()
    )
    return (
        f'<h2>{t("what_it_stands_on")}</h2><p id="facts-read">'
        f"{h(t('read_at', at=stamp(p.get('facts_read_at'))))}</p>"
        f'<table class="facts" id="facts">{rows}</table>'
    )


def proposal_page(
    viewer: Viewer,
    p: dict[str, Any],
    *,
    now: datetime,
    answered: str = "",
    run: dict[str, Any] | None = None,
    options: list[str] | None = None,
    trail: dict[str, Any] | None = None,
) -> str:
    """One proposal: what approving it does, in words; what it stands on; its trail, checked
    against the journals; the answer.

    `options`: what its pending decision offers. "Always" is offered only here, beside the
    preview, and only where the decision offers it (never for money, access or sending
    outside)."""
    pid = h(p["proposal_id"])
    own = p.get("requester") == viewer.principal
    expired = p["state"] == "expired" or (
        p["state"] == "pending" and time_left(p.get("expires_at"), now) == t("expired")
    )
    parts = [f"<h1>{h(p['action'])}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered">{h(answered)}</p>')
    parts.append(outcome_box(p, now))
    needed, approvals = int(p.get("approvals_needed") or 1), list(p.get("approvals") or [])
    if needed > 1 and p["state"] == "pending":
        parts.append(
            f'<p class="notice" id="approvals">'
            f"{h(t('approvals_of', n=len(approvals), needed=needed))}"
            + (h(t("approvals_by", who=", ".join(approvals))) if approvals else "")
            + f"{h(t('four_eyes', needed=needed))}</p>"
            + _approvals_given(p)
        )
    # The page's script says each change of the outcome here (the box itself is replaced).
    parts.append('<p id="announce" class="visually-hidden" role="status" aria-live="polite"></p>')
    parts.append(f"<h2>{t('what_approving_does')}</h2>")
    if p.get("payload") == "expired":
        # Erased by the retention policy or an erasure: said so, never shown as empty.
        parts.append(f'<p class="problem" id="preview">{h(t("payload_expired"))}</p>')
    else:
        parts.append(_preview_lines(p["action"], p["preview"]))
    parts.append(
        f'<h2>{t("where_from")}</h2><table class="facts">'
        f'<tr><th scope="row">{t("proposal")}</th><td id="proposal-id">{pid}</td></tr>'
        f'<tr><th scope="row">{t("request_hash")}</th><td id="request-hash"><code>'
        f"{h(p['request_hash'])}</code></td></tr>"
        f'<tr><th scope="row">{t("agent")}</th><td>{h(p.get("agent"))}</td></tr>'
        f'<tr><th scope="row">{t("requested_by")}</th><td id="requester">'
        f"{h(p.get('requester'))}</td></tr>"
        f'<tr><th scope="row">{t("proposed")}</th><td>{h(stamp(p.get("created_at")))} '
        f"({h(t('ago', span=ago(p.get('created_at'), now)))})</td></tr>"
        f'<tr><th scope="row">{t("expires")}</th><td id="expires">'
        f"{h(stamp(p.get('expires_at')))} ({h(time_left(p.get('expires_at'), now))})</td></tr>"
        f'<tr><th scope="row">{t("decision_that_asked")}</th><td id="decision">'
        f"{h(_decision_text(p))}</td></tr>"
        + (
            f'<tr><th scope="row">{t("approved")}</th><td id="approved">'
            f"{h(t('approved_by_at', who=p.get('approved_by'), at=stamp(p.get('approved_at'))))}"
            "</td></tr>"
            if p.get("approved_by")
            else ""
        )
        + f'<tr><th scope="row">{t("run")}</th><td>'
        # A host's own command has no run of an agent to open: no link that leads nowhere.
        + (
            f'<a id="run-link" href="/console/runs/{h(p["run_id"])}">{h(p["run_id"])}</a>'
            if run is not None
            else f'<span id="run-link">{h(t("host_command_no_run"))}</span>'
        )
        + "</td></tr></table>"
    )
    parts.append(_facts(p))
    parts.append(trail_section(trail, h))
    if run is not None:
        parts.append(f'<p id="run-state">{h(t("run_is", status=run["status"]))}</p>')
    parts.append(evidence_list(run))
    if p["state"] == "pending" or expired:
        parts.append(_answers(viewer, p, own=own, expired=expired, options=options))
    return layout(t("proposal_title", action=p["action"]), "".join(parts), viewer)


def _approvals_given(p: dict[str, Any]) -> str:
    """Every approval given so far: those that count, and those that no longer do, struck
    through with why (from the code, in the page's language)."""
    given = list(p.get("approvals_given") or [])
    if not any(not a.get("counts", True) for a in given):
        return ""  # the sentence above names every approval given
    items = "".join(
        f'<li data-approver="{h(a["approver"])}" data-counts="true">'
        f"{h(a['approver'])} — {h(t('approval_counts'))}</li>"
        if a.get("counts", True)
        else f'<li data-approver="{h(a["approver"])}" data-counts="false">'
        f"<del>{h(a['approver'])}</del> — "
        f"{h(t('approval_void', why=said(a.get('code'), a.get('reason'))))}</li>"
        for a in given
    )
    return f'<ul class="approvals" id="approvals-given">{items}</ul>'


def _answers(
    viewer: Viewer, p: dict[str, Any], *, own: bool, expired: bool, options: list[str] | None
) -> str:
    """The forms that answer a pending proposal (or why the viewer has none)."""
    pid = h(p["proposal_id"])
    if "approver" not in viewer.roles:
        return f'<p class="notice">{t("only_approvers")}</p>'
    if expired:
        return f'<p class="notice" id="expired">{t("proposal_expired")}</p>'
    parts = []
    if own:
        parts.append(f'<p class="notice" id="own-request">{t("own_request")}</p>')
    elif viewer.principal in list(p.get("approvals") or []):
        parts.append(f'<p class="notice" id="own-approval">{t("own_approval")}</p>')
    else:
        family = ACTIONS[p["action"]].family if p["action"] in ACTIONS else ""
        always = (
            '<button type="submit" name="grant" value="always" id="approve-always">'
            f"{h(t('approve_always', family=family))}</button>"
            if "always" in (options or [])
            else ""
        )
        parts.append(
            f'<form method="post" action="/console/proposals/{pid}/approve" '
            f'class="answer" data-once="true">{csrf_field(viewer)}'
            f'<button type="submit" name="grant" value="once" id="approve">'
            f"{t('approve_once')}</button>{always}</form>"
        )
    parts.append(
        f'<form method="post" action="/console/proposals/{pid}/reject" '
        f'class="answer" data-once="true">{csrf_field(viewer)}'
        f'<label>{t("reason_required")} <textarea name="reason" id="reason" required '
        f'maxlength="500"></textarea></label>'
        f'<button type="submit" id="reject">{t("reject")}</button></form>'
        f'<form method="post" action="/console/proposals/{pid}/revise" '
        f'class="answer" data-once="true">{csrf_field(viewer)}'
        f"<label>{t('what_to_change')} "
        f'<textarea name="reason" id="revise-reason" required maxlength="500">'
        f"</textarea></label>"
        f'<button type="submit" id="revise">{t("ask_revision")}</button></form>'
    )
    return "".join(parts)


def evidence_list(run: dict[str, Any] | None) -> str:
    """The documents the run was given, marked untrusted (titles only)."""
    if run is None:
        return f'<h2>{t("evidence")}</h2><p id="evidence">{h(t("no_run_evidence"))}</p>'
    items = "".join(
        f"<li>{h(e['title'])} <small>({h(e['kind'])} {h(e['document_id'])}, "
        f"{h(e.get('trust') or t('untrusted'))})</small></li>"
        for e in run.get("evidence") or []
    )
    items = items or f"<li>{t('none')}</li>"
    return f'<h2>{t("evidence")}</h2><ul id="evidence">{items}</ul>'
