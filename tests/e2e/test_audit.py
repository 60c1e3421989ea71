"""The audit journal as deployed: governance journals its decisions in the same transaction and
seals them, `writ audit verify` succeeds after a run and fails after a one-byte edit."""

from __future__ import annotations

import subprocess
import sys

import anyio
import asyncpg
import pytest

from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def audit_verify(stack: Stack, *options: str) -> subprocess.CompletedProcess[str]:
    options = options or ("--service", "governance", "--tenant", "acme")
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", "audit", "verify", "--home", str(stack.home), *options],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_writ_audit_verify_passes_after_a_run_and_names_a_one_byte_edit(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    assert (await host.wait_result(request.request_id)).status == "succeeded"
    decisions = await db.fetchval("SELECT count(*) FROM governance.decisions")
    # One journal row per decision (an answer's decision is journaled as the answer).
    journaled = await db.fetchval(
        "SELECT count(*) FROM governance.journal WHERE kind IN ('decision', 'pending.answered')"
    )
    assert journaled == decisions
    try:
        with anyio.fail_after(20):  # sealed within a poll or two
            while await db.fetchval(
                "SELECT count(*) FROM governance.journal WHERE NOT EXISTS "
                "(SELECT 1 FROM governance.journal_seals s "
                "WHERE s.entry_id = journal.id)"
            ):
                await anyio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(stack.log_tail("governance")) from None
    ok = audit_verify(stack)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("governance: intact")
    # Nothing readable at rest.
    assert not await db.fetchval(
        "SELECT count(*) FROM governance.journal "
        "WHERE position('crm-assistant'::bytea IN ciphertext) > 0"
    )

    seq, entry_id = await db.fetchrow(
        "SELECT seq, entry_id FROM governance.journal_seals ORDER BY seq DESC LIMIT 1"
    )
    flip = (
        "UPDATE governance.journal SET ciphertext = set_byte(ciphertext, 3, "
        "get_byte(ciphertext, 3) # 1) WHERE id = $1"
    )
    await db.execute(flip, entry_id)
    try:
        bad = audit_verify(stack)
        assert bad.returncode == 1
        assert f"FAILED at seq {seq} row {entry_id}:" in bad.stdout
    finally:
        await db.execute(flip, entry_id)  # the session's deployment goes on intact
    assert audit_verify(stack).returncode == 0


async def _sealed(db: asyncpg.Connection, service: str) -> None:
    with anyio.fail_after(20):
        while await db.fetchval(
            f"SELECT count(*) FROM {service}.journal j WHERE NOT EXISTS "
            f"(SELECT 1 FROM {service}.journal_seals s "
            "WHERE s.entry_id = j.id)"
        ):
            await anyio.sleep(0.1)


async def test_each_step_of_a_command_is_journaled_where_it_happened(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    command = host.command()
    await host.submit(command)
    result = await host.wait_command(command.request_id)
    assert result.status == "succeeded" and result.operation_id is not None

    admitted = await db.fetch(
        "SELECT kind FROM admission.journal WHERE subject = $1 ORDER BY id", result.operation_id
    )
    dispatched = await db.fetch(
        "SELECT kind FROM dispatcher.journal WHERE subject = $1 ORDER BY id", result.operation_id
    )
    # Admitted with its approval receipt, in the one statement that admits it (the two rows'
    # order within that statement is not meaningful), before it is published.
    assert sorted(r["kind"] for r in admitted) == ["command.admitted", "command.authorized"]
    assert [r["kind"] for r in dispatched] == ["attempt.started", "command.succeeded"]
    for service in ("admission", "dispatcher"):
        await _sealed(db, service)
    everything = audit_verify(stack, "--grace-s", "60")
    assert everything.returncode == 0, everything.stdout + everything.stderr
    for service in ("admission", "dispatcher", "governance"):
        assert f"{service}: intact" in everything.stdout

    entry_id = await db.fetchval(
        "SELECT id FROM dispatcher.journal WHERE subject = $1 AND kind = 'command.succeeded'",
        result.operation_id,
    )
    flip = (
        "UPDATE dispatcher.journal SET ciphertext = set_byte(ciphertext, 0, "
        "get_byte(ciphertext, 0) # 1) WHERE id = $1"
    )
    await db.execute(flip, entry_id)
    try:
        bad = audit_verify(stack, "--service", "dispatcher")
        assert bad.returncode == 1
        assert f"row {entry_id}:" in bad.stdout
    finally:
        await db.execute(flip, entry_id)


async def test_the_auditor_reads_the_journals_and_can_change_nothing(stack: Stack) -> None:
    conn = await asyncpg.connect((stack.home / "secrets" / "audit.dsn").read_text())
    try:
        assert await conn.fetchval("SELECT current_user") == f"{stack.database}_auditor"
        assert not await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        for service in ("governance", "planner", "admission", "dispatcher"):
            await conn.fetchval(f"SELECT count(*) FROM {service}.journal_checkpoints")
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await conn.execute("DELETE FROM governance.journal_checkpoints")
        await conn.execute("SET default_transaction_read_only = off")  # its own choice...
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # ...changes nothing
            await conn.execute("DELETE FROM governance.journal_checkpoints")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # and it reads only journals
            await conn.fetchval("SELECT count(*) FROM governance.decisions")
    finally:
        await conn.close()
