"""The chat invariants, after the load settled: every accepted message's turn ended (no session
left `processing`, no turn `running`), at most one CRM note per turn's operation (and one a
turn: the model's rules write one), and each session's event stream, as JetStream holds it,
numbered 1, 2, 3... without a gap or a repeat, up to what the planner recorded (streamed text,
`TextDelta` and `TextReset`, is live only: its `n` is 0 and it is not counted)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import asyncpg
import nats

from schemas import subjects
from schemas.sessions import CHAT_STREAM
from soak.deploy import TENANTS, admin_connect
from soak.invariant import Check
from soak.ledger import Ledger, Op
from writ.stack import Stack

__all__ = ["chat_checks", "chat_in_flight", "event_gaps", "turn_notes"]

_ENDED = ("succeeded", "failed", "cancelled")


async def chat_in_flight(db: asyncpg.Connection) -> dict[str, int]:
    """Sessions still `processing` and turns still `running` (settling waits for none)."""
    sessions = await db.fetchval(
        "SELECT count(*) FROM planner.sessions WHERE tenant = ANY($1) AND state = 'processing'",
        list(TENANTS),
    )
    turns = await db.fetchval(
        "SELECT count(*) FROM planner.session_turns t JOIN planner.sessions s USING "
        "(session_id) WHERE s.tenant = ANY($1) AND t.status = 'running'",
        list(TENANTS),
    )
    return {"sessions_processing": sessions, "turns_running": turns}


async def chat_checks(
    stack: Stack,
    ledger: Ledger,
    db: asyncpg.Connection,
    commands: dict[str, dict[str, Any]],
    notes: list[dict[str, Any]],
) -> list[Check]:
    """The three chat checks."""
    ids = list(ledger.sessions)
    sessions = {
        r["session_id"]: dict(r)
        for r in await db.fetch(
            "SELECT session_id, tenant, state, last_n, published_n FROM planner.sessions "
            "WHERE session_id = ANY($1)",
            ids,
        )
    }
    runs = {
        r["run_id"]: r["status"]
        for r in await db.fetch(
            "SELECT t.run_id, r.status FROM planner.session_turns t "
            "LEFT JOIN planner.runs r USING (run_id) WHERE t.session_id = ANY($1)",
            ids,
        )
    }
    accepted = ledger.accepted("chat")

    ended = Check("every_accepted_chat_message_ended_its_turn", examined=len(accepted))
    for op in accepted:
        status = runs.get(op.run_id)
        if status not in _ENDED:
            ended.fail(
                f"message {op.request_id} on {op.session_id}: its turn {op.run_id} "
                f"is {status or 'not recorded'}"
            )
    for session_id, row in sessions.items():
        if row["state"] == "processing":
            ended.fail(f"session {session_id} is still processing")
    busy = sum(op.busy for op in ledger.ops.values() if op.kind == "chat")
    statuses = Counter(str(runs.get(op.run_id)) for op in accepted)
    ended.note = (
        f"{len(accepted)} turns started, {busy} messages refused SESSION_BUSY; "
        f"turns {dict(statuses)}"
    )

    once = turn_notes(accepted, commands, notes)
    events = Check("session_events_numbered_without_gaps", examined=len(sessions))
    seen = await _session_events(stack)
    for problem in event_gaps(sessions, seen):
        events.fail(problem)
    return [ended, once, events]


def turn_notes(
    accepted: list[Op], commands: dict[str, dict[str, Any]], notes: list[dict[str, Any]]
) -> Check:
    """At most one note per operation of a turn, and one note-writing operation a turn."""
    result = Check("at_most_one_crm_note_per_turn", examined=len(accepted))
    by_key = Counter(note["idempotency_key"] for note in notes)
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for command in commands.values():
        if command.get("run_id") and command["action"] == "crm.note.create":
            by_run[command["run_id"]].append(command)
    for op in accepted:
        written = 0
        for command in by_run.get(op.run_id, []):
            n = by_key.get(f"{command['tenant']}:{command['operation_id']}", 0)
            written += n > 0
            if n > 1:
                result.fail(f"turn {op.run_id}: {n} notes for operation {command['operation_id']}")
        if written > 1:
            result.fail(
                f"turn {op.run_id} wrote {written} notes (operations "
                f"{[c['operation_id'] for c in by_run[op.run_id]]})"
            )
    return result


def event_gaps(sessions: dict[str, dict[str, Any]], seen: dict[str, list[int]]) -> list[str]:
    """Each session's numbers on its stream must be 1..last_n, in order, once each."""
    problems = []
    for session_id, row in sessions.items():
        numbers = seen.get(session_id, [])
        expected = list(range(1, row["last_n"] + 1))
        if numbers != expected:
            repeated = [n for n, k in Counter(numbers).items() if k > 1]
            missing = sorted(set(expected) - set(numbers))
            problems.append(
                f"session {session_id}: {len(numbers)} events on the stream, "
                f"{row['last_n']} recorded; missing {missing[:10]}, repeated "
                f"{repeated[:10]}"
            )
    return problems


async def _session_events(stack: Stack) -> dict[str, list[int]]:
    """Every event's number `n` on the chat stream, by session, in stream order."""
    nc = await admin_connect(stack, connect_timeout=10)
    out: dict[str, list[int]] = defaultdict(list)
    try:
        js = nc.jetstream()
        if not (await js.stream_info(CHAT_STREAM)).state.messages:
            return out
        sub = await js.subscribe(subjects.CHAT_FAMILY, stream=CHAT_STREAM, ordered_consumer=True)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=10)
                except nats.errors.TimeoutError:
                    break
                session_id = msg.subject.split(".", 3)[3]
                n = int(json.loads(msg.data).get("n", 0))
                if n:  # 0: text as it streams, shown live and never recorded (TextDelta)
                    out[session_id].append(n)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    return out
