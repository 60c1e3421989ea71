"""The SDK's `Session` (`writ_client`) against the real deployment over HTTP: a turn read from
the session's event stream, the history, resuming the stream after the last event seen, and
the session's writes (pause, resume, inject, close, fork) with Writ's refusal codes."""

from __future__ import annotations

import uuid

import anyio
import asyncpg
import httpx
import pytest

from tests.e2e.conftest import notes_for
from writ.stack import Stack
from writ_client import Client, Issuer, NatsClient, Session, WritError
from writ_client.types import (
    AnySessionEvent,
    PlanDecided,
    PlanProposed,
    SessionClosed,
    SessionOpened,
    StepOutcome,
    TextDelta,
    TextReset,
    TurnEnded,
    TurnStarted,
    UserMessage,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
ASK = "Note the delayed shipment call"


def issuer(stack: Stack, tenant: str = "acme") -> Issuer:
    return Issuer.from_file(
        stack.secrets / f"host-{tenant}.pem", tenant=tenant, issuer=stack.issuer(tenant)
    )


async def collect(
    session: Session, *, until: type, after: int | None = None, timeout_s: float = 60
) -> list[AnySessionEvent]:
    """The session's events up to the first `until` one."""
    seen: list[AnySessionEvent] = []
    with anyio.fail_after(timeout_s):
        async for event in session.events(after=after):
            seen.append(event)
            if isinstance(event, until):
                return seen
    raise AssertionError("unreachable")


async def test_a_turn_through_the_session_its_history_and_a_resumed_stream(
    stack: Stack, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    async with Client(stack.api_url, issuer(stack), "alice@acme.example") as client:
        key = f"sdk-session-{uuid.uuid4().hex[:12]}"
        session = await client.open_session("crm-assistant", request_id=key)
        again = await client.open_session("crm-assistant", request_id=key)
        assert again.session_id == session.session_id  # one key, one session
        turn, ids = [], []
        with anyio.fail_after(60):
            async for event in session.turn(ASK):
                turn.append(event)
                ids.append(session.last_event_id)  # the event's stream sequence
        assert ids == sorted(set(ids)) and ids[-1] == session.last_event_id
        kinds = [type(e).__name__ for e in turn]
        assert kinds[0] == "SessionOpened" and kinds[-1] == "TurnEnded", kinds
        numbered = [e.n for e in turn if e.n]  # text deltas and resets carry n = 0
        assert numbered == list(range(1, len(numbered) + 1))  # in order, no gap
        opened, ended = turn[0], turn[-1]
        assert isinstance(opened, SessionOpened) and opened.agent == "crm-assistant"
        assert isinstance(ended, TurnEnded) and ended.status == "succeeded"
        assert any(isinstance(e, UserMessage) and e.text == ASK for e in turn)
        assert any(isinstance(e, TurnStarted) and e.run_id == ended.run_id for e in turn)
        # The history says the same, and the note was made once.
        view = await session.history()
        assert (view.state, view.turn, view.agent) == ("active", 1, "crm-assistant")
        assert [(m.role, m.text) for m in view.messages if m.role == "user"] == [("user", ASK)]
        assert any(m.role == "agent" and m.text == ended.answer for m in view.messages)
        [outcome] = [e for e in turn if isinstance(e, StepOutcome)]
        assert (outcome.action, outcome.state) == ("crm.note.create", "succeeded")
        [operation_id] = await db.fetch(
            "SELECT operation_id FROM admission.commands WHERE run_id = $1", ended.run_id
        )
        assert len(notes_for(crm, f"acme:{operation_id[0]}")) == 1
        # Resuming from any event id gives exactly the events after it: no gap, no duplicate.
        middle = len(turn) // 2
        fresh = client.session(session.session_id)
        resumed = await collect(fresh, until=TurnEnded, after=ids[middle])
        assert resumed == turn[middle + 1 :]
        # A busy-free second message on the same session is the next turn.
        with anyio.fail_after(60):
            second = [event async for event in session.turn("And again, please")]
        assert isinstance(second[-1], TurnEnded) and second[-1].turn == 2
        assert not any(isinstance(e, SessionOpened) for e in second)  # resumed after turn 1
        # A fork at turn 1: the parent's history up to there, its note not made again.
        forked = await session.fork(1)
        fork_view = await forked.history()
        assert forked.session_id != session.session_id
        assert (fork_view.parent_session_id, fork_view.fork_turn) == (session.session_id, 1)
        assert [(m.role, m.text) for m in fork_view.messages] == [
            (m.role, m.text) for m in view.messages
        ]
        assert len(notes_for(crm, f"acme:{operation_id[0]}")) == 1
        with pytest.raises(WritError) as missing:
            await session.approve_plan("plan-unknown")
        assert (missing.value.code, missing.value.status) == ("NOT_FOUND", 404)


async def test_pause_resume_inject_close_and_refusals(stack: Stack) -> None:
    async with Client(stack.api_url, issuer(stack), "alice@acme.example") as client:
        session = await client.open_session("crm-assistant")
        paused = await session.pause()
        assert paused.state == "paused"
        with pytest.raises(WritError) as refused:
            await session.send("while paused")
        assert refused.value.code in ("SESSION_PAUSED", "INVALID_TRANSITION")
        injected = await session.inject("Mention the order number 7781")
        assert injected.session_id == session.session_id
        assert (await session.resume()).state == "active"
        closed = await session.close()
        assert closed.state == "closed"
        events = await collect(session, until=SessionClosed, after=0)
        assert [type(e).__name__ for e in events][-1] == "SessionClosed"
        with pytest.raises(WritError) as refused:
            await session.send("after close")
        assert (refused.value.code, refused.value.status) == ("SESSION_CLOSED", 409)
        assert (await session.history()).state == "closed"
    async with Client(stack.api_url, issuer(stack), "mallory@acme.example") as other:
        with pytest.raises(WritError) as hidden:
            await other.session(session.session_id).history()
        assert hidden.value.code == "NOT_FOUND"


async def turn_events(
    session: Session, text: str, *, until: type = TurnEnded
) -> list[AnySessionEvent]:
    await session.send(text)
    return await collect(session, until=until)


def streamed(events: list[AnySessionEvent]) -> list[str]:
    """The text each model step streamed, resets applied (what a client keeps)."""
    texts: dict[tuple[int, int], str] = {}
    for event in events:
        if isinstance(event, TextDelta):
            texts[(event.turn, event.step)] = texts.get((event.turn, event.step), "") + event.text
        elif isinstance(event, TextReset):
            texts[(event.turn, event.step)] = ""
    return [t for t in texts.values() if t]


async def test_a_plan_approved_and_one_rejected_through_the_sdk_with_streamed_text(
    stack: Stack, db: asyncpg.Connection
) -> None:
    async with Client(stack.api_url, issuer(stack), "alice@acme.example") as client:
        session = await client.open_session("chat-assistant", plan_mode=True)
        first = await turn_events(session, "Please note the shipment update", until=PlanProposed)
        [proposed] = [e for e in first if isinstance(e, PlanProposed)]
        assert [s.capability for s in proposed.plan.steps] == ["crm.note.create"]
        assert (await session.history()).waiting_for.kind == "plan"  # type: ignore[union-attr]
        answered = await session.approve_plan(proposed.plan.plan_id, reason="go ahead")
        assert (answered.plan_id, answered.state) == (proposed.plan.plan_id, "approved")
        rest = await collect(session, until=TurnEnded)
        assert any(isinstance(e, PlanDecided) and e.answer == "approved" for e in rest)
        ended = rest[-1]
        assert isinstance(ended, TurnEnded) and ended.status == "succeeded"
        # The model's answers reached the SDK as deltas, batched, whole once reset applied.
        deltas = [e for e in first + rest if isinstance(e, TextDelta)]
        assert len(deltas) >= 2 and all(e.n == 0 for e in deltas)
        assert ended.answer in streamed(first + rest)
        with pytest.raises(WritError) as again:  # answered already: it stays as answered
            await session.reject_plan(proposed.plan.plan_id, "too late")
        assert (again.value.code, again.value.status) == ("PLAN_ANSWERED", 409)

        other = await client.open_session("chat-assistant", plan_mode=True)
        events = await turn_events(other, "Please note the shipment update", until=PlanProposed)
        [proposed] = [e for e in events if isinstance(e, PlanProposed)]
        rejected = await other.reject_plan(proposed.plan.plan_id, "not this customer")
        assert rejected.state == "rejected"
        ended = (await collect(other, until=TurnEnded))[-1]
        assert isinstance(ended, TurnEnded) and ended.status != "succeeded"
        assert (
            await db.fetchval(
                "SELECT count(*) FROM admission.commands WHERE run_id = $1", ended.run_id
            )
            == 0
        )


async def test_the_same_session_methods_over_nats_as_the_tenants_host(
    stack: Stack, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    client = NatsClient(await stack.host_connection("acme"), issuer(stack), "alice@acme.example")
    try:
        key = f"sdk-nats-session-{uuid.uuid4().hex[:12]}"
        session = await client.open_session("crm-assistant", request_id=key)
        assert (
            await client.open_session("crm-assistant", request_id=key)
        ).session_id == session.session_id
        turn, ids = [], []
        with anyio.fail_after(60):
            async for event in session.turn(ASK):
                turn.append(event)
                ids.append(session.last_event_id)
        assert isinstance(turn[0], SessionOpened) and isinstance(turn[-1], TurnEnded)
        assert turn[-1].status == "succeeded" and ids == sorted(set(ids))
        [row] = await db.fetch(
            "SELECT operation_id FROM admission.commands WHERE run_id = $1", turn[-1].run_id
        )
        assert len(notes_for(crm, f"acme:{row[0]}")) == 1
        # Resumed after any sequence: exactly the events after it, as over SSE.
        resumed = await collect(client.session(session.session_id), until=TurnEnded, after=ids[1])
        assert resumed == turn[2:]
        view = await session.history()
        assert (view.state, view.turn) == ("active", 1)
        assert (await session.pause()).state == "paused"
        with pytest.raises(WritError) as refused:
            await session.send("while paused")
        assert refused.value.code == "SESSION_PAUSED"
        assert (await session.close()).state == "closed"
        with pytest.raises(WritError) as missing:
            await client.reject_plan("plan-unknown", "no")
        assert missing.value.code == "NOT_FOUND"
    finally:
        await client.aclose()
