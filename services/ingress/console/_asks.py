"""The pages of the asks that are not proposals: a pending decision about a call no action
contract describes, and a review the run's agent asked for."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.ingress.console._i18n import t
from services.ingress.console._pages import ago, h, layout, time_left
from services.ingress.console._pages import csrf_field as _csrf
from services.ingress.console._session import Viewer

__all__ = ["decision_page", "review_page"]


def decision_page(viewer: Viewer, d: dict[str, Any], *, now: datetime, answered: str = "") -> str:
    """A decision waiting for a person, with only the answers its case allows."""
    labels = {
        "once": t("allow_once"),
        "always": t("allow_always"),
        "deny": t("deny"),
    }
    parts = [f"<h1>{h(t('decision_title', tool=d['tool']))}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered">{h(answered)}</p>')
    parts.append(
        '<table class="facts">'
        f'<tr><th scope="row">{t("agent")}</th><td>{h(d["agent"])}</td></tr>'
        f'<tr><th scope="row">{t("tool")}</th><td>{h(d["tool"])} ({h(d["family"])})</td></tr>'
        f'<tr><th scope="row">{t("first_argument")}</th><td>{h(d["first_argument"])}</td></tr>'
        f'<tr><th scope="row">{t("why_it_asks")}</th><td>{h(d["reason"])}</td></tr>'
        f'<tr><th scope="row">{t("requested_by")}</th><td>{h(d["principal"])}</td></tr>'
        f'<tr><th scope="row">{t("asked")}</th><td>'
        f"{h(t('ago', span=ago(d['created_at'], now)))}</td></tr>"
        f'<tr><th scope="row">{t("time_left")}</th><td>'
        f"{h(time_left(d.get('deadline'), now))}</td></tr>"
        f'<tr><th scope="row">{t("run")}</th><td><a href="/console/runs/{h(d["run_id"])}">'
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
            f'<label>{t("reason")} <input name="reason" maxlength="500"></label>{buttons}</form>'
        )
    return layout(t("decision_page", tool=d["tool"]), "".join(parts), viewer)


def review_page(viewer: Viewer, pending_id: str, *, answered: str = "", prompt: str = "") -> str:
    """A review the run's agent asked for: approve or reject it, with a comment the run reads
    as an observation."""
    parts = [f"<h1>{h(t('review_title', id=pending_id))}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered">{h(answered)}</p>')
    run_id = pending_id.removeprefix("review-").rsplit("-", 1)[0]
    parts.append(
        f'<p>{t("agent_of_run")} <a href="/console/runs/{h(run_id)}">{h(run_id)}</a> '
        f"{t('review_intro')}</p>"
    )
    if prompt:
        # The agent's words: shown as what it asks, quoted, never as the console's own.
        parts.append(
            f'<h2>{t("what_it_asks")}</h2><blockquote id="review-prompt">{h(prompt)}</blockquote>'
        )
    if "approver" in viewer.roles and not answered:
        parts.append(
            f'<form method="post" action="/console/reviews/{h(pending_id)}" class="answer" '
            f'data-once="true">{_csrf(viewer)}<label>{t("comment")} <textarea name="comment" '
            f'maxlength="500"></textarea></label>'
            '<button type="submit" name="answer" value="approve" id="review-approve">'
            f'{t("approve")}</button><button type="submit" name="answer" value="reject" '
            f'id="review-reject">{t("reject")}</button></form>'
        )
    return layout(t("review_title", id=pending_id), "".join(parts), viewer)
