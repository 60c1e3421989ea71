"""The audit journal against a real PostgreSQL: concurrent writers and open transactions give a
gap-free chain, and every edit, deletion, insertion and reordering done directly in the
database is caught and named by `verify`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.journal import (
    DataKeys,
    Journal,
    Sealer,
    SigningKey,
    VerifyReport,
    entry_hash,
    load_verify_keys,
    read_entries,
    verify,
)
from services.governance.logic import Call, decide
from services.governance.store import Answered, GovernanceStore

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"


class Env(msgspec.Struct, kw_only=True):
    pool: asyncpg.Pool  # as the governance role, like the service
    admin: asyncpg.Connection  # the database owner, playing the attacker and the auditor
    journal: Journal
    signing: SigningKey
    sealer: Sealer
    public: dict[str, Any]

    async def verify(self, **kwargs: Any) -> VerifyReport:
        keys = load_verify_keys(msgspec.json.encode(self.public))
        return await verify(self.admin, service="governance", keys=keys, **kwargs)

    def rotate(self, key_id: str) -> None:
        self.signing = SigningKey.generate(key_id)
        self.public["governance"][key_id] = self.signing.public_pem()
        self.sealer = Sealer(pool=self.pool, journal=self.journal, signing=self.signing)


@pytest.fixture
async def env(scratch_db: str) -> AsyncIterator[Env]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db, database, {"governance": load_migrations("governance", MIGRATIONS)}
    )
    dsn = with_database(
        scratch_db,
        database,
        user=role_name(database, "governance"),
        password=passwords["governance"],
    )
    pool = await connect_pool(dsn, max_size=24)
    admin = await asyncpg.connect(scratch_db)
    journal = Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("d1")))
    signing = SigningKey.generate("governance-1")
    yield Env(
        pool=pool,
        admin=admin,
        journal=journal,
        signing=signing,
        sealer=Sealer(pool=pool, journal=journal, signing=signing),
        public={"governance": {"governance-1": signing.public_pem()}},
    )
    await admin.close()
    await pool.close()


async def write(
    env: Env, conn: asyncpg.Connection | None = None, *, n: int = 0, tenant: str = "acme"
) -> None:
    if conn is None:
        async with env.pool.acquire() as own, own.transaction():
            await write(env, own, n=n, tenant=tenant)
        return
    await env.journal.write(
        conn, tenant=tenant, kind="test", subject=f"s-{n}", run_id=f"run-{n % 3}", payload={"n": n}
    )


async def chain(env: Env) -> list[int]:
    """Row ids in chain order."""
    return [
        r["entry_id"]
        for r in await env.admin.fetch("SELECT entry_id FROM governance.journal_seals ORDER BY seq")
    ]


async def sealed(env: Env, count: int = 10) -> list[int]:
    for n in range(count):
        await write(env, n=n, tenant="acme" if n % 2 else "globex")
    assert await env.sealer.seal_all() == count
    return await chain(env)


# -- the chain ------------------------------------------------------------------------------


async def test_concurrent_writers_make_one_gap_free_chain(env: Env) -> None:
    writers, each = 16, 25
    env.sealer = Sealer(
        pool=env.pool, journal=env.journal, signing=env.signing, batch=37, interval=0.005
    )

    async def writer(w: int) -> None:
        for i in range(each):
            async with env.pool.acquire() as conn:
                tx = conn.transaction()
                await tx.start()
                await write(env, conn, n=w * 1000 + i)
                if i % 5 == 4:
                    await tx.rollback()  # its id is burnt: seq must not notice
                else:
                    await tx.commit()

    async with anyio.create_task_group() as tg:
        await tg.start(env.sealer.run)  # seals while they write
        async with anyio.create_task_group() as writers_tg:
            for w in range(writers):
                writers_tg.start_soon(writer, w)
        tg.cancel_scope.cancel()
    await env.sealer.seal_all()

    committed = writers * (each - each // 5)
    seqs = [
        r["seq"]
        for r in await env.admin.fetch("SELECT seq FROM governance.journal_seals ORDER BY seq")
    ]
    assert seqs == list(range(1, committed + 1))
    assert sorted(await chain(env)) == [
        r["id"] for r in await env.admin.fetch("SELECT id FROM governance.journal ORDER BY id")
    ]
    report = await env.verify(grace=timedelta(0))
    assert report.ok, report.problems
    assert report.entries == committed and report.checkpoints >= 2


async def test_a_transaction_held_open_with_a_lower_id_is_waited_for(env: Env) -> None:
    async with env.pool.acquire() as slow, env.pool.acquire() as fast:
        tx = slow.transaction()
        await tx.start()
        await write(env, slow, n=1)  # draws the lower id, then stays open
        await write(env, fast, n=2)  # commits at once with a higher id
        assert await env.sealer.seal_all() == 0  # waits: sealing id 2 would skip id 1
        await tx.commit()
    assert await env.sealer.seal_all() == 2
    ids = await chain(env)
    assert ids == sorted(ids)
    assert (await env.verify(grace=timedelta(0))).ok


async def test_an_open_transaction_holding_a_lower_id_but_a_later_xid_is_not_skipped(
    env: Env,
) -> None:
    # The case that makes id order unsafe: `early` has the older xid, `late` the lower id.
    async with env.pool.acquire() as early, env.pool.acquire() as late:
        early_tx, late_tx = early.transaction(), late.transaction()
        await early_tx.start()
        await late_tx.start()
        await early.fetchval("SELECT pg_current_xact_id()")
        await late.fetchval("SELECT pg_current_xact_id()")
        await write(env, late, n=1)  # lower id, later xid: held open
        await write(env, early, n=2)  # higher id, earlier xid
        await early_tx.commit()
        # The xmin is the late transaction's xid: the early row is below it and may be sealed.
        assert await env.sealer.seal_all() == 1
        await late_tx.commit()
    assert await env.sealer.seal_all() == 1  # sealed after it, not skipped
    ids = await chain(env)
    assert ids == sorted(ids, reverse=True)
    assert (await env.verify(grace=timedelta(0))).ok


async def test_rolled_back_rows_leave_no_gap(env: Env) -> None:
    await write(env, n=1)
    async with env.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await write(env, conn, n=2)
        await tx.rollback()
    await write(env, n=3)
    await env.sealer.seal_all()
    rows = await env.admin.fetch("SELECT seq, entry_id FROM governance.journal_seals ORDER BY seq")
    assert [r["seq"] for r in rows] == [1, 2]
    assert rows[1]["entry_id"] - rows[0]["entry_id"] == 2  # the id gap is not a seq gap
    assert (await env.verify(grace=timedelta(0))).ok


async def test_payloads_are_encrypted_at_rest_and_read_back_in_chain_order(env: Env) -> None:
    await sealed(env, 6)
    raw = await env.admin.fetch("SELECT ciphertext FROM governance.journal")
    assert all(b'"n"' not in bytes(r["ciphertext"]) for r in raw)
    entries = await read_entries(env.admin, env.journal, tenant="acme", run_id="run-1")
    assert [msgspec.json.decode(p)["n"] for _, _, p in entries] == [1]
    entries = await read_entries(env.admin, env.journal, tenant="acme")
    assert [msgspec.json.decode(p)["n"] for _, _, p in entries] == [1, 3, 5]


async def test_verify_with_a_tenant_counts_its_entries_and_checks_the_whole_chain(env: Env) -> None:
    ids = await sealed(env)
    report = await env.verify(tenant="acme")
    assert report.ok and report.entries == 10 and report.tenant_entries == 5
    await env.admin.execute("UPDATE governance.journal SET kind = 'x' WHERE id = $1", ids[2])
    report = await env.verify(tenant="acme")
    assert not report.ok and report.problems[0].seq == 3  # a globex row, still a broken chain


# -- signatures and rotation ----------------------------------------------------------------


async def test_old_checkpoints_verify_after_a_new_signing_key_takes_over(env: Env) -> None:
    await sealed(env, 3)
    env.rotate("governance-2")
    for n in range(3, 6):
        await write(env, n=n)
    await env.sealer.seal_all()
    key_ids = [
        r["key_id"]
        for r in await env.admin.fetch(
            "SELECT key_id FROM governance.journal_checkpoints ORDER BY seq"
        )
    ]
    assert key_ids == ["governance-1", "governance-2"]
    assert (await env.verify()).ok
    # Without the retired public key, the old checkpoint cannot be trusted.
    del env.public["governance"]["governance-1"]
    report = await env.verify()
    assert [(p.seq, "unknown" in p.reason) for p in report.problems] == [(3, True)]


async def test_a_key_of_another_service_does_not_count(env: Env) -> None:
    await sealed(env, 2)
    env.public = {"admission": env.public["governance"]}
    assert "unknown for governance" in (await env.verify()).problems[0].reason


async def test_data_key_rotation_keeps_old_rows_readable(env: Env) -> None:
    first_file = DataKeys.generate("d1")
    env.journal = Journal(service="governance", keys=DataKeys.from_json(first_file))
    await write(env, n=1)
    env.journal = Journal(
        service="governance", keys=DataKeys.from_json(DataKeys.generate("d2", existing=first_file))
    )
    await write(env, n=3)
    env.sealer = Sealer(pool=env.pool, journal=env.journal, signing=env.signing)
    await env.sealer.seal_all()  # the sealer authenticates rows under both keys
    entries = await read_entries(env.admin, env.journal, tenant="acme")
    assert [(row["key_id"], msgspec.json.decode(p)["n"]) for _, row, p in entries] == [
        ("d1", 1),
        ("d2", 3),
    ]
    assert (await env.verify(journal=env.journal)).ok


# -- tampering ------------------------------------------------------------------------------


def first(report: VerifyReport) -> tuple[int | None, int | None, str]:
    assert not report.ok
    p = report.problems[0]
    return p.seq, p.entry_id, p.reason


async def test_editing_one_byte_of_a_ciphertext_is_caught_and_named(env: Env) -> None:
    ids = await sealed(env)
    await env.admin.execute(
        "UPDATE governance.journal SET ciphertext = set_byte(ciphertext, 5, "
        "get_byte(ciphertext, 5) # 1) WHERE id = $1",
        ids[3],
    )
    seq, entry, reason = first(await env.verify())
    assert (seq, entry) == (4, ids[3]) and "edited" in reason
    # With the data keys, the payload itself is also found not authentic.
    report = await env.verify(journal=env.journal)
    assert any("not authentic" in p.reason and p.seq == 4 for p in report.problems)


@pytest.mark.parametrize(
    "column,value",
    [("tenant", "'evil'"), ("recorded_at", "now()"), ("key_id", "'d0'"), ("subject", "'other'")],
)
async def test_editing_any_column_is_caught(env: Env, column: str, value: str) -> None:
    ids = await sealed(env)
    await env.admin.execute(
        f"UPDATE governance.journal SET {column} = {value} WHERE id = $1", ids[6]
    )
    assert first(await env.verify())[:2] == (7, ids[6])


async def test_deleting_a_row_is_caught_and_named(env: Env) -> None:
    ids = await sealed(env)
    await env.admin.execute("DELETE FROM governance.journal WHERE id = $1", ids[4])
    seq, entry, reason = first(await env.verify())
    assert (seq, entry) == (5, ids[4]) and "deleted" in reason


async def test_deleting_a_row_with_its_seal_is_caught_and_named(env: Env) -> None:
    ids = await sealed(env)
    await env.admin.execute("DELETE FROM governance.journal WHERE id = $1", ids[4])
    await env.admin.execute("DELETE FROM governance.journal_seals WHERE seq = 5")
    seq, _, reason = first(await env.verify())
    assert seq == 5 and "deleted" in reason


async def test_deleting_the_last_checkpoint_is_caught(env: Env) -> None:
    await sealed(env, 4)
    await write(env, n=9)
    await env.sealer.seal_all()  # a second checkpoint, at seq 5
    await env.admin.execute("DELETE FROM governance.journal_checkpoints WHERE seq = 5")
    seq, _, reason = first(await env.verify())
    assert seq == 5 and "not covered by a signed checkpoint" in reason


async def test_deleting_a_middle_checkpoint_is_caught(env: Env) -> None:
    for n in range(3):
        await write(env, n=n)
        await env.sealer.seal_all()  # checkpoints at 1, 2, 3
    await env.admin.execute("DELETE FROM governance.journal_checkpoints WHERE seq = 2")
    seq, _, reason = first(await env.verify())
    assert seq == 3 and "a checkpoint was deleted" in reason


async def test_inserting_a_row_inside_the_chain_is_caught_and_named(env: Env) -> None:
    ids = await sealed(env)
    row = await env.admin.fetchrow("SELECT * FROM governance.journal WHERE id = $1", ids[3])
    forged = await env.admin.fetchval(
        "INSERT INTO governance.journal (id, xid, tenant, kind, subject, run_id, recorded_at, "
        "key_id, nonce, ciphertext) OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3, $4, $5, $6, "
        "$7, $8, $9, $10) RETURNING id",
        ids[3] + 100_000,
        row["xid"],
        "acme",
        "decision",
        "forged",
        "",
        row["recorded_at"],
        row["key_id"],
        row["nonce"],
        row["ciphertext"],
    )
    assert await env.sealer.seal_all() == 0  # behind the head: never sealed
    seq, entry, reason = first(await env.verify())
    assert (seq, entry) == (5, forged) and "sorts before seq 5 (inserted)" in reason


async def test_appending_a_row_with_a_forged_seal_is_caught(env: Env) -> None:
    await sealed(env)
    await write(env, n=99)
    row = await env.admin.fetchrow(
        "SELECT id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, "
        "nonce, ciphertext FROM governance.journal ORDER BY id DESC LIMIT 1"
    )
    head = await env.admin.fetchval(
        "SELECT entry_hash FROM governance.journal_seals WHERE seq = 10"
    )
    await env.admin.execute(  # the hash is public: anyone can compute it, nobody can sign it
        "INSERT INTO governance.journal_seals (seq, entry_id, xid, prev_hash, entry_hash) "
        "VALUES (11, $1, $2::text::xid8, $3, $4)",
        row["id"],
        row["xid"],
        head,
        entry_hash(head, service="governance", seq=11, row=row),
    )
    seq, _, reason = first(await env.verify())
    assert seq == 11 and "not covered by a signed checkpoint" in reason


async def test_a_forged_row_is_sealed_as_a_rejection_and_named(env: Env) -> None:
    await sealed(env, 3)
    forged = await env.admin.fetchval(
        "INSERT INTO governance.journal (tenant, kind, subject, key_id, nonce, ciphertext) "
        "VALUES ('acme', 'decision', 'x', 'd1', '\\x000102030405060708090a0b', "
        "'\\x00112233445566778899aabbccddeeff00') RETURNING id"
    )
    await write(env, n=7)  # a real row after it is not held up behind it
    assert await env.sealer.seal_all() == 2
    assert (
        await env.admin.fetchval(
            "SELECT rejected FROM governance.journal_seals WHERE entry_id = $1", forged
        )
        == "unauthentic: not authentic (edited, moved or forged)"
    )
    seq, entry, reason = first(await env.verify())
    assert (seq, entry) == (4, forged) and "rejected" in reason  # at once, no grace period
    # Not evidence: a reader of the tenant's entries never sees it.
    entries = await read_entries(env.admin, env.journal, tenant="acme")
    assert forged not in [row["id"] for _, row, _ in entries]
    # And removing it afterwards removes a sealed row, which is named too.
    await env.admin.execute("DELETE FROM governance.journal WHERE id = $1", forged)
    assert first(await env.verify())[:2] == (4, forged)


async def test_copying_a_row_is_caught(env: Env) -> None:
    ids = await sealed(env, 3)
    await env.admin.execute(
        "INSERT INTO governance.journal (tenant, kind, subject, run_id, key_id, nonce, "
        "ciphertext) SELECT tenant, kind, subject, run_id, key_id, nonce, ciphertext "
        "FROM governance.journal WHERE id = $1",
        ids[0],
    )
    # Its recorded_at is the copy's (bound into the payload's associated data): not authentic.
    assert await env.sealer.seal_all() == 1
    report = await env.verify()
    assert first(report)[0] == 4 and "rejected" in first(report)[2]
    assert any(p.seq == 4 and "nonce of seq 1" in p.reason for p in report.problems)


async def test_copying_a_row_with_its_time_is_caught(env: Env) -> None:
    ids = await sealed(env, 3)
    await env.admin.execute(
        "INSERT INTO governance.journal (tenant, kind, subject, run_id, key_id, nonce, "
        "ciphertext, recorded_at) SELECT tenant, kind, subject, run_id, key_id, nonce, "
        "ciphertext, recorded_at FROM governance.journal WHERE id = $1",
        ids[0],
    )
    assert await env.sealer.seal_all() == 1  # authentic and recent: the sealer cannot tell
    seq, _, reason = first(await env.verify())
    assert seq == 4 and "nonce of seq 1" in reason


async def test_swapping_two_rows_is_caught_and_named(env: Env) -> None:
    ids = await sealed(env)
    a, b = ids[2], ids[6]
    await env.admin.execute(
        "UPDATE governance.journal j SET xid = o.xid, tenant = o.tenant, kind = o.kind, "
        "subject = o.subject, run_id = o.run_id, recorded_at = o.recorded_at, "
        "key_id = o.key_id, nonce = o.nonce, ciphertext = o.ciphertext "
        "FROM governance.journal o WHERE (j.id, o.id) IN (($1, $2), ($2, $1))",
        a,
        b,
    )
    assert first(await env.verify())[:2] == (3, a)


async def test_swapping_two_rows_with_their_seals_is_caught(env: Env) -> None:
    await sealed(env)
    async with env.admin.transaction():
        await env.admin.execute(
            "UPDATE governance.journal_seals SET seq = -seq WHERE seq IN (3, 7)"
        )
        await env.admin.execute(
            "UPDATE governance.journal_seals SET seq = CASE seq WHEN -3 "
            "THEN 7 ELSE 3 END WHERE seq IN (-3, -7)"
        )
    assert first(await env.verify())[0] == 3


async def test_rewriting_a_row_and_its_seal_is_caught_and_named(env: Env) -> None:
    ids = await sealed(env)
    await env.admin.execute(
        "UPDATE governance.journal SET subject = 'rewritten' WHERE id = $1", ids[3]
    )
    row = await env.admin.fetchrow(
        "SELECT id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, "
        "nonce, ciphertext FROM governance.journal WHERE id = $1",
        ids[3],
    )
    prev = await env.admin.fetchval("SELECT prev_hash FROM governance.journal_seals WHERE seq = 4")
    await env.admin.execute(
        "UPDATE governance.journal_seals SET entry_hash = $1 WHERE seq = 4",
        entry_hash(prev, service="governance", seq=4, row=row),
    )
    seq, _, reason = first(await env.verify())
    assert seq == 4 and "rewritten" in reason


async def test_editing_a_checkpoint_is_caught(env: Env) -> None:
    await sealed(env)
    await env.admin.execute("UPDATE governance.journal_checkpoints SET prev_seq = 1")
    seq, _, reason = first(await env.verify())
    assert seq == 10 and "signature" in reason


# -- governance writes its journal in the same transaction -----------------------------------


WRITE = Call(
    tool="payment.charge.create", family="write_delete", connector="payments", agent="billing"
)
READ = Call(tool="crm.customer.get", family="read", connector="crm", agent="billing")


async def test_governance_journals_decisions_answers_and_grants(env: Env) -> None:
    store = GovernanceStore(env.pool, journal=env.journal)
    for call in (READ, WRITE):
        facts = await store.facts("acme", call, "alice@acme", "run-1")
        await store.record(
            tenant="acme",
            run_id="run-1",
            principal="alice@acme",
            call=call,
            ruling=decide(call, facts),
            policy_version=facts.policy_version,
        )
    pending = (await store.pending("acme"))[0].pending_id
    answered = await store.answer(
        tenant="acme", pending_id=pending, answer="always", answered_by="ops@acme", reason="fine"
    )
    assert isinstance(answered, Answered)
    await env.sealer.seal_all()
    entries = await read_entries(env.admin, env.journal, tenant="acme", run_id="run-1")
    kinds = [(row["kind"], msgspec.json.decode(p).get("verdict")) for _, row, p in entries]
    assert kinds == [
        ("decision", "allow"),
        ("decision", "ask"),
        ("pending.answered", "allow"),
        ("grant.standing", None),
    ]
    assert (await env.verify(journal=env.journal, grace=timedelta(0))).ok


async def test_a_decision_whose_journal_row_fails_is_not_recorded(env: Env) -> None:
    broken = Journal(service="governance", keys=env.journal.keys, schema="nowhere")
    store = GovernanceStore(env.pool, journal=broken)
    facts = await store.facts("acme", READ, "alice@acme", "run-1")
    with pytest.raises(asyncpg.PostgresError):
        await store.record(
            tenant="acme",
            run_id="run-1",
            principal="alice@acme",
            call=READ,
            ruling=decide(READ, facts),
            policy_version="v",
            proposal_id=str(uuid.uuid4()),
        )
    assert await env.admin.fetchval("SELECT count(*) FROM governance.decisions") == 0


# -- writ audit verify ------------------------------------------------------------------------


async def test_writ_audit_verify_exits_non_zero_naming_the_first_bad_entry(
    env: Env, scratch_db: str, tmp_path: Path
) -> None:
    import sys

    ids = await sealed(env)
    keys = tmp_path / "journal-keys.json"
    keys.write_text(msgspec.json.encode(env.public).decode())
    argv = [
        sys.executable,
        "-m",
        "writ.cli",
        "audit",
        "verify",
        "--dsn",
        scratch_db,
        "--keys",
        str(keys),
        "--tenant",
        "acme",
        "--no-record",
    ]
    ok = await anyio.run_process(argv, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.decode().startswith("governance: intact (10 entries")
    assert "NOT checked against a record" in ok.stdout.decode()
    # Without a record, or a NATS to read it from, or --no-record, it does not pretend.
    refused = await anyio.run_process(
        argv[:-1], check=False, env={"PATH": "/usr/bin"}, cwd=tmp_path
    )
    assert refused.returncode != 0 and b"no record of the checkpoints" in refused.stderr
    await env.admin.execute(
        "UPDATE governance.journal SET ciphertext = set_byte(ciphertext, 0, "
        "get_byte(ciphertext, 0) # 128) WHERE id = $1",
        ids[7],
    )
    bad = await anyio.run_process(argv, check=False)
    assert bad.returncode == 1
    assert (
        f"governance: FAILED at seq 8 row {ids[7]}: does not match its sealed hash"
        in bad.stdout.decode()
    )
