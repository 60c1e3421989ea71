"""Chat sessions through the six processes, the remainders of issue 15: an attended ask in a
turn denied after its 5 minutes by governance's own expiry sweep; `writ audit replay` of
plan-mode turns (approved, deviated from, rejected; and a tampered record); a model call
cancelled mid-stream by a close, whose partial text the stream resets.

The deployment, the model fake and the helpers are `test_sessions.py`'s (its own stack).
"""

from __future__ import annotations

import json
from datetime import timedelta

import anyio
import asyncpg
import httpx
import pytest

from tests.e2e.conftest import Host, notes_for, sealed
from tests.e2e.test_replay import writ_audit
from tests.e2e.test_sessions import (  # noqa: F401  (fixtures: this module's own stack)
    NOTE,
    api,
    db,
    llm,
    model,
    model_requests,
    open_session,
    script,
    select,
    send,
    session_events,
    stack,
    until,
    view,
)
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def journal_kinds(db: asyncpg.Connection, schema: str, run_id: str) -> list[str]:
    return [r["kind"] for r in await db.fetch(
        f"SELECT kind FROM {schema}.journal WHERE run_id = $1 ORDER BY id", run_id)]


async def test_an_attended_ask_in_a_turn_is_denied_after_five_minutes_by_governance(
        api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client,
        crm: httpx.Client) -> None:
    sid = await open_session(api, "careful-chat")  # no grant: its note is asked
    before, notes = len(model_requests(model)), len(notes_for(crm))
    script(model, select("crm.note.create", NOTE))
    sent = await send(api, sid, "Note the call, please.")
    run_id = sent.json()["run_id"]
    waiting = await until(api, sid, lambda v: (v["waiting_for"] or {}).get("kind") == "person")
    pending_id = waiting["waiting_for"]["pending_id"]
    assert waiting["state"] == "processing"
    # The ask is attended (a person is in the chat): its deadline is 5 minutes after it.
    row = await db.fetchrow("SELECT attended, deadline, created_at, answer "
                            "FROM governance.pending WHERE run_id = $1", run_id)
    assert row["attended"] is True and row["answer"] is None
    assert abs((row["deadline"] - row["created_at"]) - timedelta(minutes=5)) < timedelta(
        seconds=2)
    asked = [json.loads(r["body"]) for r in await db.fetch(
        "SELECT body FROM planner.session_events WHERE session_id = $1 AND type = "
        "'DecisionAsked'", sid)]
    assert [a["pending_id"] for a in asked] == [pending_id]  # what the session waits for

    # Five minutes pass (the administrator moves the deadline; nothing in Writ is told):
    # governance's own sweep finds the ask overdue and answers it deny, by nobody.
    await db.execute("UPDATE governance.pending SET deadline = now() - interval '1 second' "
                     "WHERE run_id = $1 AND answer IS NULL", run_id)
    seen = await until(api, sid, lambda v: v["state"] == "active")
    assert await db.fetchval("SELECT answered_by FROM governance.pending WHERE run_id = $1",
                             run_id) == "nobody"
    run = await db.fetchrow("SELECT status, error_code, error_message FROM planner.runs "
                            "WHERE run_id = $1", run_id)
    assert (run["status"], run["error_code"]) == ("failed", "REJECTED")
    assert "no answer within 5 minutes" in run["error_message"]
    # The turn went on from its recorded step (the model was not asked again) and ended
    # with the denial written into the session by Writ.
    assert len(model_requests(model)) - before == 1
    kinds = [r["kind"] for r in await db.fetch(
        "SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id)]
    assert kinds == ["decision", "observation"]
    writ = [m for m in seen["messages"] if m["role"] == "writ"]
    assert len(writ) == 1 and "no answer within 5 minutes" in writ[0]["text"], seen["messages"]
    types = await session_events(db, sid)
    assert (types.index("DecisionAsked") < types.index("DecisionTaken")
            < types.index("WriterNote") < types.index("TurnEnded"))
    taken = json.loads(await db.fetchval(
        "SELECT body FROM planner.session_events WHERE session_id = $1 AND type = "
        "'DecisionTaken'", sid))
    assert (taken["pending_id"], taken["answer"]) == (pending_id, "deny")
    ended = json.loads(await db.fetchval(
        "SELECT body FROM planner.session_events WHERE session_id = $1 AND type = "
        "'TurnEnded'", sid))
    assert (ended["status"], ended["code"]) == ("failed", "REJECTED")
    # Nothing reached the CRM: no command, no note.
    assert await db.fetchval("SELECT count(*) FROM admission.commands WHERE run_id = $1",
                             run_id) == 0
    assert await db.fetchval("SELECT state FROM admission.proposals WHERE run_id = $1",
                             run_id) == "rejected"
    assert len(notes_for(crm)) == notes
    # The journals show it: governance's answer by nobody, and the session's record of it.
    assert "pending.answered" in await journal_kinds(db, "governance", run_id)
    session_kinds = await journal_kinds(db, "planner", sid)
    assert ["session.DecisionAsked", "session.DecisionTaken", "session.WriterNote",
            "session.TurnEnded"] == [k for k in session_kinds if k in (
                "session.DecisionAsked", "session.DecisionTaken", "session.WriterNote",
                "session.TurnEnded")]
