"""`writ audit replay` and `writ.int.planner.replay` against a run of the real deployment: the
planner journals every captured model response, tool output and status change with what it
records; replay walks them offline and finds an edit of the runtime's record."""

from __future__ import annotations

import subprocess
import sys

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from schemas import subjects
from schemas.host import RunResult
from schemas.planner import ReplayReport, ReplayRun
from tests.e2e import conftest
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def writ_audit(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", "audit", *args, "--home", str(stack.home)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def sealed(stack: Stack, db: asyncpg.Connection, run_id: str) -> None:
    try:
        await conftest.sealed(db, run_id)
    except TimeoutError:
        raise AssertionError(stack.log_tail("planner")) from None


async def test_a_run_replays_identical_and_an_edited_step_is_divergent(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id)
    assert result.status == "succeeded", result
    run_id = result.run_id
    assert run_id is not None
    await sealed(stack, db, run_id)

    # Each step and status change journaled once, in the order the planner recorded them.
    kinds = [
        r["kind"]
        for r in await db.fetch(
            "SELECT j.kind FROM planner.journal j JOIN planner.journal_seals s "
            "ON s.entry_id = j.id WHERE j.run_id = $1 ORDER BY s.seq",
            run_id,
        )
    ]
    assert kinds == [
        "run.started",
        "step.decision",
        "proposal",
        "step.observation",
        "step.decision",
        "run.status",
    ]
    # Nothing readable at rest: not the request, not the evidence the model saw.
    for text in (request.input, "ACME-42"):
        assert not await db.fetchval(
            "SELECT count(*) FROM planner.journal WHERE position(convert_to($1, 'UTF8') "
            "IN ciphertext) > 0",
            text,
        )

    replay = writ_audit(stack, "replay", run_id)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.startswith(f"run {run_id}: IDENTICAL (6 captured entries")
    verify = writ_audit(
        stack,
        "verify",
        "--service",
        "planner",
        "--data-keys",
        str(stack.secrets / "journal-planner-data.json"),
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("planner: intact")

    # The same over the bus, for hosts.
    reply = await host.nc.request(
        subjects.REPLAY, msgspec.json.encode(ReplayRun(tenant="acme", run_id=run_id)), timeout=10
    )
    report = msgspec.json.decode(reply.data, type=ReplayReport)
    assert (report.verdict, report.divergences, report.missing, report.entries) == (
        "identical",
        [],
        [],
        6,
    )
    # Another tenant's host learns nothing of the run.
    other = await host.nc.request(
        subjects.REPLAY, msgspec.json.encode(ReplayRun(tenant="globex", run_id=run_id)), timeout=10
    )
    assert other.headers and other.headers.get("Nats-Service-Error-Code") == "404"

    # Someone rewrites the runtime's record of the model's answer: replay names the step.
    answer_step = await db.fetchval(
        "SELECT max(seq) FROM planner.steps WHERE run_id = $1 AND kind = 'decision'", run_id
    )
    edit = (
        "UPDATE planner.steps SET payload = jsonb_set(payload, '{answer}', to_jsonb($3::text))"
        " WHERE run_id = $1 AND seq = $2 RETURNING (SELECT payload->>'answer' FROM "
        "planner.steps WHERE run_id = $1 AND seq = $2)"
    )
    original = await db.fetchval(edit, run_id, answer_step, "I refunded everything.")
    try:
        bad = writ_audit(stack, "replay", run_id)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert f"run {run_id}: DIVERGENT" in bad.stdout
        assert f"step {answer_step}:" in bad.stdout
        assert "I refunded everything." in bad.stdout
        reply = await host.nc.request(
            subjects.REPLAY,
            msgspec.json.encode(ReplayRun(tenant="acme", run_id=run_id)),
            timeout=10,
        )
        report = msgspec.json.decode(reply.data, type=ReplayReport)
        assert report.verdict == "divergent"
        assert [d.step for d in report.divergences] == [answer_step]
    finally:
        await db.execute(edit, run_id, answer_step, original)
    assert writ_audit(stack, "replay", run_id).returncode == 0

    # A run nobody started cannot be replayed.
    missing = writ_audit(stack, "replay", "run-that-never-was", "--tenant", "acme")
    assert missing.returncode == 3


async def test_a_run_stopped_for_a_person_is_incomplete_until_answered_then_identical(
    stack: Stack, host: Host, db: asyncpg.Connection, payments: httpx.Client
) -> None:
    # The refund agent has no grant for refunds: its run stops for a person, who rejects it
    # (so no refund is made in the session's shared payment provider).
    request = host.request(
        agent="refund-assistant", text="Léo's sibling discount is missing; refund it."
    )
    await host.publish(request)
    waiting = await host.wait_result(request.request_id)
    assert waiting.status == "awaiting_human" and waiting.proposal is not None
    run_id = waiting.run_id
    assert run_id is not None
    await sealed(stack, db, run_id)
    stopped = writ_audit(stack, "replay", run_id)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    assert "INCOMPLETE" in stopped.stdout and "awaiting_human" in stopped.stdout

    await host.approve(waiting.proposal.proposal_id, answer="reject", reason="not this one")
    with anyio.fail_after(30):
        while not any(
            isinstance(r, RunResult) and r.status == "failed"
            for r in await host.results(request.request_id)
        ):
            await anyio.sleep(0.1)
    await sealed(stack, db, run_id)
    kinds = [
        r["kind"]
        for r in await db.fetch(
            "SELECT j.kind FROM planner.journal j JOIN planner.journal_seals s "
            "ON s.entry_id = j.id WHERE j.run_id = $1 ORDER BY s.seq",
            run_id,
        )
    ]
    assert kinds == [
        "run.started",
        "step.decision",
        "proposal",
        "run.status",
        "step.observation",
        "run.status",
    ]
    done = writ_audit(stack, "replay", run_id)
    assert done.returncode == 0, done.stdout + done.stderr
