"""Attacks on the deployed journals, one per journal, with the six services running.

Whoever can write to the database (SQL only: no signing key, no access to the NATS account that
holds the record) cuts governance's tail, splices the planner's chain and re-inserts the rows,
re-hashes admission's chain and drops its checkpoints, and forges a row in the dispatcher's
journal then deletes a row behind it. After one more request, each sealer has refused (or sealed
the forged row as a rejection) and raised its metric, and `writ audit verify` names the first
bad seq of each journal. The deployment is this module's own: tampering cannot be undone.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import asyncpg
import httpx
import pytest

from libs.journal import entry_hash
from tests.e2e.conftest import Host
from writ.stack import JOURNALS, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

_ROW = "id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, nonce, ciphertext"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-attacks-") as home:
        deployment = Stack(
            Path(home),
            database="attacks",
            durable_pg=False,
            extra_env={"*": {"WRIT_DRAIN_TIMEOUT_S": "2"}},
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


def metric(stack: Stack, service: str, sample: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port(service)}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample)
    )


async def traffic(host: Host) -> None:
    """A run (planner, governance) and a command (admission, dispatcher, governance)."""
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    command = host.command()
    await host.submit(command)
    assert (await host.wait_result(request.request_id)).status == "succeeded"
    assert (await host.wait_command(command.request_id)).status == "succeeded"


async def sealed(db: asyncpg.Connection, service: str) -> None:
    with anyio.fail_after(20):
        while await db.fetchval(
            f"SELECT count(*) FROM {service}.journal j WHERE NOT EXISTS "
            f"(SELECT 1 FROM {service}.journal_seals s "
            "WHERE s.entry_id = j.id)"
        ):
            await anyio.sleep(0.1)


async def last_batch(db: asyncpg.Connection, service: str) -> int:
    """The first seq of the newest checkpoint's batch."""
    return await db.fetchval(
        f"SELECT prev_seq + 1 FROM {service}.journal_checkpoints ORDER BY seq DESC LIMIT 1"
    )


async def cut(db: asyncpg.Connection, s: str, start: int) -> list[asyncpg.Record]:
    rows = await db.fetch(
        f"SELECT {', '.join('j.' + c.strip() for c in _ROW.split(','))} FROM {s}.journal j "
        f"JOIN {s}.journal_seals x ON x.entry_id = j.id WHERE x.seq >= $1 ORDER BY x.seq",
        start,
    )
    async with db.transaction():
        await db.execute(
            f"DELETE FROM {s}.journal WHERE id IN (SELECT entry_id FROM "
            f"{s}.journal_seals WHERE seq >= $1)",
            start,
        )
        await db.execute(f"DELETE FROM {s}.journal_seals WHERE seq >= $1", start)
        await db.execute(f"DELETE FROM {s}.journal_checkpoints WHERE seq >= $1", start)
    return rows


async def rehash(db: asyncpg.Connection, s: str, start: int) -> None:
    prev = bytes(
        await db.fetchval(f"SELECT prev_hash FROM {s}.journal_seals WHERE seq = $1", start)
    )
    for seal in await db.fetch(
        f"SELECT seq, entry_id FROM {s}.journal_seals WHERE seq >= $1 ORDER BY seq", start
    ):
        row = await db.fetchrow(f"SELECT {_ROW} FROM {s}.journal WHERE id = $1", seal["entry_id"])
        digest = entry_hash(prev, service=s, seq=seal["seq"], row=row)
        await db.execute(
            f"UPDATE {s}.journal_seals SET prev_hash = $2, entry_hash = $3 WHERE seq = $1",
            seal["seq"],
            prev,
            digest,
        )
        prev = digest


async def test_each_attack_is_refused_by_the_sealer_and_named_by_verify(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    for _ in range(2):
        await traffic(host)
        for service in JOURNALS:
            await sealed(db, service)
    intact = await anyio.run_process(_verify(stack), check=False)
    assert intact.returncode == 0, intact.stdout.decode()
    export = stack.home / "auditor-record.jsonl"  # what an auditor keeps of the record
    exported = await anyio.run_process([*_writ(stack, "export"), "--out", str(export)])
    assert b"checkpoint(s) appended" in exported.stdout

    # 1. governance: cut the last batch with its seals and checkpoint.
    expected = {"governance": await last_batch(db, "governance")}
    await cut(db, "governance", expected["governance"])
    # 2. planner: delete from the start of a batch, put every later row back but the victim.
    expected["planner"] = await last_batch(db, "planner")
    rows = await cut(db, "planner", expected["planner"])
    for r in rows[1:]:
        await db.execute(
            "INSERT INTO planner.journal (tenant, kind, subject, run_id, key_id, nonce, "
            "ciphertext, recorded_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            r["tenant"],
            r["kind"],
            r["subject"],
            r["run_id"],
            r["key_id"],
            r["nonce"],
            r["ciphertext"],
            r["recorded_at"],
        )
    # 3. admission: edit a row, re-hash every later seal, drop the checkpoints from there.
    expected["admission"] = start = await last_batch(db, "admission")
    await db.execute(
        "UPDATE admission.journal SET ciphertext = set_byte(ciphertext, 0, "
        "get_byte(ciphertext, 0) # 1) WHERE id = (SELECT entry_id FROM "
        "admission.journal_seals WHERE seq = $1)",
        start,
    )
    await rehash(db, "admission", start)
    await db.execute("DELETE FROM admission.journal_checkpoints WHERE seq >= $1", start)
    # 4. dispatcher: forge a row, let rows pile up behind it, delete one of them and it.
    forged = await db.fetchval(
        "INSERT INTO dispatcher.journal (tenant, kind, subject, key_id, nonce, ciphertext) "
        "VALUES ('acme', 'attempt.started', 'x', 'dispatcher-data-1', $1, $2) RETURNING id",
        b"\1" * 12,
        b"\1" * 24,
    )
    await sealed(db, "dispatcher")
    expected["dispatcher"] = await db.fetchval(
        "SELECT seq FROM dispatcher.journal_seals WHERE entry_id = $1", forged
    )

    await traffic(host)  # the next request, on every journal
    await sealed(db, "dispatcher")
    await db.execute(
        "DELETE FROM dispatcher.journal WHERE id IN ($1, (SELECT max(id) FROM dispatcher.journal))",
        forged,
    )

    # The sealers said so at once, in the metrics the shipped alerts watch.
    with anyio.fail_after(20):
        while not all(
            metric(stack, s, "writ_journal_seal_refusals_total{") > 0
            for s in ("governance", "planner", "admission")
        ):
            await anyio.sleep(0.2)
    assert (
        metric(
            stack,
            "dispatcher",
            'writ_journal_rows_rejected_total{reason="unauthentic",service="dispatcher"}',
        )
        == 1
    )
    for service in ("governance", "planner", "admission"):
        assert "REFUSING TO SEAL" in stack.log_tail(service, 20000)

    result = await anyio.run_process(_verify(stack), check=False)
    stdout = result.stdout.decode()
    assert result.returncode == 1, stdout + result.stderr.decode()
    found = {
        line.split(":", 1)[0]: line for line in stdout.splitlines() if not line.startswith(" ")
    }
    for service, seq in expected.items():
        assert f"FAILED at seq {seq}" in found[service], (service, seq, stdout)
    assert "the tail was cut" in found["governance"]
    assert "the tail was cut" in found["planner"]
    assert "does not hash to the head recorded outside the database" in found["admission"]
    assert "missing" in found["dispatcher"]

    # The auditor's own export, taken before the attacks, names the same seqs.
    offline = await anyio.run_process([*_verify(stack), "--record-file", str(export)], check=False)
    assert offline.returncode == 1
    for service, seq in expected.items():
        assert f"{service}: FAILED at seq {seq}" in offline.stdout.decode(), offline.stdout


def _writ(stack: Stack, action: str) -> list[str]:
    return [sys.executable, "-m", "writ.cli", "audit", action, "--home", str(stack.home)]


def _verify(stack: Stack) -> list[str]:
    return _writ(stack, "verify")
