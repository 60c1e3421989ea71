"""A proposal's trail: each step as the journals recorded it (who proposed, the decision that
asked, who answered and when, approval or rejection, every attempt, the outcome), and each
row checked twice: against its signed journal (sealed, authentic, in a chain that verifies)
and against what the record says now (who approved, the outcome)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from services.ingress.console._i18n import CATALOG, caption, said, stamp, t

__all__ = ["TrailRow", "trail_rows", "trail_section"]

_TERMINAL: Final = frozenset({"succeeded", "failed", "denied", "expired", "revision_required"})


class TrailRow(msgspec.Struct, frozen=True, kw_only=True):
    """One step of the trail."""

    step: str
    who: str
    when: str
    what: str
    journal: str  # "admission #12": which journal, where in its chain ("" when none holds it)
    problem: str | None = None  # None: it checks out

    @property
    def verified(self) -> bool:
        """The step checks out against its journal and the record."""
        return self.problem is None


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _row(service: str, e: dict[str, Any]) -> TrailRow | None:
    """The step an entry records (None: not a step of a proposal's trail)."""
    p, kind = e.get("payload") or {}, str(e["kind"])
    where = (
        f"{service} #{e['seq']}"
        if e.get("seq") is not None
        else t("trail_unsealed", service=service)
    )
    step, who, what = "", "", ""
    if kind in ("proposal.pending", "proposal.rejected") and "principal" in p:
        step, who = "Proposed", _s(p.get("principal"))
        what = t("trail_proposed", agent=_s(p.get("agent")), action=_s(p.get("action")))
        if kind == "proposal.rejected":
            what += t("trail_refused_at_once", reason=said(None, _s(p.get("reason"))))
    elif kind == "proposal.rejected":
        step, who, what = "Rejected", _s(p.get("rejected_by")), said(None, _s(p.get("reason")))
    elif kind == "proposal.approved":
        step, who = "Approved", _s(p.get("approved_by"))
        what = t("trail_line", line=_s(p.get("line")), policy=_s(p.get("policy_version")))
    elif kind == "proposal.revision_asked":
        step, who = "Revision asked", _s(p.get("rejected_by"))
        what = said(None, _s(p.get("reason")))
    elif kind == "proposal.approval_recorded":
        step, who, what = "Approval", _s(p.get("approved_by")), "one of the approvals it needs"
    elif kind == "proposal.expired":
        step, who, what = "Expired", "", "nobody answered before it expired"
    elif kind == "command.admitted":
        step, who = "Admitted", _s(p.get("principal"))
        what = t("trail_allowed", line=_s(p.get("line")), policy=_s(p.get("policy_version")))
    elif kind == "command.authorized":
        step, who = "Receipt signed", "admission"
        what = t("trail_receipt_signed", kid=_s(p.get("kid") or p.get("key_id")))
    elif kind == "decision":
        step, who = "Decided", "governance"
        what = t(
            "trail_decided",
            verdict=_s(p.get("verdict")),
            line=_s(p.get("line")),
            policy=_s(p.get("policy_version")),
            reason=said(None, _s(p.get("reason"))),
        )
    elif kind == "pending.answered":
        step, who = "Answered", _s(p.get("answered_by"))
        what = f"{_s(p.get('answer'))}" + (
            f": {said(None, p['reason'])}" if p.get("reason") else ""
        )
    elif kind == "attempt.started":
        step, who = "Attempt", _s(p.get("connector"))
        what = t("trail_sent", connector=_s(p.get("connector")), lease=_s(p.get("lease_epoch")))
    elif kind == "attempt.released":
        step, who, what = "Attempt released", "", _s(p.get("reason")) or "released"
    elif kind == "command.reconciled":
        step, who = "Reconciled", _s(p.get("resolved_by"))
        what = _word(_s(p.get("state"))) + (
            t("trail_receipt", receipt=p["receipt"]) if p.get("receipt") else ""
        )
    elif kind.startswith("command."):
        step, who = "Outcome", ""
        what = _word(kind.removeprefix("command.")) + (
            t("trail_receipt", receipt=p["receipt"]) if p.get("receipt") else ""
        )
    else:
        return None
    return TrailRow(
        step=step,
        who=who,
        when=_s(e.get("recorded_at")),
        what=what,
        journal=where,
        problem=None if e.get("verified") else _s(e.get("problem")) or "not verified",
    )


def _against_record(row: TrailRow, proposal: dict[str, Any]) -> TrailRow:
    """The row, failed where what the record says now differs from what the journal proves."""
    said: str | None = None
    if row.step == "Approved" and proposal.get("approved_by") not in (None, row.who):
        said = t("trail_record_approved", record=proposal["approved_by"], journal=row.who)
    elif row.step == "Proposed" and proposal.get("requester") not in (None, row.who):
        said = t("trail_record_requested", record=proposal["requester"], journal=row.who)
    if said is None or row.problem is not None:
        return row
    return msgspec.structs.replace(row, problem=said)


def _missing(rows: list[TrailRow], proposal: dict[str, Any]) -> list[TrailRow]:
    """A step the record says happened and no journal entry proves."""
    steps = {r.step for r in rows}
    state, command = proposal.get("state"), proposal.get("command_state")
    wanted: list[tuple[str, str]] = [("Proposed", "the proposal")]
    if state in ("executing", "completed") and not {"Approved", "Admitted"} & steps:
        wanted.append(("Approved", t("trail_approved_by", who=_s(proposal.get("approved_by")))))
    if state == "rejected" and "Revision asked" not in steps:
        wanted.append(("Rejected", _s(proposal.get("reason"))))
    if state == "expired":
        wanted.append(("Expired", "nobody answered before it expired"))
    if command in _TERMINAL and not {"Outcome", "Reconciled"} & steps:
        wanted.append(("Outcome", _word(command)))
    return [
        TrailRow(
            step=step,
            who="",
            when="",
            what=what,
            journal="",
            problem="the record says so, and no journal entry proves it",
        )
        for step, what in wanted
        if step not in steps
    ]


def _word(outcome: str) -> str:
    """An outcome the journal names, in the current locale's words where it has them."""
    return t(f"oc_{outcome}") if f"oc_{outcome}" in CATALOG else outcome


def trail_rows(trail: dict[str, Any]) -> list[TrailRow]:
    """Every step of a `GET /proposals/{id}/trail` answer, oldest first, each checked."""
    proposal = trail["proposal"]
    rows: list[TrailRow] = []
    for journal in trail.get("journals") or []:
        for entry in journal.get("found") or []:
            row = _row(str(journal["service"]), entry)
            if row is not None:
                rows.append(_against_record(row, proposal))
    # The proposal is recorded once governance has decided on it, but it was proposed first.
    rows.sort(key=lambda r: (r.step != "Proposed", r.when))
    return rows + _missing(rows, proposal)


def trail_section(trail: dict[str, Any] | None, h: Any) -> str:
    """The trail as a table, with a sentence that says whether every row checks out."""
    if trail is None:
        return f'<h2>{t("trail")}</h2><p class="problem" id="trail-verdict">{t("trail_unread")}</p>'
    rows = trail_rows(trail)
    failed = [r for r in rows if not r.verified]
    verdict = (
        f'<p class="problem" id="trail-verdict">'
        f"{h(t('trail_failed', n=len(failed), total=len(rows)))}"
        + "; ".join(f"{h(caption(r.step))} ({h(caption(r.problem or ''))})" for r in failed)
        + ".</p>"
        if failed
        else f'<p id="trail-verdict">{h(t("trail_ok", total=len(rows)))}</p>'
    )
    body = "".join(
        f'<tr data-step="{h(r.step)}" data-verified="{str(r.verified).lower()}">'
        f"<td>{h(caption(r.step))}</td><td>{h(r.who)}</td><td>{h(stamp(r.when))}</td>"
        f"<td>{h(caption(r.what))}</td>"
        f"<td>{h(r.journal)}</td><td>{t('verified') if r.verified else t('not_verified')}"
        "</td></tr>"
        for r in rows
    )
    return (
        f'<h2>{t("trail")}</h2>{verdict}<table class="trail" id="trail">'
        f"<thead><tr><th>{t('step')}</th><th>{t('who')}</th><th>{t('when')}</th>"
        f"<th>{t('what')}</th><th>{t('journal')}</th><th>{t('check')}</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )
