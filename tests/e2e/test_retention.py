"""Retention as deployed: every journaling service keys its payloads per tenant, day and run,
and erasing one principal destroys the keys of that principal's runs in every journal. The
chains still verify and name what is gone, replay of an erased run says incomplete, another
principal's run is intact, and the erasure is a signed journal entry."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import anyio
import asyncpg
import pytest

from libs.journal import DataKeys, Journal, read_entries, window_key_id
from libs.retention import principal_digest, recorder
from tests.e2e.conftest import Host, replayed
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SERVICES = ("planner", "governance", "admission", "dispatcher")


def writ(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", *args, "--home", str(stack.home)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def data_keys(stack: Stack, service: str) -> str:
    return str(stack.home / "secrets" / f"journal-{service}-data.json")


async def all_sealed(db: asyncpg.Connection, run_ids: list[str]) -> None:
    with anyio.fail_after(30):
        for service in SERVICES:
            while await db.fetchval(
                f"SELECT count(*) FROM {service}.journal j WHERE run_id = ANY($1::text[]) "
                f"AND NOT EXISTS (SELECT 1 FROM {service}.journal_seals s "
                "WHERE s.entry_id = j.id)",
                run_ids,
            ):
                await anyio.sleep(0.1)


async def test_erasing_a_principal_erases_their_runs_in_every_journal_and_nothing_else(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    tag = uuid.uuid4().hex[:8]
    erin, frank = f"erin-{tag}@acme.example", f"frank-{tag}@acme.example"
    runs = {}
    for principal in (erin, frank):
        request = host.request(principal=principal, text=f"Note the call with {principal}")
        await host.publish(request, msg_id=request.request_id)
        assert (await host.wait_result(request.request_id)).status == "succeeded"
        runs[principal] = await db.fetchval(
            "SELECT run_id FROM planner.runs WHERE request_id = $1", request.request_id
        )
    await all_sealed(db, list(runs.values()))

    # Every journaling service wrote each run's rows under that run's own window key.
    today = datetime.now(UTC).date()
    for service in SERVICES:
        for run_id in runs.values():
            key_ids = {
                r["key_id"]
                for r in await db.fetch(
                    f"SELECT DISTINCT key_id FROM {service}.journal WHERE run_id = $1", run_id
                )
            }
            assert key_ids == {window_key_id("acme", today, run_id)}, (service, key_ids)
            assert await db.fetchval(
                f"SELECT wrapped IS NOT NULL FROM {service}.journal_window_keys WHERE key_id = $1",
                window_key_id("acme", today, run_id),
            )

    erased = writ(
        stack, "retention", "erase", "--tenant", "acme", "--principal", erin,
        "--by", "dpo@acme.example", "--reason", "request of the person",
        "--dsn", stack.database_dsn, "--data-keys", data_keys(stack, "planner"),
    )  # fmt: skip
    assert erased.returncode == 0, erased.stdout + erased.stderr
    gone = window_key_id("acme", today, runs[erin])
    for service in SERVICES:
        assert f"{service} acme: erased {gone}" in erased.stdout
    assert runs[frank] not in erased.stdout

    # The erasure is a journal entry of the planner, signed into its chain.
    row = await db.fetchrow(
        "SELECT id, kind FROM planner.journal WHERE kind = 'retention.erased' AND subject = $1",
        f"erasure/{principal_digest('acme', erin)}",
    )
    assert row is not None
    with anyio.fail_after(20):
        while not await db.fetchval(
            "SELECT count(*) FROM planner.journal_seals WHERE entry_id = $1", row["id"]
        ):
            await anyio.sleep(0.1)
    planner_file = (stack.home / "secrets" / "journal-planner-data.json").read_text()
    recorded = [
        json.loads(p)
        for _, r, p in await read_entries(
            db,
            recorder(planner_file),
            tenant="acme",
            subject=f"erasure/{principal_digest('acme', erin)}",
        )
    ]
    assert recorded[0]["asked_by"] == "dpo@acme.example"
    assert recorded[0]["runs"] == [runs[erin]]
    assert erin not in json.dumps(recorded[0])  # the journal keeps a digest, not the person
    assert {s: ids for s, ids in recorded[0]["windows"].items()} == {s: [gone] for s in SERVICES}

    # Every chain still verifies and names the erased window; nothing else is gone.
    for service in SERVICES:
        verified = writ(
            stack, "audit", "verify", "--service", service, "--tenant", "acme", "--no-record",
            "--data-keys", data_keys(stack, service),
        )  # fmt: skip
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert f"{service}: intact" in verified.stdout
        assert f"expired window {gone}:" in verified.stdout
        assert runs[frank] not in verified.stdout

    # The planner's own replay (its process made the key and held it) says incomplete.
    report = await replayed(host, db, runs[erin])
    assert report.verdict == "incomplete", report
    assert report.missing == [f"payloads expired (window {gone})"]
    other = await replayed(host, db, runs[frank])
    assert other.verdict != "incomplete" and not other.missing, other

    # Frank's payloads still open with the key file; Erin's open for no one.
    for service in SERVICES:
        keys = DataKeys.from_json(
            (stack.home / "secrets" / f"journal-{service}-data.json").read_text()
        )
        journal = Journal(service=service, keys=keys)
        kept = await read_entries(db, journal, tenant="acme", run_id=runs[frank])
        assert kept and all(p for _, _, p in kept)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM planner.journal_window_keys WHERE run_id = $1 "
            "AND wrapped IS NOT NULL",
            runs[erin],
        )
        == 0
    )
