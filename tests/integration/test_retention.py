"""Retention against a real PostgreSQL: a tenant's expired window is erased by destroying its
key, for good, while the signed chain still verifies and names the window; another tenant's
payloads and a window still inside its retention are untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import msgspec
import pytest

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.journal import (
    DataKeys,
    Journal,
    PayloadExpired,
    Sealer,
    SigningKey,
    WindowKeys,
    load_verify_keys,
    read_entries,
    verify,
    window_key_id,
)
from libs.retention import Kept, RetentionPolicy, apply_policy, recorder, show_windows

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"
PLANNER = Path(__file__).resolve().parents[2] / "services" / "planner" / "migrations"


class Env(msgspec.Struct, kw_only=True):
    pool: asyncpg.Pool  # as the governance role, like the service
    admin: asyncpg.Connection  # the database owner: the administrator
    key_file: str
    journal: Journal
    sealer: Sealer
    planner_keys: str
    planner_sealer: Sealer
    public: dict[str, dict[str, str]]


@pytest.fixture
async def env(scratch_db: str) -> AsyncIterator[Env]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db,
        database,
        {
            "governance": load_migrations("governance", MIGRATIONS),
            "planner": load_migrations("planner", PLANNER),
        },
    )
    role = role_name(database, "governance")
    dsn = with_database(scratch_db, database, user=role, password=passwords["governance"])
    admin = await asyncpg.connect(scratch_db)
    key_file = DataKeys.generate("d1")
    keys = WindowKeys(DataKeys.from_json(key_file), schema="governance")
    pool = await connect_pool(dsn, max_size=4)
    journal = Journal(service="governance", keys=keys)
    signing = SigningKey.generate("governance-1")
    planner_keys = DataKeys.generate("p1")
    planner_signing = SigningKey.generate("planner-1")
    owner = await connect_pool(scratch_db, max_size=2)
    yield Env(
        planner_keys=planner_keys,
        planner_sealer=Sealer(
            pool=owner,
            journal=Journal(
                service="planner",
                keys=WindowKeys(DataKeys.from_json(planner_keys), schema="planner"),
            ),
            signing=planner_signing,
        ),
        pool=pool,
        admin=admin,
        key_file=key_file,
        journal=journal,
        # The sealer is another replica's: it reads the window keys this one made.
        sealer=Sealer(
            pool=pool,
            journal=Journal(
                service="governance",
                keys=WindowKeys(DataKeys.from_json(key_file), schema="governance"),
            ),
            signing=signing,
        ),
        public={
            "governance": {"governance-1": signing.public_pem()},
            "planner": {"planner-1": planner_signing.public_pem()},
        },
    )
    await admin.close()
    await pool.close()
    await owner.close()


async def write(env: Env, tenant: str, run_id: str, n: int) -> None:
    async with env.pool.acquire() as conn:
        await env.journal.prepare(tenant, run_id, conn=conn)
        async with conn.transaction():
            await env.journal.write(
                conn, tenant=tenant, kind="test", subject=f"s-{n}", run_id=run_id, payload={"n": n}
            )


def fresh(env: Env) -> Journal:
    """The journal as an administrator holding the service's key file opens it."""
    return Journal(
        service="governance",
        keys=WindowKeys(DataKeys.from_json(env.key_file), schema="governance"),
    )


async def test_an_expired_window_is_erased_and_the_chain_still_verifies(env: Env) -> None:
    for n in range(6):
        await write(env, "acme" if n % 2 else "globex", f"run-{n % 2}", n)
    assert await env.sealer.seal_all() == 6
    today = datetime.now(UTC)
    window = window_key_id("acme", today.date(), "run-1")
    policy = RetentionPolicy.from_json(json.dumps({"tenants": {"acme": {"journal": 1}}}))

    # A day after the window ended it is still within its one day: nothing is erased.
    assert (
        await apply_policy(
            env.admin,
            policy,
            by="ops",
            record_in=recorder(env.planner_keys),
            now=today + timedelta(days=1),
        )
        == []
    )
    assert len(await read_entries(env.admin, fresh(env), tenant="acme")) == 3

    erased = await apply_policy(
        env.admin,
        policy,
        by="ops",
        record_in=recorder(env.planner_keys),
        now=today + timedelta(days=2),
    )
    assert [(e.service, e.tenant, e.key_ids) for e in erased] == [("governance", "acme", [window])]
    # Applying again erases nothing more.
    assert (
        await apply_policy(
            env.admin,
            policy,
            by="ops",
            record_in=recorder(env.planner_keys),
            now=today + timedelta(days=2),
        )
        == []
    )

    # Unreadable even to the administrator holding the key file and the database.
    with pytest.raises(PayloadExpired) as caught:
        await read_entries(env.admin, fresh(env), tenant="acme", run_id="run-1")
    assert caught.value.key_id == window
    assert (
        await env.admin.fetchval(
            "SELECT count(*) FROM governance.journal_window_keys WHERE wrapped IS NOT NULL "
            "AND tenant = 'acme'"
        )
        == 0
    )
    # The other tenant's payloads are untouched.
    other = await read_entries(env.admin, fresh(env), tenant="globex")
    assert [json.loads(p)["n"] for _, _, p in other] == [0, 2, 4]

    report = await verify(
        env.admin,
        service="governance",
        keys=load_verify_keys(json.dumps(env.public)),
        journal=fresh(env),
    )
    assert report.ok, report.problems
    assert report.entries == 6
    assert report.expired == {window: 3}

    states = {(w.tenant, w.state) for w in await show_windows(env.admin, policy)}
    assert states == {("acme", "expired"), ("globex", "live")}

    # The expiry is journaled once, signed into the planner's chain, and readable after it.
    assert await env.planner_sealer.seal_all() == 1
    [(_, row, plaintext)] = await read_entries(env.admin, recorder(env.planner_keys), tenant="acme")
    assert row["kind"] == "retention.expired"
    recorded = json.loads(plaintext)
    assert recorded["windows"] == {"governance": [window]}
    assert (recorded["by"], recorded["kept_days"]) == ("ops", 1)
    planner = await verify(
        env.admin, service="planner", keys=load_verify_keys(json.dumps(env.public))
    )
    assert planner.ok and planner.entries == 1, planner.problems


async def test_an_edited_expired_row_is_still_caught(env: Env) -> None:
    for n in range(2):
        await write(env, "acme", "run-0", n)
    assert await env.sealer.seal_all() == 2
    policy = RetentionPolicy(tenants={"acme": msgspec.convert({"journal": 1}, type=Kept)})
    await apply_policy(
        env.admin,
        policy,
        by="ops",
        record_in=recorder(env.planner_keys),
        now=datetime.now(UTC) + timedelta(days=2),
    )
    await env.admin.execute(
        "UPDATE governance.journal SET ciphertext = ciphertext || '\\x00'::bytea "
        "WHERE id = (SELECT min(id) FROM governance.journal)"
    )
    report = await verify(
        env.admin,
        service="governance",
        keys=load_verify_keys(json.dumps(env.public)),
        journal=fresh(env),
    )
    assert not report.ok
    assert "does not match its sealed hash" in report.problems[0].reason


def writ(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_the_commands_expire_a_window_verify_it_and_replay_it_incomplete(
    scratch_db: str, tmp_path: Path
) -> None:
    database = scratch_db.rsplit("/", 1)[1]
    await provision(scratch_db, database, {"planner": load_migrations("planner", PLANNER)})
    admin = await asyncpg.connect(scratch_db)
    try:
        key_file = tmp_path / "planner-data.json"
        key_file.write_text(DataKeys.generate("p1"))
        keys = WindowKeys(DataKeys.from_json(key_file.read_text()), schema="planner")
        await keys.install(admin)
        journal = Journal(service="planner", keys=keys)
        # acme's rows are three days old; globex's are today's.
        past = datetime.now(UTC) - timedelta(days=3)
        for tenant, at in (("acme", past), ("globex", None)):
            await journal.prepare(tenant, f"run-{tenant}", at=at, conn=admin)
            for n in range(2):
                e = journal.entry(
                    tenant=tenant,
                    kind="run.started",
                    subject=f"run-{tenant}",
                    run_id=f"run-{tenant}",
                    payload={"n": n},
                    at=at,
                )
                await admin.execute(journal.insert_sql, *msgspec.structs.astuple(e))
        signing = SigningKey.generate("planner-1")
        pool = await connect_pool(scratch_db, max_size=2)
        sealer = Sealer(pool=pool, journal=journal, signing=signing)
        assert await sealer.seal_all() == 4
        public = tmp_path / "public.json"
        public.write_text(json.dumps({"planner": {"planner-1": signing.public_pem()}}))
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({"default": {"journal": 1}}))

        done = writ(
            "retention", "apply", "--policy", str(policy), "--dsn", scratch_db,
            "--data-keys", str(key_file), "--by", "ops",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        window = window_key_id("acme", past.date(), "run-acme")
        assert done.stdout.splitlines() == [f"planner acme: erased window {window}"]
        # The expiry's own journal row, signed into the chain.
        assert await sealer.seal_all() == 1
        await pool.close()
        assert (
            await admin.fetchval(
                "SELECT count(*) FROM planner.journal WHERE kind = 'retention.expired'"
            )
            == 1
        )
        shown = writ("retention", "show", "--policy", str(policy), "--dsn", scratch_db)
        assert f"planner acme {past.date().isoformat()}: EXPIRED" in shown.stdout
        assert "planner globex" in shown.stdout and "LIVE" in shown.stdout

        verified = writ(
            "audit", "verify", "--dsn", scratch_db, "--keys", str(public), "--no-record",
            "--service", "planner", "--data-keys", str(key_file),
        )  # fmt: skip
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "planner: intact" in verified.stdout
        assert f"expired window {window}: 2 payload(s) erased" in verified.stdout

        replayed = writ(
            "audit", "replay", "run-acme", "--dsn", scratch_db, "--data-keys", str(key_file)
        )
        assert replayed.returncode == 2, replayed.stdout + replayed.stderr
        assert "INCOMPLETE" in replayed.stdout
        assert f"missing: payloads expired (window {window})" in replayed.stdout
        assert "divergen" not in replayed.stdout.lower()
        # The other tenant's run is still read: whatever its verdict, nothing expired.
        other = writ(
            "audit", "replay", "run-globex", "--dsn", scratch_db, "--data-keys", str(key_file)
        )
        assert "expired" not in other.stdout, other.stdout
        assert "2 captured" in other.stdout, other.stdout + other.stderr
    finally:
        await admin.close()
