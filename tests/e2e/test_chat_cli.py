"""`writ chat` as a real subprocess, driven through its stdin and stdout against the real
deployment: a turn shown as it happens, pause / inject / resume, a refusal shown in place, a
fork the chat moves into, and close; then the sessions' state read back through the SDK."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg
import httpx
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from tests.e2e.conftest import notes_for
from writ.stack import Stack
from writ_client import Client, Issuer

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
ASK = "Note the delayed shipment call"


class Terminal:
    """The chat's standard input and output, line by line."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._out = TextReceiveStream(process.stdout)
        self._buffer = ""
        self.lines: list[str] = []

    async def type(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(f"{line}\n".encode())

    async def expect(self, pattern: str, *, timeout_s: float = 60) -> re.Match[str]:
        """Read lines until one matches `pattern`; what was read stays in `lines`."""
        try:
            with anyio.fail_after(timeout_s):
                while True:
                    while "\n" in self._buffer:
                        line, self._buffer = self._buffer.split("\n", 1)
                        self.lines.append(line)
                        if match := re.search(pattern, line):
                            return match
                    self._buffer += await self._out.receive()
        except TimeoutError:
            shown = "\n".join(self.lines[-30:])
            raise AssertionError(
                f"no line matched {pattern!r}; the chat showed:\n{shown}\n{self._buffer}"
            ) from None


@asynccontextmanager
async def chat(stack: Stack, *args: str) -> AsyncIterator[Terminal]:
    command = [
        sys.executable,
        "-m",
        "writ.cli",
        "chat",
        *args,
        "--home",
        str(stack.home),
        "--url",
        stack.api_url,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    async with await anyio.open_process(command, env=env) as process:
        try:
            yield Terminal(process)
        finally:
            if process.returncode is None:
                process.terminate()


async def test_a_chat_in_the_terminal(
    stack: Stack, crm: httpx.Client, db: asyncpg.Connection
) -> None:
    async with chat(stack, "crm-assistant") as term:
        session_id = (await term.expect(r"^\[session (\S+) with crm-assistant\]$"))[1]
        await term.type(ASK)
        await term.expect(rf"^you: {ASK}$")
        await term.expect(r"^\[turn 1\]$")
        await term.expect(r"^  · using crm\.note\.create$")
        await term.expect(r"^\[turn 1 succeeded\]$")
        # The answer (streamed as deltas) and the note's outcome, in whichever order the
        # session's events put them.
        assert "  · crm.note.create: succeeded" in term.lines
        [answer] = [line[7:] for line in term.lines if line.startswith("agent: ")]
        await term.type("/pause")
        await term.expect(r"^\[paused\]$")
        await term.type("a message while paused")
        await term.expect(r"^\[refused: (SESSION_PAUSED|INVALID_TRANSITION): ")
        await term.type("/inject Mention order 7781")
        await term.expect(r"^\[injected: Mention order 7781\]$")
        await term.type("/resume")
        await term.expect(r"^\[resumed\]$")
        await term.type("/frobnicate")
        await term.expect(r"^\[not understood: /frobnicate\]")
        await term.type("/fork 1")
        fork_id = (await term.expect(r"^\[now in the fork (\S+)\]$"))[1]
        # The fork's stream replays the parent's history up to turn 1, then goes on.
        await term.expect(rf"^\[session {fork_id} with crm-assistant\]$")
        await term.type("/close")
        await term.expect(r"^\[closed\]$")
        with anyio.fail_after(30):
            assert await term.process.wait() == 0
    assert fork_id != session_id
    issuer = Issuer.from_file(
        stack.secrets / "host-acme.pem", tenant="acme", issuer=stack.issuer("acme")
    )
    async with Client(stack.api_url, issuer, "alice@acme.example") as client:
        parent = await client.session(session_id).history()
        fork = await client.session(fork_id).history()
    assert parent.state == "active" and parent.turn == 1
    assert any(m.role == "agent" and m.text == answer for m in parent.messages)
    assert ("injected", "Mention order 7781") in [(m.role, m.text) for m in parent.messages]
    assert (fork.state, fork.parent_session_id) == ("closed", session_id)
    # One note for the one turn that made it: the fork executed nothing again.
    [row] = await db.fetch(
        "SELECT operation_id FROM admission.commands WHERE run_id = $1", parent.run_id
    )
    assert len(notes_for(crm, f"acme:{row[0]}")) == 1
    assert (
        await db.fetchval(
            "SELECT count(*) FROM admission.commands WHERE run_id LIKE $1", f"{fork_id}%"
        )
        == 0
    )


async def test_end_of_input_leaves_the_session_as_it_is(stack: Stack) -> None:
    async with chat(stack, "crm-assistant") as term:
        session_id = (await term.expect(r"^\[session (\S+) with crm-assistant\]$"))[1]
        await term.type("/help")
        await term.expect(r"^commands: /pause")
        assert term.process.stdin is not None
        await term.process.stdin.aclose()
        with anyio.fail_after(30):
            assert await term.process.wait() == 0
    async with chat(stack, "crm-assistant", "--session", session_id) as term:
        await term.expect(rf"^\[session {session_id} with crm-assistant\]$")
        await term.type("/quit")
        with anyio.fail_after(30):
            assert await term.process.wait() == 0
    async with chat(stack, "crm-assistant", "--session", "no-such-session") as term:
        with anyio.fail_after(30):
            assert await term.process.wait() == 1


async def test_a_decision_asked_in_the_chat_is_answered_in_place(
    stack: Stack, payments: httpx.Client, db: asyncpg.Connection
) -> None:
    async with chat(stack, "billing-assistant", "--roles", "approver") as term:
        session_id = (await term.expect(r"^\[session (\S+) with billing-assistant\]$"))[1]
        await term.type("Charge the expedited shipping")
        proposal = (
            await term.expect(r"^\[proposal (\S+): payment\.charge\.create .*amount_cents=4900")
        )[1]
        pending = (await term.expect(r"^\[waiting for a person's decision (\S+): "))[1]
        # A charge moves money: no standing grant may cover it, so "always" is not offered.
        await term.expect(r"^allow it\? y \(once\), or n \(deny\)$")
        await term.type("y")
        # Separation of duties: the person chatting asked for this charge, so their own
        # approval is refused in place and the question stays open for another approver.
        await term.expect(rf"^\[decision {pending} not taken: SEPARATION_OF_DUTIES: ")
        issuer = Issuer.from_file(
            stack.secrets / "host-acme.pem", tenant="acme", issuer=stack.issuer("acme")
        )
        async with Client(stack.api_url, issuer, "bob@acme.example", roles=("approver",)) as bob:
            # Answered where the preview is shown: the decision names its proposal.
            assert not (await bob.decide(pending, "once")).accepted
            assert (await bob.decide(pending, "once", proposal_id=proposal)).accepted
        await term.expect(r"^  · payment\.charge\.create: succeeded$")
        await term.expect(r"^\[turn 1 succeeded\]$")
        await term.type("/quit")
        with anyio.fail_after(30):
            assert await term.process.wait() == 0
    [row] = await db.fetch(
        "SELECT operation_id FROM admission.commands WHERE run_id = $1", f"{session_id}-t1"
    )
    charges = [
        c for c in payments.get("/_control/charges").json() if c["reference"].endswith(f":{row[0]}")
    ]
    assert len(charges) == 1 and charges[0]["amount_cents"] == 4900


async def test_a_plan_shown_and_approved_in_place_then_the_answer_streamed(
    stack: Stack, crm: httpx.Client, db: asyncpg.Connection
) -> None:
    async with chat(stack, "chat-assistant", "--plan-mode") as term:
        session_id = (await term.expect(r"^\[session (\S+) with chat-assistant\]$"))[1]
        await term.type("Please note the shipment update")
        plan_id = (await term.expect(r"^\[plan (\S+)\]$"))[1]
        await term.expect(r"^    1\. crm\.note\.create .*customer_id='ACME-42'")
        await term.expect(r"^approve this plan\? y to approve")
        await term.type("y")
        await term.expect(r"^\[plan approved\]$")
        await term.expect(
            r"^agent: Done: the note about order 7781 is on Acme Corporation's "
            r"record\.$"
        )
        await term.expect(r"^\[turn 1 succeeded\]$")
        await term.expect(r"^    1\. crm\.note\.create: succeeded$")  # the plan's step, run
        await term.type("/quit")
        with anyio.fail_after(30):
            assert await term.process.wait() == 0
    assert (
        await db.fetchval(
            "SELECT count(*) FROM planner.plans WHERE plan_id = $1 AND state = 'approved'", plan_id
        )
        == 1
    )
    [row] = await db.fetch(
        "SELECT operation_id FROM admission.commands WHERE run_id = $1", f"{session_id}-t1"
    )
    assert len(notes_for(crm, f"acme:{row[0]}")) == 1


async def test_the_demo_chat_agent_answers_a_question_as_a_script_and_writes_nothing(
    stack: Stack, db: asyncpg.Connection
) -> None:
    async with chat(stack, "chat-assistant") as term:
        session_id = (await term.expect(r"^\[session (\S+) with chat-assistant\]$"))[1]
        await term.type("What time zone is Acme in? Do not change anything.")
        await term.expect(r"^agent: I am the demo's scripted chat agent, not a model")
        await term.expect(r"^\[turn 1 succeeded\]$")
        await term.type("/close")
        await term.expect(r"^\[closed\]$")
        with anyio.fail_after(30):
            assert await term.process.wait() == 0
    run_id = f"{session_id}-t1"
    assert await db.fetchval(
        "SELECT plan_mode FROM planner.sessions WHERE session_id = $1", session_id
    )
    for table in ("admission.commands", "planner.plans"):
        assert await db.fetchval(f"SELECT count(*) FROM {table} WHERE run_id = $1", run_id) == 0
    kinds = await db.fetch("SELECT kind FROM planner.steps WHERE run_id = $1", run_id)
    assert [k["kind"] for k in kinds] == ["decision"]
