"""The inbox's rows: what waits for a viewer, a page at a time, filtered and counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec
from litestar import Request

from services.ingress.console import _pages as pages
from services.ingress.console._client import ApiClient
from services.ingress.console._session import Viewer
from services.ingress.logic import APPROVER_ROLE

__all__ = ["PAGE", "InboxQuery", "inbox_items", "inbox_query"]

PAGE: Final = 50  # inbox rows of proposals per page


class InboxQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The inbox's filters and page, from its query string (anything else is ignored)."""

    kind: str = ""
    agent: str = ""
    action: str = ""
    requester: str = ""
    older_than_min: int = 0
    cursor: str = ""


def inbox_query(request: Request[Any, Any, Any]) -> InboxQuery:
    q = request.query_params
    kind = q.get("kind", "")
    older = q.get("older_than_min", "")
    return InboxQuery(
        kind=kind if kind in ("proposal", "decision", "review") else "",
        agent=q.get("agent", "")[:128],
        action=q.get("action", "")[:128],
        requester=q.get("requester", "")[:256],
        older_than_min=min(int(older), 527_040) if older.isdigit() else 0,
        cursor=q.get("cursor", "")[:128],
    )


async def inbox_items(
    client: ApiClient, viewer: Viewer, f: InboxQuery
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One page of what waits for the viewer, and the page's counts and cursor.

    Proposals and decisions about other calls come a page at a time from the API (newest
    first, every one reachable by its cursor, filtered and counted there): everything's first
    page carries the first of both, and the decisions' own pages (`kind=decision`) the rest.
    Reviews are few, and come with the first page. A decision about a proposal is never a row
    of its own: it is answered on its proposal."""
    items: list[dict[str, Any]] = []
    page: dict[str, Any] = {
        "problems": [],
        "counts": {},
        "next": None,
        "agents": set(),
        "more_decisions": False,
    }
    if APPROVER_ROLE not in viewer.roles:
        page["problems"].append("Only approvers have an inbox; auditors open runs by their id.")
        return items, page
    if f.kind in ("", "proposal"):
        got_p = await client.get(
            viewer,
            "/proposals",
            state="pending",
            limit=str(PAGE),
            cursor=f.cursor or None,
            action=f.action or None,
            agent=f.agent or None,
            requester=f.requester or None,
            older_than_s=str(f.older_than_min * 60) if f.older_than_min else None,
        )
        if got_p.ok:
            page["counts"]["proposal"] = got_p.body.get("total")
            page["next"] = got_p.body.get("next_cursor")
            for p in got_p.body["proposals"]:
                items.append(
                    {
                        "kind": "proposal",
                        "id": p["proposal_id"],
                        "agent": p.get("agent"),
                        "what": p["action"],
                        "requester": p.get("requester"),
                        "created_at": p.get("created_at"),
                        "expires_at": p.get("expires_at"),
                        "href": f"/console/proposals/{p['proposal_id']}",
                    }
                )
        else:
            page["problems"].append(f"proposals: {got_p.problem}")
    others: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    if f.kind in ("", "decision"):
        # Decisions about calls no proposal stands for, a page at a time like proposals (those
        # about a proposal are answered on it, beside its preview).
        got_d = await client.get(
            viewer,
            "/pending-decisions",
            about_proposal="false",
            newest_first="true",
            limit=str(PAGE),
            cursor=(f.cursor or None) if f.kind == "decision" else None,
            tool=f.action or None,
            agent=f.agent or None,
            requester=f.requester or None,
            older_than_s=str(f.older_than_min * 60) if f.older_than_min else None,
        )
        if got_d.ok:
            page["counts"]["decision"] = got_d.body.get("total")
            if f.kind == "decision":
                page["next"] = got_d.body.get("next_cursor")
            elif got_d.body.get("next_cursor"):
                page["more_decisions"] = True
            for d in got_d.body["decisions"]:
                if d.get("about_proposal"):
                    continue  # shown as its proposal: answered beside its preview
                decisions.append(
                    {
                        "kind": "decision",
                        "id": d["pending_id"],
                        "agent": d["agent"],
                        "what": d["tool"],
                        "requester": d["principal"],
                        "created_at": d["created_at"],
                        "expires_at": d.get("deadline"),
                        "href": f"/console/decisions/{d['pending_id']}",
                    }
                )
        else:
            page["problems"].append(f"decisions: {got_d.problem}")
    if f.kind in ("", "review"):
        got_r = await client.get(viewer, "/reviews")
        if got_r.ok:
            for r in got_r.body["reviews"]:
                others.append(
                    {
                        "kind": "review",
                        "id": r["pending_id"],
                        "agent": r["agent"],
                        "what": "review of its work",
                        "requester": r["principal"],
                        "created_at": r["since"],
                        "expires_at": None,
                        "href": f"/console/reviews/{r['pending_id']}",
                    }
                )
        else:
            page["problems"].append(f"reviews: {got_r.problem}")
    page["agents"] = {str(i["agent"]) for i in items + decisions + others if i["agent"]}
    cutoff = datetime.now(UTC) - timedelta(minutes=f.older_than_min)
    others = [
        i
        for i in others
        if f.agent in ("", i["agent"])
        and f.action in ("", i["what"])
        and f.requester in ("", i["requester"])
        and (not f.older_than_min or (pages.when(i["created_at"]) or cutoff) <= cutoff)
    ]
    if f.kind in ("", "review"):
        page["counts"]["review"] = len(others)
    if f.kind == "decision":
        items += decisions
    elif not f.cursor:  # the first page carries the first decisions and the few reviews
        items += decisions + others
    items.sort(key=lambda i: i["created_at"] or "", reverse=True)
    return items, page
