"""The pages of the asks that are not proposals: a pending decision about a call no action
contract describes, and a review the run's agent asked for."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.ingress.console._pages import ago, h, layout, time_left
from services.ingress.console._pages import csrf_field as _csrf
from services.ingress.console._session import Viewer

__all__ = ["decision_page", "review_page"]


def decision_page(viewer: Viewer, d: dict[str, Any], *, now: datetime, answered: str = "") -> str:
    """A decision waiting for a person, with only the answers its case allows."""
    labels = {
        "once": "Allow once",
        "always": "Always allow (this agent, this family)",
        "deny": "Deny",
    }
    parts = [f"<h1>Decision: {h(d['tool'])}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered">{h(answered)}</p>')
    parts.append(
        '<table class="facts">'
        f'<tr><th scope="row">Agent</th><td>{h(d["agent"])}</td></tr>'
        f'<tr><th scope="row">Tool</th><td>{h(d["tool"])} ({h(d["family"])})</td></tr>'
        f'<tr><th scope="row">First argument</th><td>{h(d["first_argument"])}</td></tr>'
        f'<tr><th scope="row">Why it asks</th><td>{h(d["reason"])}</td></tr>'
        f'<tr><th scope="row">Requested by</th><td>{h(d["principal"])}</td></tr>'
        f'<tr><th scope="row">Asked</th><td>{h(ago(d["created_at"], now))} ago</td></tr>'
        f'<tr><th scope="row">Time left</th><td>{h(time_left(d.get("deadline"), now))}</td>'
        f'</tr><tr><th scope="row">Run</th><td><a href="/console/runs/{h(d["run_id"])}">'
        f"{h(d['run_id'])}</a></td></tr></table>"
    )
    if "approver" in viewer.roles and not answered:
        buttons = "".join(
            f'<button type="submit" name="answer" value="{h(o)}" id="answer-{h(o)}">'
            f"{h(labels.get(o, o))}</button>"
            for o in d["options"]
        )
        parts.append(
            f'<form method="post" action="/console/decisions/{h(d["pending_id"])}" '
            f'class="answer" data-once="true">{_csrf(viewer)}'
            f'<label>Reason <input name="reason" maxlength="500"></label>{buttons}</form>'
        )
    return layout(f"Decision {d['tool']}", "".join(parts), viewer)


def review_page(viewer: Viewer, pending_id: str, *, answered: str = "", prompt: str = "") -> str:
    """A review the run's agent asked for: approve or reject it, with a comment the run reads
    as an observation."""
    parts = [f"<h1>Review {h(pending_id)}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered">{h(answered)}</p>')
    run_id = pending_id.removeprefix("review-").rsplit("-", 1)[0]
    parts.append(
        f'<p>The agent of run <a href="/console/runs/{h(run_id)}">{h(run_id)}</a> '
        "asks a person to review its work before it goes on.</p>"
    )
    if prompt:
        # The agent's words: shown as what it asks, quoted, never as the console's own.
        parts.append(
            f'<h2>What it asks</h2><blockquote id="review-prompt">{h(prompt)}</blockquote>'
        )
    if "approver" in viewer.roles and not answered:
        parts.append(
            f'<form method="post" action="/console/reviews/{h(pending_id)}" class="answer" '
            f'data-once="true">{_csrf(viewer)}<label>Comment <textarea name="comment" '
            f'maxlength="500"></textarea></label>'
            '<button type="submit" name="answer" value="approve" id="review-approve">Approve'
            '</button><button type="submit" name="answer" value="reject" id="review-reject">'
            "Reject</button></form>"
        )
    return layout(f"Review {pending_id}", "".join(parts), viewer)
