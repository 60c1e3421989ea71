"""A run's pages: its status line (the page polls it) and the run itself, its timeline, its
actions and outcomes, and for auditors the journal."""

from __future__ import annotations

from typing import Any

from services.ingress.console._i18n import said, t
from services.ingress.console._pages import (
    csrf_field,
    evidence_list,
    h,
    layout,
    outcome_said,
    summary,
)
from services.ingress.console._session import Viewer

__all__ = ["run_page", "run_status"]


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
    parts = [f"<h1>{h(t('run_title', id=run['run_id']))}</h1>{run_status(run)}"]
    if run.get("error"):
        parts.append(
            # A run waiting for a person has not gone wrong: it is told, not flagged.
            f'<p class="{"notice" if run.get("status") == "awaiting_human" else "problem"}" '
            f'id="run-error">{h(run["error"]["code"])}: '
            f"{h(said(None, run['error']['message']))}</p>"
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
        parts.append(
            f'<p class="problem" id="run-recorded">{h(t("writ_recorded", what=recorded))}</p>'
        )
    if run.get("answer"):
        parts.append(
            f'<p id="run-answer"><span class="label">{t("agent_wrote")}</span> '
            f"{h(run['answer'])}</p>"
        )
    if run.get("pending_id"):
        pending = run["pending_id"]
        if run.get("proposal"):
            pending_href = f"/console/proposals/{h(run['proposal']['proposal_id'])}"
        elif pending.startswith("review-"):
            pending_href = f"/console/reviews/{h(pending)}"
        else:
            pending_href = f"/console/decisions/{h(pending)}"
        parts.append(f'<p>{t("waiting_person")} <a href="{pending_href}">{h(pending)}</a></p>')

    parts.append(evidence_list(run))
    rows = "".join(
        f"<tr><td>{h(s['seq'])}</td><td>{h(s['kind'])}</td><td>{h(s.get('decision'))}</td>"
        f"<td>{h(s.get('target'))}</td><td>{h(s.get('verdict'))}</td>"
        f"<td>{h(s.get('summary'))}</td></tr>"
        for s in steps
    )
    parts.append(
        f'<h2>{t("timeline")}</h2><table class="timeline" id="timeline"><thead><tr><th>#</th>'
        f"<th>{t('step')}</th><th>{t('decision')}</th><th>{t('target')}</th>"
        f"<th>{t('verdict')}</th><th>{t('summary')}</th></tr></thead><tbody>{rows}</tbody>"
        "</table>"
    )
    actions = "".join(
        f"<tr><td>{h(a['action'])}</td><td>{h(a['operation_id'])}</td><td>{h(a['state'])}"
        f"</td><td>{h(outcome_said(a['outcome']) if a.get('outcome') else None)}</td>"
        f"<td>{h(a.get('receipt'))}</td>"
        f"<td>{h(a.get('reason') or a.get('correlation_id'))}</td></tr>"
        for a in run.get("actions") or []
    )
    parts.append(
        f'<h2>{t("actions")}</h2><table class="actions" id="actions"><thead><tr>'
        f"<th>{t('action')}</th><th>{t('operation')}</th><th>{t('state')}</th>"
        f"<th>{t('outcome')}</th><th>{t('receipt_head')}</th><th>{t('why')}</th></tr>"
        f"</thead><tbody>{actions}</tbody></table>"
    )
    if journals is not None:
        lines = "".join(
            f"<li>{h(j['service'])}: {t('journal_ok') if j['ok'] else t('journal_not_ok')} "
            f"({h(t('entries', n=j.get('entries')))}"
            f"{', ' + h(j['first_problem']) if j.get('first_problem') else ''})</li>"
            for j in journals.get("journals", [])
        )
        verdict = t("verified") if journals.get("ok") else t("not_verified")
        parts.append(
            f'<h2>{t("audit_journal")}</h2><p id="journal">{verdict}</p><ul>{lines}</ul>'
            f'<form method="post" action="/console/runs/{rid}/replay">'
            f'{csrf_field(viewer)}<button type="submit" id="replay">{t("replay_run")}'
            f"</button></form>"
        )
    if replay is not None:
        found = "".join(
            f"<li>step {h(d.get('step'))}: expected {h(d['expected'])}, found {h(d['found'])}</li>"
            for d in replay.get("divergences", [])
        )
        missing = "".join(f"<li>missing {h(m)}</li>" for m in replay.get("missing", []))
        parts.append(
            f'<h2>{t("replay")}</h2><p id="replay-verdict">{h(replay["verdict"])} '
            f"({h(t('replayed', n=replay.get('entries')))})</p>"
            f"<ul>{found}{missing}</ul>"
        )
    return layout(t("run_title", id=run["run_id"]), "".join(parts), viewer)
