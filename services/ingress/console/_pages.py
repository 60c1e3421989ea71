"""The console's HTML, rendered on the server from what the API answered. Every value is
escaped; no page has inline script or style (the Content-Security-Policy forbids both)."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from actions import ACTIONS
from services.ingress.console._session import Viewer
from services.ingress.console._trail import trail_section

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
    "run_page",
    "run_status",
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
        return "no expiry"
    left = (moment - now).total_seconds()
    return "expired" if left <= 0 else _span(left)


def layout(title: str, body: str, viewer: Viewer | None = None) -> str:
    """A whole page."""
    who = ""
    if viewer is not None:
        roles = ", ".join(sorted(viewer.roles))
        who = (
            f'<span class="who" id="who">{h(viewer.principal)} · {h(viewer.tenant)} · '
            f'{h(roles)}</span><form method="post" action="/console/sign-out" '
            f'class="inline">{csrf_field(viewer)}<button type="submit">Sign out</button></form>'
        )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{h(title)} · Writ console</title>"
        f'<link rel="stylesheet" href="/console/static/console.css">'
        f'<script src="/console/static/console.js" defer></script></head><body>'
        f'<header><a href="/console/" class="brand">Writ · approvals</a>{who}</header>'
        f"<main>{body}</main></body></html>"
    )


def csrf_field(viewer: Viewer) -> str:
    """The form's CSRF token, as a hidden field."""
    return f'<input type="hidden" name="csrf" value="{h(viewer.csrf)}">'


def message_page(title: str, text: str, viewer: Viewer | None = None) -> str:
    """A page that only says something (a refusal, a sign-in problem, not found)."""
    return layout(
        title, f'<h1>{h(title)}</h1><p class="message" id="message">{h(text)}</p>', viewer
    )


def inbox_rows(items: list[dict[str, Any]], now: datetime) -> str:
    """The inbox's rows (the page polls them)."""
    if not items:
        return '<tr class="empty"><td colspan="6">Nothing is waiting for you.</td></tr>'
    rows = []
    for item in items:
        rows.append(
            f'<tr data-kind="{h(item["kind"])}" data-id="{h(item["id"])}">'
            f"<td>{h(item['kind'])}</td><td>{h(item['agent'])}</td>"
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
            ("", "everything"),
            ("proposal", "proposals"),
            ("decision", "decisions"),
            ("review", "reviews"),
        )
    )
    agent_options = '<option value="">all agents</option>' + "".join(
        f'<option value="{h(a)}"{" selected" if a == agent else ""}>{h(a)}</option>'
        for a in sorted({*agents, *([agent] if agent else [])})
    )
    action_options = '<option value="">all actions</option>' + "".join(
        f'<option value="{h(a)}"{" selected" if a == action else ""}>{h(a)}</option>'
        for a in actions
    )
    query = {k: v for k, v in filters.items() if v and k != "cursor"}
    src = "/console/inbox/rows?" + h(urlencode({**query, "cursor": filters["cursor"]}))
    notes = "".join(f'<p class="problem">{h(p)}</p>' for p in problems)
    if "auditor" in viewer.roles:
        notes += (
            '<form method="get" action="/console/runs" class="find-run" id="find-run">'
            '<label>Open a run <input name="run_id" id="run-id" maxlength="128" '
            'required></label><button type="submit">Open</button></form>'
        )
    said = {"proposal": "proposals", "decision": "decisions", "review": "reviews"}
    count = ", ".join(f"{n} {said[k]}" for k, n in counts.items() if n is not None)
    older = "Older decisions" if kind == "decision" else "Older proposals"
    paging = (
        f'<a id="next-page" href="/console/?{h(urlencode({**query, "cursor": next_cursor}))}">'
        f"{older}</a>"
        if next_cursor
        else ""
    )
    if more_decisions:
        every = urlencode({**query, "kind": "decision"})
        paging += (
            f' <a id="all-decisions" href="/console/?{h(every)}">All '
            f"{h(counts.get('decision'))} decisions</a>"
        )
    if filters["cursor"]:
        paging = f'<a id="first-page" href="/console/?{h(urlencode(query))}">Newest</a> ' + paging
    body = (
        f'<h1>Inbox</h1>{notes}<p id="inbox-count" aria-live="polite">Waiting: '
        f"{h(count or 'nothing')}</p>"
        '<form method="get" action="/console/" class="filters">'
        f'<label>Kind <select name="kind" id="kind">{kinds}</select></label>'
        f'<label>Agent <select name="agent" id="agent">{agent_options}</select></label>'
        f'<label>Action <select name="action" id="action">{action_options}</select></label>'
        f'<label>Requester <input name="requester" id="requester" maxlength="256" '
        f'value="{h(filters["requester"])}"></label>'
        f'<label>Older than (minutes) <input name="older_than_min" id="older-than" '
        f'inputmode="numeric" pattern="[0-9]*" maxlength="6" '
        f'value="{h(filters["older_than_min"] or "")}"></label>'
        f'<button type="submit" id="filter">Filter</button></form>'
        f'<table class="inbox"><thead><tr><th>Kind</th><th>Agent</th><th>Action or tool'
        f"</th><th>Requester</th><th>Age</th><th>Time left</th></tr></thead>"
        f'<tbody id="inbox-rows" data-poll="{src}">{inbox_rows(items, now)}</tbody>'
        f'</table><nav class="paging" aria-label="Pages">{paging}</nav>'
    )
    return layout("Inbox", body, viewer)


def _preview_lines(action: str, preview: dict[str, Any]) -> str:
    contract = ACTIONS.get(action)
    try:
        if contract is None:
            raise ValueError(action)
        lines = contract.describe(contract.decode_preview(preview))
    except (ValueError, msgspec.ValidationError):
        return (
            '<p class="problem">This proposal\'s preview does not match the contract '
            f"{h(action)} as this console knows it; it cannot be shown.</p>"
        )
    rows = "".join(
        f'<tr><th scope="row">{h(label)}</th><td data-field="{h(label)}">{h(value)}</td></tr>'
        for label, value in lines
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
            "expired: it can no longer be approved; the agent must propose it again"
            if left == "expired"
            else f"waiting for an approver ({left} left)"
        )
    elif state in ("executing", "completed"):
        outcome = _OUTCOME.get(command or "pending", command or "pending")
        text = f"approved by {p.get('approved_by') or '?'}; outcome: {outcome}"
        if p.get("receipt"):
            text += f" (receipt {p['receipt']})"
        if outcome == "needs_reconciliation":
            text += "; nobody knows yet whether it happened: an operator reconciles it"
        elif outcome == "terminal_failure":
            text += (
                "; it will not be retried: quote the correlation id "
                f"{p.get('operation_id') or '?'} to an operator"
            )
        elif p.get("command_reason") and command in FINAL_COMMAND - {"succeeded"}:
            text += f": {summary(p['command_reason'])}"
    elif state == "expired":
        text = "it can no longer be approved; the agent must propose it again"
    else:
        text = f"{state}" + (f": {p['reason']}" if p.get("reason") else "")
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
        f'<strong>{h(state)}</strong> — <span id="outcome-text">{h(text)}</span></div>'
    )


def summary(reason: str) -> str:
    """A command's recorded reason as a person reads it: a host's raw error body (JSON, or
    more than a line) is summarised, never dumped; the operators' records keep it whole."""
    text = reason.strip()
    if text[:1] in ("{", "[") or "\n" in text or len(text) > 200:
        return "the system of record refused it (its answer is in the operators' records)"
    return text


def _decision_text(p: dict[str, Any]) -> str:
    text = str(p.get("decision_id") or "")
    if p.get("decision_line") is not None:
        text += f" — line {p['decision_line']} of decide"
    if p.get("policy_version"):
        text += f", policy {p['policy_version']}"
    return text


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return " | ".join(_plain(v) for v in value) or "none"
    if isinstance(value, dict):
        return "; ".join(f"{str(k).replace('_', ' ')}: {_plain(v)}" for k, v in value.items())
    return "none" if value is None else str(value)


def _facts(p: dict[str, Any]) -> str:
    """The state the preview was computed from, as read then (not now)."""
    facts = p.get("facts")
    if not isinstance(facts, dict):
        return (
            '<h2>What it stands on</h2><p id="facts-read">This action reads no outside '
            "state: the preview is its arguments.</p>"
        )
    rows = "".join(
        f'<tr><th scope="row">{h(str(k).replace("_", " "))}</th><td>{h(_plain(v))}</td></tr>'
        for k, v in facts.items()
    )
    return (
        f'<h2>What it stands on</h2><p id="facts-read">Read at '
        f"{h(p.get('facts_read_at'))}; the dispatcher reads it again before executing and "
        f'stops if anything shown changed.</p><table class="facts" id="facts">{rows}'
        "</table>"
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
        p["state"] == "pending" and time_left(p.get("expires_at"), now) == "expired"
    )
    parts = [f"<h1>{h(p['action'])}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered">{h(answered)}</p>')
    parts.append(outcome_box(p, now))
    needed, approvals = int(p.get("approvals_needed") or 1), list(p.get("approvals") or [])
    if needed > 1 and p["state"] == "pending":
        parts.append(
            f'<p class="notice" id="approvals">{len(approvals)} of {needed} approvals'
            + (f" (by {h(', '.join(approvals))})" if approvals else "")
            + f": four eyes, {needed} distinct approvers, neither of them the requester.</p>"
        )
    # The page's script says each change of the outcome here (the box itself is replaced).
    parts.append('<p id="announce" class="visually-hidden" role="status" aria-live="polite"></p>')
    parts.append("<h2>What approving it does</h2>")
    parts.append(_preview_lines(p["action"], p["preview"]))
    parts.append(
        '<h2>Where it comes from</h2><table class="facts">'
        f'<tr><th scope="row">Proposal</th><td id="proposal-id">{pid}</td></tr>'
        f'<tr><th scope="row">Request hash</th><td id="request-hash"><code>'
        f"{h(p['request_hash'])}</code></td></tr>"
        f'<tr><th scope="row">Agent</th><td>{h(p.get("agent"))}</td></tr>'
        f'<tr><th scope="row">Requested by</th><td id="requester">{h(p.get("requester"))}'
        f"</td></tr>"
        f'<tr><th scope="row">Proposed</th><td>{h(p.get("created_at"))} '
        f"({h(ago(p.get('created_at'), now))} ago)</td></tr>"
        f'<tr><th scope="row">Expires</th><td id="expires">{h(p.get("expires_at"))} '
        f"({h(time_left(p.get('expires_at'), now))})</td></tr>"
        f'<tr><th scope="row">Decision that asked</th><td id="decision">'
        f"{h(_decision_text(p))}</td></tr>"
        + (
            f'<tr><th scope="row">Approved</th><td id="approved">by '
            f"{h(p.get('approved_by'))} at {h(p.get('approved_at'))}</td></tr>"
            if p.get("approved_by")
            else ""
        )
        + f'<tr><th scope="row">Run</th><td><a id="run-link" href="/console/runs/'
        f'{h(p["run_id"])}">{h(p["run_id"])}</a></td></tr></table>'
    )
    parts.append(_facts(p))
    parts.append(trail_section(trail, h))
    if run is not None:
        parts.append(f'<p id="run-state">The run is {h(run["status"])}.</p>')
    parts.append(evidence_list(run))
    if p["state"] == "pending" or expired:
        if "approver" not in viewer.roles:
            parts.append('<p class="notice">Only approvers answer proposals.</p>')
        elif expired:
            parts.append(
                '<p class="notice" id="expired">This proposal expired: it can no '
                "longer be approved.</p>"
            )
        else:
            if own:
                parts.append(
                    '<p class="notice" id="own-request">You requested this run: '
                    "separation of duties says another approver must approve it. "
                    "Writ refuses your approval; you may still reject it.</p>"
                )
            elif viewer.principal in approvals:
                parts.append(
                    '<p class="notice" id="own-approval">You approved it: another approver '
                    "must approve it too.</p>"
                )
            else:
                always = (
                    '<button type="submit" name="grant" value="always" id="approve-always">'
                    "Approve, and always allow this agent's "
                    f"{h(ACTIONS[p['action']].family if p['action'] in ACTIONS else '')} "
                    "calls</button>"
                    if "always" in (options or [])
                    else ""
                )
                parts.append(
                    f'<form method="post" action="/console/proposals/{pid}/approve" '
                    f'class="answer" data-once="true">{csrf_field(viewer)}'
                    f'<button type="submit" name="grant" value="once" id="approve">'
                    f"Approve exactly this</button>{always}</form>"
                )
            parts.append(
                f'<form method="post" action="/console/proposals/{pid}/reject" '
                f'class="answer" data-once="true">{csrf_field(viewer)}'
                f'<label>Reason (required) <textarea name="reason" id="reason" required '
                f'maxlength="500"></textarea></label>'
                f'<button type="submit" id="reject">Reject</button></form>'
                f'<form method="post" action="/console/proposals/{pid}/revise" '
                f'class="answer" data-once="true">{csrf_field(viewer)}'
                f"<label>What the agent should change (required) "
                f'<textarea name="reason" id="revise-reason" required maxlength="500">'
                f"</textarea></label>"
                f'<button type="submit" id="revise">Ask for a revision</button></form>'
            )
    return layout(f"Proposal {p['action']}", "".join(parts), viewer)


def evidence_list(run: dict[str, Any] | None) -> str:
    """The documents the run was given, marked untrusted (titles only)."""
    if run is None:
        return (
            '<h2>Evidence</h2><p id="evidence">A host\'s own command: no run of an agent, '
            "no evidence.</p>"
        )
    items = "".join(
        f"<li>{h(e['title'])} <small>({h(e['kind'])} {h(e['document_id'])}, "
        f"{h(e.get('trust', 'untrusted'))})</small></li>"
        for e in run.get("evidence") or []
    )
    return f'<h2>Evidence</h2><ul id="evidence">{items or "<li>none</li>"}</ul>'


def run_status(run: dict[str, Any]) -> str:
    """The run's state; the page polls it and reloads when it moves."""
    return (
        f'<p id="run-status" class="state-{h(run["status"])}" '
        f'data-status="{h(run["status"])}" data-poll="/console/runs/{h(run["run_id"])}'
        f'/status">{h(run["agent"])} · <strong>{h(run["status"])}</strong></p>'
    )


def run_page(
    viewer: Viewer,
    run: dict[str, Any],
    steps: list[dict[str, Any]],
    *,
    journals: dict[str, Any] | None,
    replay: dict[str, Any] | None,
) -> str:
    """A run: its timeline, its actions and outcomes, and (for auditors) the journal."""
    rid = h(run["run_id"])
    parts = [f"<h1>Run {rid}</h1>{run_status(run)}"]
    if run.get("error"):
        parts.append(
            f'<p class="problem" id="run-error">{h(run["error"]["code"])}: '
            f"{h(run['error']['message'])}</p>"
        )
    # What Writ recorded comes before what the model wrote: an answer saying "refunded" does
    # not make a refund that did not succeed.
    unsettled = [a for a in run.get("actions") or [] if a.get("outcome") not in (None, "succeeded")]
    if unsettled:
        recorded = "; ".join(
            f"{a['action']}: {a.get('outcome')}"
            + (f" ({summary(a['reason'])})" if a.get("reason") else "")
            for a in unsettled
        )
        parts.append(f'<p class="problem" id="run-recorded">Writ recorded {h(recorded)}</p>')
    if run.get("answer"):
        parts.append(
            f'<p id="run-answer"><span class="label">The agent wrote:</span> {h(run["answer"])}</p>'
        )
    if run.get("pending_id"):
        pending = run["pending_id"]
        if run.get("proposal"):
            pending_href = f"/console/proposals/{h(run['proposal']['proposal_id'])}"
        elif pending.startswith("review-"):
            pending_href = f"/console/reviews/{h(pending)}"
        else:
            pending_href = f"/console/decisions/{h(pending)}"
        parts.append(f'<p>Waiting for a person: <a href="{pending_href}">{h(pending)}</a></p>')
    parts.append(evidence_list(run))
    rows = "".join(
        f"<tr><td>{h(s['seq'])}</td><td>{h(s['kind'])}</td><td>{h(s.get('decision'))}</td>"
        f"<td>{h(s.get('target'))}</td><td>{h(s.get('verdict'))}</td>"
        f"<td>{h(s.get('summary'))}</td></tr>"
        for s in steps
    )
    parts.append(
        '<h2>Timeline</h2><table class="timeline" id="timeline"><thead><tr><th>#</th>'
        "<th>Step</th><th>Decision</th><th>Target</th><th>Verdict</th><th>Summary"
        f"</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    actions = "".join(
        f"<tr><td>{h(a['action'])}</td><td>{h(a['operation_id'])}</td><td>{h(a['state'])}"
        f"</td><td>{h(a.get('outcome'))}</td><td>{h(a.get('receipt'))}</td>"
        f"<td>{h(a.get('reason') or a.get('correlation_id'))}</td></tr>"
        for a in run.get("actions") or []
    )
    parts.append(
        '<h2>Actions</h2><table class="actions" id="actions"><thead><tr><th>Action'
        "</th><th>Operation</th><th>State</th><th>Outcome</th><th>Receipt</th>"
        f"<th>Why</th></tr></thead><tbody>{actions}</tbody></table>"
    )
    if journals is not None:
        lines = "".join(
            f"<li>{h(j['service'])}: {'ok' if j['ok'] else 'NOT OK'} ({h(j.get('entries'))} "
            f"entries{', ' + h(j['first_problem']) if j.get('first_problem') else ''})</li>"
            for j in journals.get("journals", [])
        )
        verdict = "verified" if journals.get("ok") else "NOT verified"
        parts.append(
            f'<h2>Audit journal</h2><p id="journal">{verdict}</p><ul>{lines}</ul>'
            f'<form method="post" action="/console/runs/{rid}/replay">'
            f'{csrf_field(viewer)}<button type="submit" id="replay">Replay this run'
            f"</button></form>"
        )
    if replay is not None:
        found = "".join(
            f"<li>step {h(d.get('step'))}: expected {h(d['expected'])}, found {h(d['found'])}</li>"
            for d in replay.get("divergences", [])
        )
        missing = "".join(f"<li>missing {h(m)}</li>" for m in replay.get("missing", []))
        parts.append(
            f'<h2>Replay</h2><p id="replay-verdict">{h(replay["verdict"])} '
            f"({h(replay.get('entries'))} entries replayed)</p>"
            f"<ul>{found}{missing}</ul>"
        )
    return layout(f"Run {run['run_id']}", "".join(parts), viewer)
