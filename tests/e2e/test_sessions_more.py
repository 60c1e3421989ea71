"""Chat sessions through the six processes, continued: an attended ask in a
turn denied after its 5 minutes by governance's own expiry sweep; `writ audit replay` of
plan-mode turns (approved, deviated from, rejected; and a tampered record); a model call
cancelled mid-stream by a close, whose partial text the stream resets.

The deployment, the model fake and the helpers are `test_sessions.py`'s (its own stack).
"""

# ruff: noqa: F811 (test_sessions.py's fixtures, imported, are parameters here)
from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from tests.e2e.conftest import notes_for, sealed
from tests.e2e.test_replay import writ_audit
from tests.e2e.test_sessions import (  # noqa: F401 (fixtures: this module's own stack)
    NOTE,
    act,
    answer,
    api,
    asked_of,
    db,
    event_bodies,
    events,
    key,
    llm,
    model,
    model_requests,
    open_session,
    opened_events,
    script,
    select,
    send,
    session_events,
    stack,
    turn_ended,
    until,
    view,
)
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def journal_kinds(db: asyncpg.Connection, schema: str, run_id: str) -> list[str]:
    return [
        r["kind"]
        for r in await db.fetch(
            f"SELECT kind FROM {schema}.journal WHERE run_id = $1 ORDER BY id", run_id
        )
    ]


async def test_an_attended_ask_in_a_turn_is_denied_after_five_minutes_by_governance(
    api: httpx.AsyncClient,
    db: asyncpg.Connection,
    model: httpx.Client,
    crm: httpx.Client,
    stack: Stack,
) -> None:
    sid = await open_session(api, "careful-chat")  # no grant: its note is asked
    before, notes = len(model_requests(model)), len(notes_for(crm))
    script(model, select("crm.note.create", NOTE))
    sent = await send(api, sid, "Note the call, please.")
    run_id = sent.json()["run_id"]
    waiting = await until(api, sid, lambda v: (v["waiting_for"] or {}).get("kind") == "person")
    pending_id = waiting["waiting_for"]["pending_id"]
    assert waiting["state"] == "processing"
    # The ask is attended (a person is in the chat): its deadline is 5 minutes after it.
    row = await db.fetchrow(
        "SELECT attended, deadline, created_at, answer FROM governance.pending WHERE run_id = $1",
        run_id,
    )
    assert row["attended"] is True and row["answer"] is None
    assert abs((row["deadline"] - row["created_at"]) - timedelta(minutes=5)) < timedelta(seconds=2)
    asked = await event_bodies(db, stack, sid, "DecisionAsked")
    assert [a["pending_id"] for a in asked] == [pending_id]  # what the session waits for

    # Five minutes pass (the administrator moves the deadline; nothing in Writ is told):
    # governance's own sweep finds the ask overdue and answers it deny, by nobody.
    await db.execute(
        "UPDATE governance.pending SET deadline = now() - interval '1 second' "
        "WHERE run_id = $1 AND answer IS NULL",
        run_id,
    )
    seen = await until(api, sid, lambda v: v["state"] == "active")
    assert (
        await db.fetchval("SELECT answered_by FROM governance.pending WHERE run_id = $1", run_id)
        == "nobody"
    )
    run = await db.fetchrow(
        "SELECT status, error_code, error_message FROM planner.runs WHERE run_id = $1", run_id
    )
    assert (run["status"], run["error_code"]) == ("failed", "REJECTED")
    assert "no answer within 5 minutes" in run["error_message"]
    # The turn went on from its recorded step (the model was not asked again) and ended
    # with the denial written into the session by Writ.
    assert len(model_requests(model)) - before == 1
    kinds = [
        r["kind"]
        for r in await db.fetch(
            "SELECT kind FROM planner.steps WHERE run_id = $1 ORDER BY seq", run_id
        )
    ]
    assert kinds == ["decision", "observation"]
    writ = [m for m in seen["messages"] if m["role"] == "writ"]
    assert len(writ) == 1 and "no answer within 5 minutes" in writ[0]["text"], seen["messages"]
    types = await session_events(db, sid)
    assert (
        types.index("DecisionAsked")
        < types.index("DecisionTaken")
        < types.index("WriterNote")
        < types.index("TurnEnded")
    )
    (taken,) = await event_bodies(db, stack, sid, "DecisionTaken")
    assert (taken["pending_id"], taken["answer"]) == (pending_id, "deny")
    (ended,) = await event_bodies(db, stack, sid, "TurnEnded")
    assert (ended["status"], ended["code"]) == ("failed", "REJECTED")
    # Nothing reached the CRM: no command, no note.
    assert (
        await db.fetchval("SELECT count(*) FROM admission.commands WHERE run_id = $1", run_id) == 0
    )
    assert (
        await db.fetchval("SELECT state FROM admission.proposals WHERE run_id = $1", run_id)
        == "rejected"
    )
    assert len(notes_for(crm)) == notes
    # The journals show it: governance's answer by nobody, and the session's record of it.
    assert "pending.answered" in await journal_kinds(db, "governance", run_id)
    session_kinds = await journal_kinds(db, "planner", sid)
    assert [
        "session.DecisionAsked",
        "session.DecisionTaken",
        "session.WriterNote",
        "session.TurnEnded",
    ] == [
        k
        for k in session_kinds
        if k
        in (
            "session.DecisionAsked",
            "session.DecisionTaken",
            "session.WriterNote",
            "session.TurnEnded",
        )
    ]


async def test_a_close_during_a_streamed_answer_abandons_the_call_and_resets_its_text(
    stack: Stack, api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client
) -> None:
    text = " ".join(f"Word{i} of a long answer the model is still writing." for i in range(12))
    sid = await open_session(api, "chat-assistant")
    script(model, answer(text))
    model.post(
        "/_control/mode", json={"mode": "slow_stream", "count": 1, "delay_s": 0.25}
    ).raise_for_status()
    before = len(model_requests(model))
    sent = await send(api, sid, "Tell me everything.")
    run_id = sent.json()["run_id"]
    closed: list[httpx.Response] = []
    shown = anyio.Event()  # the first delta is on the stream: text has been shown

    async def close_then() -> None:
        await shown.wait()
        closed.append(await act(api, sid, "close"))

    def read(event: dict[str, Any]) -> bool:
        if event["type"] == "TextDelta":
            shown.set()
        return event["type"] == "TurnEnded"

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_then)
        seen = await events(api, sid, stop=read, timeout=60)
    assert closed and (closed[0].status_code, closed[0].json()["state"]) == (202, "closed")
    types = [e["type"] for _, e in seen]
    deltas = [e for _, e in seen if e["type"] == "TextDelta"]
    [reset] = [e for _, e in seen if e["type"] == "TextReset"]
    # The deltas shown, then the reset of their attempt (a client drops them), then the
    # turn's end as cancelled; the close is in between, and no delta follows the reset.
    assert deltas and {d["attempt"] for d in deltas} == {reset["attempt"]}
    assert all(d["step"] == reset["step"] == 0 for d in deltas)
    assert types.index("TextDelta") < types.index("TextReset") < types.index("TurnEnded")
    assert types.index("TextDelta") < types.index("SessionClosed") < types.index("TurnEnded")
    assert "TextDelta" not in types[types.index("TextReset") :]
    assert "".join(d["text"] for d in deltas) != text  # cut short: the model never finished
    assert text.startswith("".join(d["text"] for d in deltas))
    ended = seen[-1][1]
    assert (ended["status"], ended["answer"], ended["code"]) == ("cancelled", None, "CANCELLED")
    # Nothing of the abandoned call is recorded; the run ended cancelled, and its reservation
    # was settled (nothing of the turn is left open in governance).
    run = await db.fetchrow("SELECT status, answer FROM planner.runs WHERE run_id = $1", run_id)
    assert (run["status"], run["answer"]) == ("cancelled", None)
    assert await db.fetchval("SELECT count(*) FROM planner.steps WHERE run_id = $1", run_id) == 0
    held = await db.fetch(
        "SELECT lease, state, provider_calls, tokens FROM planner.reservations WHERE run_id = $1",
        run_id,
    )
    [draw] = [r for r in held if r["lease"] is not None]  # the model call, on the turn's lease
    assert (draw["state"], draw["provider_calls"]) == ("closed", 1) and draw["tokens"] > 0
    # The lease is settled once the turn's end committed (its events may be seen first).
    with anyio.fail_after(10):
        while (
            await db.fetchval(
                "SELECT state FROM planner.reservations WHERE run_id = $1 AND lease IS NULL", run_id
            )
            != "closed"
        ):
            await anyio.sleep(0.05)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM governance.reservations WHERE run_id = $1 AND status = 'open'",
            run_id,
        )
        == 0
    )
    assert len(model_requests(model)) - before == 1  # asked once, never asked again
    final = await view(api, sid)
    assert final["state"] == "closed"
    assert [m["role"] for m in final["messages"]] == ["user"]  # no answer in the history


async def open_planning(api: httpx.AsyncClient) -> str:
    opened = await api.post(
        "/sessions", json={"agent": "chat-assistant", "plan_mode": True}, headers=key()
    )
    assert opened.status_code == 201, opened.text
    return str(opened.json()["session_id"])


async def plan_waiting(api: httpx.AsyncClient, sid: str, other_than: str = "") -> str:
    seen = await until(
        api,
        sid,
        lambda v: (
            (v["waiting_for"] or {}).get("kind") == "plan"
            and v["waiting_for"]["plan_id"] != other_than
        ),
    )
    return str(seen["waiting_for"]["plan_id"])


async def replay_of(db: asyncpg.Connection, stack: Stack, sid: str, *runs: str) -> tuple[int, str]:
    for run_id in (sid, *runs):
        await sealed(db, run_id)
    done = writ_audit(stack, "replay", sid)
    return done.returncode, done.stdout + done.stderr


async def test_replay_of_plan_mode_turns_is_identical_and_sees_a_tampered_plan(
    stack: Stack, api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client
) -> None:
    sid = await open_planning(api)
    first = {"customer_id": "ACME-42", "body": "Chat: the customer called."}
    other = {"customer_id": "ACME-42", "body": "Chat: something never planned."}
    # Turn 1: planned, approved, carried out.
    script(
        model,
        select("crm.note.create", first),
        answer("Plan: one note."),
        answer("Done as planned."),  # Writ takes the approved step itself
    )
    t1 = (await send(api, sid, "Note the call.")).json()["run_id"]
    plan = await plan_waiting(api, sid)
    assert (await api.post(f"/plans/{plan}/approve", json={}, headers=key())).status_code == 200
    await until(api, sid, lambda v: v["state"] == "active" and v["turn"] == 1)
    # Turn 2: approved and taken, then a call beyond it (NOT_IN_PLAN), revised, the
    # revision approved and taken.
    script(
        model,
        select("crm.note.create", first),
        answer("Plan: the note again."),
        select("crm.note.create", other),
        answer("Revised: the other note."),
        answer("Done as revised."),
    )
    t2 = (await send(api, sid, "Note it again.")).json()["run_id"]
    plan2 = await plan_waiting(api, sid)
    await api.post(f"/plans/{plan2}/approve", json={}, headers=key())
    revised = await plan_waiting(api, sid, other_than=plan2)
    await api.post(f"/plans/{revised}/approve", json={}, headers=key())
    await until(api, sid, lambda v: v["state"] == "active" and v["turn"] == 2)
    refused = [
        json.loads(r["payload"]).get("refused")
        for r in await db.fetch(
            "SELECT payload FROM planner.steps WHERE run_id = $1 AND kind = 'observation' "
            "ORDER BY seq",
            t2,
        )
    ]
    assert "NOT_IN_PLAN" in refused
    # Turn 3: the plan rejected.
    script(model, select("crm.note.create", other), answer("Plan: the other note."))
    t3 = (await send(api, sid, "Note the other thing.")).json()["run_id"]
    plan3 = await plan_waiting(api, sid)
    await api.post(f"/plans/{plan3}/reject", json={"reason": "Not that one."}, headers=key())
    await until(api, sid, lambda v: v["state"] == "active" and v["turn"] == 3)

    code, out = await replay_of(db, stack, sid, t1, t2, t3)
    assert code == 0, out
    for run_id in (t1, t2, t3):
        assert f"run {run_id}: IDENTICAL" in out, out

    # The runtime's record of an approved plan edited afterwards: the replay says so.
    await db.execute(
        "UPDATE planner.plans SET steps = jsonb_set(steps, '{0,arguments,body}', "
        "'\"Chat: edited after the approval.\"') WHERE plan_id = $1",
        plan,
    )
    code, out = await replay_of(db, stack, sid)
    assert code == 1, out
    assert f"run {t1}: DIVERGENT" in out and plan in out, out
    assert f"run {t2}: IDENTICAL" in out and f"run {t3}: IDENTICAL" in out, out


async def run_row(db: asyncpg.Connection, run_id: str) -> Any:
    return await db.fetchrow(
        "SELECT status, error_code, pending_id FROM planner.runs WHERE run_id = $1", run_id
    )


async def paused_mid_call(
    api: httpx.AsyncClient,
    db: asyncpg.Connection,
    model: httpx.Client,
    note: dict[str, str],
    *then: dict[str, Any],
) -> tuple[str, str]:
    """A session whose turn's streamed model call selecting a write was in flight when the
    session paused (`then`: the model's replies after it); returns once the decision is
    recorded and held: (session, run)."""
    sid = await open_session(api, "chat-assistant")  # granted: its notes need nobody
    script(model, select("crm.note.create", note), *then)
    model.post(
        "/_control/mode", json={"mode": "slow_stream", "count": 1, "delay_s": 0.2}
    ).raise_for_status()
    before = len(model_requests(model))
    run_id = (await send(api, sid, "Note the call.")).json()["run_id"]
    with anyio.fail_after(40):
        while len(model_requests(model)) == before:
            await anyio.sleep(0.02)
    paused = await act(api, sid, "pause")
    assert (paused.status_code, paused.json()["state"]) == (202, "paused")
    with anyio.fail_after(40):
        while (await run_row(db, run_id))["status"] != "awaiting_human":
            await anyio.sleep(0.1)
    types = await session_events(db, sid)
    # The call was in flight when the pause came: its selection was recorded after it.
    assert types.index("SessionPaused") < types.index("CapabilitySelected")
    return sid, run_id


async def test_a_pause_during_a_streamed_write_decision_admits_nothing_until_resume(
    api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client, crm: httpx.Client
) -> None:
    note = {"customer_id": "ACME-42", "body": "Chat: held by the pause."}
    sid, run_id = await paused_mid_call(api, db, model, note, answer("Noted."))
    held = await run_row(db, run_id)
    assert (held["error_code"], held["pending_id"]) == ("SESSION_PAUSED", f"pause-{run_id}")
    await anyio.sleep(3)  # whatever would have followed the decision has had its chance
    assert (
        await db.fetchval("SELECT count(*) FROM admission.commands WHERE run_id = $1", run_id) == 0
    )
    assert (await view(api, sid))["waiting_for"]["kind"] == "resume"
    resumed = await act(api, sid, "resume")
    assert resumed.status_code == 202, resumed.text
    done = await until(api, sid, lambda v: v["state"] == "active" and v["turn"] == 1)
    assert done["messages"][-1]["text"] == "Noted."
    [command] = await db.fetch(
        "SELECT operation_id, state FROM admission.commands WHERE run_id = $1", run_id
    )
    assert command["state"] == "succeeded"
    assert len(notes_for(crm, f"acme:{command['operation_id']}")) == 1


async def test_a_close_while_paused_cancels_the_held_selection(
    stack: Stack, api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client
) -> None:
    note = {"customer_id": "ACME-42", "body": "Chat: never written."}
    sid, run_id = await paused_mid_call(api, db, model, note)
    closed = await act(api, sid, "close")
    assert (closed.status_code, closed.json()["state"]) == (202, "closed")
    with anyio.fail_after(40):
        while (await run_row(db, run_id))["status"] != "cancelled":
            await anyio.sleep(0.1)
    await anyio.sleep(2)
    assert (
        await db.fetchval("SELECT count(*) FROM admission.commands WHERE run_id = $1", run_id) == 0
    )
    code, out = await replay_of(db, stack, sid, run_id)
    assert code == 0 and f"run {run_id}: IDENTICAL" in out, out


async def test_a_plan_answer_after_the_session_closed_is_refused(
    api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client
) -> None:
    sid = await open_planning(api)
    script(model, select("crm.note.create", NOTE), answer("Plan: one note."))
    run_id = (await send(api, sid, "Note the call.")).json()["run_id"]
    plan = await plan_waiting(api, sid)
    closed = await act(api, sid, "close")
    assert closed.status_code == 202, closed.text
    for answer_ in ("approve", "reject"):
        late = await api.post(f"/plans/{plan}/{answer_}", json={}, headers=key())
        assert (late.status_code, late.json()["code"]) == (409, "SESSION_CLOSED"), late.text
    assert await db.fetchval("SELECT state FROM planner.plans WHERE plan_id = $1", plan) == (
        "proposed"
    )
    assert "PlanDecided" not in await session_events(db, sid)
    with anyio.fail_after(40):
        while (await run_row(db, run_id))["status"] != "cancelled":
            await anyio.sleep(0.1)
    assert (
        await db.fetchval("SELECT count(*) FROM admission.commands WHERE run_id = $1", run_id) == 0
    )


async def test_an_approver_of_the_tenant_answers_a_plan_another_principal_may_not(
    stack: Stack,
    api: httpx.AsyncClient,
    db: asyncpg.Connection,
    model: httpx.Client,
    crm: httpx.Client,
) -> None:
    sid = await open_planning(api)
    note = {"customer_id": "ACME-42", "body": "Chat: checked by an approver."}
    script(model, select("crm.note.create", note), answer("Plan: one note."), answer("Done."))
    run_id = (await send(api, sid, "Note the call.")).json()["run_id"]
    plan = await plan_waiting(api, sid)

    async def answer_as(principal: str, roles: list[str], body: Any = None) -> httpx.Response:
        token = stack.token("acme", principal, roles=roles)
        async with httpx.AsyncClient(
            base_url=stack.api_url, timeout=40, headers={"Authorization": f"Bearer {token}"}
        ) as other:
            return await other.post(f"/plans/{plan}/approve", json=body, headers=key())

    # Another principal of the tenant without the role: the plan is not theirs to see.
    stranger = await answer_as("bob@acme.example", [])
    assert (stranger.status_code, stranger.json()["code"]) == (404, "NOT_FOUND")
    # An approver of the tenant answers it (no body needed), and is recorded as its answerer.
    checked = await answer_as("carol@acme.example", ["approver"])
    assert (checked.status_code, checked.json()["state"]) == (200, "approved"), checked.text
    assert (
        await db.fetchval("SELECT answered_by FROM planner.plans WHERE plan_id = $1", plan)
        == "carol@acme.example"
    )
    await until(api, sid, lambda v: v["state"] == "active" and v["turn"] == 1)
    [command] = await db.fetch(
        "SELECT operation_id, state FROM admission.commands WHERE run_id = $1", run_id
    )
    assert command["state"] == "succeeded"
    assert len(notes_for(crm, f"acme:{command['operation_id']}")) == 1


async def test_a_fork_at_a_step_asks_the_model_again_and_copies_or_repeats_no_effect(
    api: httpx.AsyncClient,
    db: asyncpg.Connection,
    model: httpx.Client,
    crm: httpx.Client,
    stack: Stack,
) -> None:
    sid = await open_session(api, "chat-assistant")
    note = {"customer_id": "ACME-42", "body": f"Chat: forked twice {uuid.uuid4().hex[:8]}."}
    script(model, select("crm.note.create", note), answer("Noted."))
    run_id = (await send(api, sid, "Note the call.")).json()["run_id"]
    await until(api, sid, turn_ended(1))
    [op] = await db.fetch("SELECT operation_id FROM admission.commands WHERE run_id = $1", run_id)
    forks: list[str] = []
    for answer_text in ("Fork one: the note is there.", "Fork two: the note is there."):
        asked_before = len(model_requests(model))
        script(model, answer(answer_text))
        forked = await act(api, sid, "fork", turn=1, step=0)
        assert forked.status_code == 201, forked.text
        fork = forked.json()["session_id"]
        # The fork runs turn 1 again from after step 0, as a run of its own.
        assert (forked.json()["state"], forked.json()["run_id"]) == ("processing", f"{fork}-t1")
        seen = await until(api, fork, turn_ended(1))
        assert [m["text"] for m in seen["messages"] if m["role"] == "agent"] == [answer_text]
        # ... from a new model call, which saw the turn's message and the step's outcome.
        requests = model_requests(model)
        assert len(requests) == asked_before + 1
        asked = asked_of(requests[-1])
        assert "Note the call." in asked
        assert "This turn so far" in asked and "crm.note.create succeeded" in asked
        forks.append(fork)

    async def copy(fork: str) -> list[tuple[str, dict[str, Any]]]:
        """The fork's events up to its `SessionForked`: what it copied of the parent."""
        rows = await opened_events(db, stack, fork)
        types = [type_ for type_, _ in rows]
        return [
            (
                type_,
                {k: v for k, v in body.items() if k not in ("session_id", "n", "fork_session_id")},
            )
            for type_, body in rows[: types.index("SessionForked")]
        ]

    first, second = [await copy(f) for f in forks]
    assert first == second
    types = [t for t, _ in first]
    assert "StepOutcome" in types  # what became of the step, as history
    for effect in (
        "StepAdmitted",
        "StepDispatched",
        "ProposalMade",
        "PlanDecided",
        "TurnEnded",
        "TurnStarted",
    ):
        assert effect not in types, types
    assert not any("operation_id" in body for _, body in first)
    for fork in forks:
        assert (
            await db.fetchval(
                "SELECT count(*) FROM admission.commands WHERE run_id LIKE $1", f"{fork}%"
            )
            == 0
        )
    # The parent's note was written once, and no fork wrote it again.
    assert len(notes_for(crm, f"acme:{op['operation_id']}")) == 1
    assert [n["body"] for n in notes_for(crm)].count(note["body"]) == 1


async def test_a_plan_answer_whose_wake_was_lost_is_taken_up_by_the_sweep(
    api: httpx.AsyncClient, db: asyncpg.Connection, model: httpx.Client, crm: httpx.Client
) -> None:
    sid = await open_planning(api)
    note = {"customer_id": "ACME-42", "body": "Chat: woken by the sweep."}
    script(model, select("crm.note.create", note), answer("Plan: one note."), answer("Done."))
    run_id = (await send(api, sid, "Note the call.")).json()["run_id"]
    plan = await plan_waiting(api, sid)
    # The answer is committed and the wake that follows it never sent (as when the planner
    # dies between the two): nothing else would drive the turn again.
    await db.execute(
        "UPDATE planner.plans SET state = 'approved', answered_by = 'alice@acme.example' "
        "WHERE plan_id = $1",
        plan,
    )
    with anyio.fail_after(40):
        while (await run_row(db, run_id))["status"] != "succeeded":
            await anyio.sleep(0.1)
    [command] = await db.fetch(
        "SELECT operation_id, state FROM admission.commands WHERE run_id = $1", run_id
    )
    assert command["state"] == "succeeded"
    assert len(notes_for(crm, f"acme:{command['operation_id']}")) == 1


async def test_a_principal_lists_its_own_sessions_a_page_at_a_time(stack: Stack) -> None:
    principal = f"dora-{uuid.uuid4().hex[:8]}@acme.example"
    headers = {"Authorization": f"Bearer {stack.token('acme', principal)}"}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=40, headers=headers) as mine:
        opened = [await open_session(mine, "chat-assistant") for _ in range(3)]
        first = await mine.get("/sessions", params={"limit": 2})
        assert first.status_code == 200, first.text
        page = first.json()
        assert [s["session_id"] for s in page["sessions"]] == opened[::-1][:2]
        assert page["sessions"][0]["state"] == "active"
        rest = (await mine.get("/sessions", params={"limit": 2, "cursor": page["next"]})).json()
        assert [s["session_id"] for s in rest["sessions"]] == opened[:1]
        assert rest.get("next") is None
        bad = await mine.get("/sessions", params={"limit": 0})
        assert (bad.status_code, bad.json()["code"]) == (400, "INVALID_REQUEST")
    other = {"Authorization": f"Bearer {stack.token('acme', 'erin@acme.example')}"}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=40, headers=other) as theirs:
        listed = (await theirs.get("/sessions", params={"limit": 100})).json()
        assert not set(opened) & {s["session_id"] for s in listed["sessions"]}
