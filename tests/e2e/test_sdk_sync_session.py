"""The SDK's blocking client (`SyncClient`) drives chat sessions against the real deployment
over HTTP, with the async `Session`'s methods (`SyncSession` runs them on the client's loop
thread): a turn read as a plain iterator, the history, the stream resumed after the last event
seen, pause / inject / resume / close / fork with Writ's refusal codes, and a plan approved and
one rejected by their ids."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from tests.e2e.conftest import notes_for
from tests.e2e.test_sdk_session import ASK, issuer
from writ.stack import Stack
from writ_client import SyncClient, SyncSession, WritError
from writ_client.types import (
    AnySessionEvent,
    PlanDecided,
    PlanProposed,
    SessionClosed,
    SessionInjected,
    SessionOpened,
    SessionPaused,
    SessionResumed,
    StepOutcome,
    TextDelta,
    TurnEnded,
)

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def client(stack: Stack) -> Iterator[SyncClient]:
    with SyncClient(stack.api_url, issuer(stack), "alice@acme.example") as sync:
        yield sync


def until(session: SyncSession, kind: type, *, after: int | None = None) -> list[AnySessionEvent]:
    """The session's events up to the first `kind` one (the test's timeout bounds it)."""
    seen: list[AnySessionEvent] = []
    for event in session.events(after=after):
        seen.append(event)
        if isinstance(event, kind):
            break
    return seen


def commands_of(stack: Stack, run_id: str) -> list[Any]:
    async def read() -> list[Any]:
        conn = await asyncpg.connect(stack.database_dsn)
        try:
            return [
                r["operation_id"]
                for r in await conn.fetch(
                    "SELECT operation_id FROM admission.commands WHERE run_id = $1", run_id
                )
            ]
        finally:
            await conn.close()

    return anyio.run(read)


def test_a_turn_its_history_a_resumed_stream_and_a_fork_through_the_sync_client(
    stack: Stack, client: SyncClient, crm: httpx.Client
) -> None:
    key = f"sync-session-{uuid.uuid4().hex[:12]}"
    session = client.open_session("crm-assistant", request_id=key)
    assert isinstance(session, SyncSession)
    assert (
        client.open_session("crm-assistant", request_id=key).session_id == session.session_id
    )  # one key, one session
    turn, ids = [], []
    for event in session.turn(ASK):
        turn.append(event)
        ids.append(session.last_event_id)
    assert isinstance(turn[0], SessionOpened) and isinstance(turn[-1], TurnEnded)
    assert turn[-1].status == "succeeded" and ids == sorted(set(ids))
    numbered = [e.n for e in turn if e.n]
    assert numbered == list(range(1, len(numbered) + 1))  # in order, no gap
    [outcome] = [e for e in turn if isinstance(e, StepOutcome)]
    assert (outcome.action, outcome.state) == ("crm.note.create", "succeeded")
    [operation_id] = commands_of(stack, turn[-1].run_id)
    assert len(notes_for(crm, f"acme:{operation_id}")) == 1
    view = session.history()
    assert (view.state, view.turn) == ("active", 1)
    assert any(m.role == "agent" and m.text == turn[-1].answer for m in view.messages)
    # Another object for the same session resumes after any event: exactly what follows.
    middle = len(turn) // 2
    assert (
        until(client.session(session.session_id), TurnEnded, after=ids[middle])
        == turn[middle + 1 :]
    )
    forked = session.fork(1)
    assert isinstance(forked, SyncSession) and forked.session_id != session.session_id
    fork_view = forked.history()
    assert (fork_view.parent_session_id, fork_view.fork_turn) == (session.session_id, 1)
    assert [(m.role, m.text) for m in fork_view.messages] == [
        (m.role, m.text) for m in view.messages
    ]
    assert len(notes_for(crm, f"acme:{operation_id}")) == 1  # history, not run again


def test_pause_inject_resume_close_and_refusals_through_the_sync_client(
    stack: Stack, client: SyncClient
) -> None:
    session = client.open_session("crm-assistant")
    assert session.pause().state == "paused"
    with pytest.raises(WritError) as refused:
        session.send("while paused")
    assert (refused.value.code, refused.value.status) == ("SESSION_PAUSED", 409)
    assert session.inject("Mention the order number 7781").session_id == session.session_id
    assert session.resume().state == "active"
    assert session.close().state == "closed"
    events = until(session, SessionClosed, after=0)
    assert [type(e) for e in events[1:]] == [
        SessionPaused,
        SessionInjected,
        SessionResumed,
        SessionClosed,
    ]
    with pytest.raises(WritError) as closed:
        session.send("after close")
    assert (closed.value.code, closed.value.status) == ("SESSION_CLOSED", 409)
    assert session.history().state == "closed"
    with SyncClient(stack.api_url, issuer(stack), "mallory@acme.example") as other:
        with pytest.raises(WritError) as hidden:
            other.session(session.session_id).history()
        assert hidden.value.code == "NOT_FOUND"


def test_a_plan_approved_and_one_rejected_through_the_sync_client(
    stack: Stack, client: SyncClient
) -> None:
    session = client.open_session("chat-assistant", plan_mode=True)
    session.send("Please note the shipment update")
    first = until(session, PlanProposed)
    [proposed] = [e for e in first if isinstance(e, PlanProposed)]
    assert [s.capability for s in proposed.plan.steps] == ["crm.note.create"]
    waiting = session.history().waiting_for
    assert waiting is not None and waiting.kind == "plan"
    answered = session.approve_plan(proposed.plan.plan_id)
    assert (answered.plan_id, answered.state) == (proposed.plan.plan_id, "approved")
    rest = until(session, TurnEnded)
    assert any(isinstance(e, PlanDecided) and e.answer == "approved" for e in rest)
    assert any(isinstance(e, TextDelta) for e in first + rest)
    ended = rest[-1]
    assert isinstance(ended, TurnEnded) and ended.status == "succeeded"
    assert len(commands_of(stack, ended.run_id)) == 1

    other = client.open_session("chat-assistant", plan_mode=True)
    other.send("Please note the shipment update")
    [proposed] = [e for e in until(other, PlanProposed) if isinstance(e, PlanProposed)]
    assert other.reject_plan(proposed.plan.plan_id, "not this customer").state == "rejected"
    ended = until(other, TurnEnded)[-1]
    assert isinstance(ended, TurnEnded) and (ended.status, ended.code) == ("failed", "REJECTED")
    assert commands_of(stack, ended.run_id) == []
    with pytest.raises(WritError) as again:  # answered already: it stays as answered
        client.reject_plan(proposed.plan.plan_id, "too late")
    assert (again.value.code, again.value.status) == ("PLAN_ANSWERED", 409)
