"""The audit record lost under a running deployment, and runs registered by the wrong service.

A cut tail is still named after every service restarts. The record deleted by the administrator
(as a reply subject once let any host do): after one restart and one request, every sealer
refuses to seal instead of adopting the database's head, and `writ audit verify` fails naming
the missing record for each journal. `writ audit re-anchor` then starts each record again,
signed and journaled, sealing resumes, and verify reports what each re-anchoring lost.

Separately: a compromised planner, with its own NATS user, cannot register a run with grants.
The deployment is this module's own: the record cannot be put back.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import anyio
import anyio.to_thread
import asyncpg
import msgspec
import nats
import pytest
from nats.js import JetStreamContext

from libs.journal import REANCHORED, JetStreamRecord, anchor_verifies, load_verify_keys
from schemas import subjects
from schemas.governance import RegisterRun, RunRegistered
from tests.e2e.conftest import Host
from tests.e2e.test_journal_attacks import cut, last_batch, metric, sealed, traffic
from writ.stack import JOURNALS, SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-record-loss-") as home:
        deployment = Stack(
            Path(home),
            database="record_loss",
            durable_pg=False,
            extra_env={"*": {"WRIT_DRAIN_TIMEOUT_S": "2"}},
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


async def restart(stack: Stack, names: tuple[str, ...]) -> None:
    """Stop and start these services' processes, as a supervisor or a rollout does."""
    for name in names:
        await anyio.to_thread.run_sync(stack.stop_process, name)
    stack.start_services(names)
    await stack.wait_ready(names)


def _writ(stack: Stack, *argv: str) -> list[str]:
    return [sys.executable, "-m", "writ.cli", "audit", *argv, "--home", str(stack.home)]


async def verify(stack: Stack) -> tuple[int, dict[str, list[str]]]:
    """`writ audit verify`'s exit code and, per journal, its line and the indented ones."""
    done = await anyio.run_process(_writ(stack, "verify"), check=False)
    found: dict[str, list[str]] = {}
    for line in done.stdout.decode().splitlines():
        if not line.startswith(" "):
            found[line.split(":", 1)[0]] = [line]
        elif found:
            found[list(found)[-1]].append(line.strip())
    return done.returncode, found


async def all_sealed(db: asyncpg.Connection) -> None:
    for service in JOURNALS:
        await sealed(db, service)


@pytest.mark.timeout(600)  # the deployment's start, two restarts, four re-anchorings
async def test_a_lost_record_is_refused_by_every_sealer_named_by_verify_then_re_anchored(
    stack: Stack, host: Host, db: asyncpg.Connection, record: JetStreamContext
) -> None:
    # Governance's last batch is cut below: it must not be its whole chain (a journal cut to
    # nothing looks like a new one), so traffic goes on until it has two checkpoints.
    for _ in range(5):
        await traffic(host)
        await all_sealed(db)
        if await db.fetchval("SELECT count(*) FROM governance.journal_checkpoints") >= 2:
            break
    code, _ = await verify(stack)
    assert code == 0

    # The administrator cuts governance's last batch; every service restarts; still named.
    start = await last_batch(db, "governance")
    await cut(db, "governance", start)
    await restart(stack, SERVICES)
    await traffic(host)
    for service in ("planner", "admission", "dispatcher"):
        await sealed(db, service)
    code, found = await verify(stack)
    assert code == 1
    assert f"FAILED at seq {start}" in found["governance"][0], found
    assert "the tail was cut" in found["governance"][0]
    for service in ("planner", "admission", "dispatcher"):
        assert "intact" in found[service][0], found

    # The record's administrator deletes it; one service restarts; one more request.
    await record.delete_stream(subjects.JOURNAL_RECORD_STREAM)
    await restart(stack, ("planner",))
    await traffic(host)
    with anyio.fail_after(60):  # every sealer refuses: none adopts the database's head
        while not all(
            metric(
                stack,
                s,
                f'writ_journal_seal_refusals_total{{reason="record_missing",service="{s}"}}',
            )
            > 0
            for s in JOURNALS
        ):
            await anyio.sleep(0.2)
    checkpoints = JetStreamRecord(record)
    for service in JOURNALS:
        assert await checkpoints.read(service) == [], service
        assert "REFUSING TO SEAL" in stack.log_tail(service, 20000)
    code, found = await verify(stack)
    assert code == 1, found
    for service in JOURNALS:
        line = found[service][0]
        assert line.startswith(f"{service}: FAILED: the record outside the database "), line
        assert "is missing" in line or "has no checkpoint of this journal" in line, line

    # An operator re-anchors each journal: signed, naming what was lost, journaled.
    for service in JOURNALS:
        done = await anyio.run_process(
            _writ(
                stack,
                "re-anchor",
                "--service",
                service,
                "--by",
                "ops@acme.example",
                "--reason",
                "the record was deleted",
            ),
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert b"re-anchored at seq" in done.stdout
    await traffic(host)
    await all_sealed(db)
    code, found = await verify(stack)
    assert code == 0, found
    keys = load_verify_keys((stack.config / "journal-keys.json").read_text())
    for service in JOURNALS:
        assert found[service][0].startswith(f"{service}: RE-ANCHORED"), found[service]
        assert "re-anchored at seq" in found[service][1] and "ops@acme.example" in found[service][1]
        assert "the record" in found[service][1] and "were not in the record" in found[service][1]
        anchor = next(c for c in await checkpoints.read(service) if c.reanchor is not None)
        assert anchor_verifies(anchor, keys[service])
        assert (
            await db.fetchval(
                f"SELECT count(*) FROM {service}.journal j JOIN {service}.journal_seals s "
                "ON s.entry_id = j.id WHERE j.kind = $1",
                REANCHORED,
            )
            == 1
        )
    assert "(the tail was cut)" not in json.dumps(found)

    # Junk on a journal's subject (a PubAck body, as a publish naming it as its reply subject
    # once stored there; now only the record's administrator or that journal's sealer could put
    # it there): the sealer goes on, verify names its stream sequence, no traceback.
    ack = await record.publish(
        subjects.journal_checkpoints("admission"),
        b'{"stream":"WRIT_AUDIT","seq":41}',
        stream=subjects.JOURNAL_RECORD_STREAM,
    )
    await traffic(host)
    await all_sealed(db)
    done = await anyio.run_process(_writ(stack, "verify"), check=False)
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr
    assert (
        f"admission: FAILED: the record's message at stream sequence {ack.seq} is not a "
        "checkpoint of admission"
    ) in done.stdout.decode()
    assert b"governance: RE-ANCHORED" in done.stdout


async def test_the_planners_identity_cannot_register_a_run_with_grants(
    stack: Stack, db: asyncpg.Connection
) -> None:
    assert stack.embedded_nats is not None
    seen: list[str] = []

    async def violation(exc: Exception) -> None:
        seen.append(str(exc).lower())

    planner = await nats.connect(
        stack.embedded_nats.url, error_cb=violation, **stack.nats_options("planner")
    )
    run_id = f"req-{uuid.uuid4().hex[:12]}"
    try:
        forged = RegisterRun(
            tenant="acme",
            run_id=run_id,
            principal="alice@acme.example",
            agent="crm-assistant",
            grants=["write_delete"],
        )
        # Ingress's subject: the server drops the planner's publish, nobody answers.
        with pytest.raises(nats.errors.TimeoutError):
            await planner.request(subjects.REGISTER_RUN, msgspec.json.encode(forged), timeout=2)
        with anyio.fail_after(10):
            while not any(
                "permissions violation" in s and subjects.REGISTER_RUN in s for s in seen
            ):
                await anyio.sleep(0.05)

        # The planner's own subject: a turn carries no grants, and is only a turn.
        async def ask(body: Mapping[str, object]) -> tuple[str | None, bytes]:
            reply = await planner.request(
                subjects.REGISTER_TURN, json.dumps(body).encode(), timeout=10
            )
            return (reply.headers or {}).get("Nats-Service-Error-Code"), reply.data

        turn = {
            "type": "RegisterTurn",
            "tenant": "acme",
            "run_id": run_id,
            "session_id": "ses-probe",
            "principal": "alice@acme.example",
            "agent": "crm-assistant",
        }
        assert (await ask({**turn, "grants": ["write_delete"]}))[0] == "400"
        assert (await ask(turn))[0] == "403"  # a host's run id is no turn of a session
        code, data = await ask({**turn, "run_id": "ses-probe-t1"})
        assert code is None and msgspec.json.decode(data, type=RunRegistered)
        # Registered again asking more (another principal): refused, nothing changed.
        wider = {**turn, "run_id": "ses-probe-t1", "principal": "mallory@acme.example"}
        assert (await ask(wider))[0] == "403"
    finally:
        await planner.close()
    assert await db.fetchval("SELECT count(*) FROM governance.runs WHERE run_id = $1", run_id) == 0
    assert (
        await db.fetchval(
            "SELECT count(*) FROM governance.run_grants WHERE run_id IN ($1, 'ses-probe-t1')",
            run_id,
        )
        == 0
    )
    assert (
        await db.fetchval("SELECT principal FROM governance.runs WHERE run_id = 'ses-probe-t1'")
        == "alice@acme.example"
    )
