"""`writ migrate` as the chart's Job and init containers run it, against a real PostgreSQL."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest

from libs.db import role_name, with_database
from writ.migrate import expected_versions

pytestmark = pytest.mark.anyio
SERVICES = list(expected_versions())


async def _writ(*args: str, env: dict[str, str]) -> tuple[int, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "writ.cli", *args],
        check=False,
        env={"PATH": os.environ.get("PATH", ""), **env},
    )
    return result.returncode, (result.stdout + result.stderr).decode()


def _secret(folder: Path, service: str, password: str) -> None:
    (folder / service).mkdir(parents=True)
    (folder / service / "password").write_text(f"{password}\n")


async def test_managed_roles_migrated_by_the_owner_and_checked_by_a_service(
    scratch_db: str, unique: str, tmp_path: Path
) -> None:
    database = urlsplit(scratch_db).path.lstrip("/")
    owner = f"owner_{unique}"
    admin = await asyncpg.connect(scratch_db)
    try:  # what CloudNativePG sets up: an owner role, and the managed service roles
        await admin.execute(f"CREATE ROLE {owner} LOGIN PASSWORD 'owner-pw'")
        await admin.execute(f'ALTER DATABASE "{database}" OWNER TO {owner}')
        for service in SERVICES:
            await admin.execute(
                f"CREATE ROLE \"{role_name(database, service)}\" LOGIN PASSWORD 'pw-{service}'"
            )
    finally:
        await admin.close()
    (tmp_path / "owner").write_text("owner-pw\n")
    (tmp_path / "planner").write_text("pw-planner\n")
    owner_dsn = with_database(scratch_db, database, user=owner, password="")
    planner_env = {
        "WRIT_DATABASE_URL": with_database(
            scratch_db, database, user=role_name(database, "planner"), password=""
        ),
        "WRIT_DATABASE_PASSWORD_FILE": str(tmp_path / "planner"),
    }

    # Before the Job: the init container's check fails, and --wait waits.
    code, out = await _writ("migrate", "--check", env=planner_env)
    assert code == 1, out
    async with anyio.create_task_group() as tg:
        waited: dict[str, tuple[int, str]] = {}

        async def wait() -> None:
            waited["result"] = await _writ(
                "migrate",
                "--check",
                "--wait",
                "--timeout",
                "60",
                "--interval",
                "0.2",
                env=planner_env,
            )

        tg.start_soon(wait)
        await anyio.sleep(1.0)
        code, out = await _writ(
            "migrate",
            "--roles",
            "managed",
            env={
                "WRIT_ADMIN_DATABASE_URL": owner_dsn,
                "WRIT_ADMIN_DATABASE_PASSWORD_FILE": str(tmp_path / "owner"),
            },
        )
        assert code == 0, out
    assert waited["result"][0] == 0, waited["result"][1]
    for service, version in expected_versions().items():
        assert f"{service}: schema at {version}" in out

    conn = await asyncpg.connect(with_database(scratch_db, database))
    try:  # the migrations ran as the owner, not as the superuser
        owners = {
            r["nspowner"]
            for r in await conn.fetch(
                "SELECT pg_get_userbyid(nspowner) AS nspowner FROM pg_namespace "
                "WHERE nspname = ANY($1::text[])",
                SERVICES,
            )
        }
        assert owners == {owner}
    finally:
        await conn.close()
    # Idempotent: a second run (the next upgrade's hook) changes nothing and succeeds.
    code, out = await _writ(
        "migrate",
        "--roles",
        "managed",
        env={
            "WRIT_ADMIN_DATABASE_URL": owner_dsn,
            "WRIT_ADMIN_DATABASE_PASSWORD_FILE": str(tmp_path / "owner"),
        },
    )
    assert code == 0, out


async def test_created_roles_get_the_passwords_the_services_are_given(
    scratch_db: str, tmp_path: Path
) -> None:
    database = urlsplit(scratch_db).path.lstrip("/")
    for service in SERVICES:
        _secret(tmp_path / "pw", service, f"secret-{service}")
    code, out = await _writ(
        "migrate",
        "--passwords-dir",
        str(tmp_path / "pw"),
        env={"WRIT_ADMIN_DATABASE_URL": scratch_db},
    )
    assert code == 0, out
    conn = await asyncpg.connect(
        with_database(
            scratch_db,
            database,
            user=role_name(database, "dispatcher"),
            password="secret-dispatcher",
        )
    )
    try:
        assert await conn.fetchval("SELECT count(*) FROM dispatcher.attempts") == 0
    finally:
        await conn.close()


async def test_created_roles_need_every_password(scratch_db: str, tmp_path: Path) -> None:
    _secret(tmp_path / "pw", "planner", "only-one")
    code, out = await _writ(
        "migrate",
        "--passwords-dir",
        str(tmp_path / "pw"),
        env={"WRIT_ADMIN_DATABASE_URL": scratch_db},
    )
    assert code == 1 and "no password file for" in out


async def test_an_auditor_password_gets_a_role_that_reads_the_journals_only(
    scratch_db: str, tmp_path: Path
) -> None:
    database = urlsplit(scratch_db).path.lstrip("/")
    for service in [*SERVICES, "auditor"]:
        _secret(tmp_path / "pw", service, f"secret-{service}")
    code, out = await _writ(
        "migrate",
        "--passwords-dir",
        str(tmp_path / "pw"),
        env={"WRIT_ADMIN_DATABASE_URL": scratch_db},
    )
    assert code == 0 and "auditor: read-only role provisioned" in out, out
    conn = await asyncpg.connect(
        with_database(
            scratch_db, database, user=role_name(database, "auditor"), password="secret-auditor"
        )
    )
    try:
        for schema in ("governance", "admission", "dispatcher", "planner"):
            assert await conn.fetchval(f"SELECT count(*) FROM {schema}.journal") == 0
        assert await conn.fetchval("SELECT count(*) FROM planner.steps") == 0
        # The facts proposals were resolved against (the evaluation's), and of admission's
        # own tables nothing else.
        assert await conn.fetchval("SELECT count(*) FROM admission.resolved_facts") == 0
        for table in ("commands", "proposals"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetchval(f"SELECT count(*) FROM admission.{table}")
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
            await conn.execute("DELETE FROM governance.journal")
    finally:
        await conn.close()


async def test_an_eval_password_gets_a_role_that_records_reports_only(
    scratch_db: str, tmp_path: Path
) -> None:
    """`writ eval record`'s role: one function, which writes one `eval.report` row of the
    planner's journal recorded now; no table, and no one else may call the function."""
    from libs.journal import DataKeys, Journal
    from writ.eval._record import RECORD_KIND

    database = urlsplit(scratch_db).path.lstrip("/")
    for service in [*SERVICES, "auditor", "eval"]:
        _secret(tmp_path / "pw", service, f"secret-{service}")
    code, out = await _writ(
        "migrate",
        "--passwords-dir",
        str(tmp_path / "pw"),
        env={"WRIT_ADMIN_DATABASE_URL": scratch_db},
    )
    assert code == 0 and "eval: recorder role provisioned" in out, out
    journal = Journal(service="planner", keys=DataKeys.from_json(DataKeys.generate("p-1")))
    e = journal.entry(
        tenant="acme", kind=RECORD_KIND, subject="set-v7", payload={"digest": "d" * 64}
    )
    call = "SELECT planner.record_eval_report($1, $2, $3, $4, $5, $6)"
    args = (e.tenant, e.subject, e.key_id, e.nonce, e.ciphertext, e.recorded_at)

    async def as_role(name: str) -> asyncpg.Connection:
        return await asyncpg.connect(
            with_database(
                scratch_db, database, user=role_name(database, name), password=f"secret-{name}"
            )
        )

    conn = await as_role("eval")
    try:
        row_id = await conn.fetchval(call, *args)
        for sql in (
            "SELECT count(*) FROM planner.journal",
            "SELECT count(*) FROM planner.runs",
            "DELETE FROM planner.journal",
            "INSERT INTO planner.journal (tenant, kind, subject, key_id, nonce, "
            "ciphertext) VALUES ('acme', 'run.started', 'x', 'k', '', '')",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
    finally:
        await conn.close()
    auditor = await as_role("auditor")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await auditor.fetchval(call, *args)
    finally:
        await auditor.close()
    admin = await asyncpg.connect(with_database(scratch_db, database))
    try:
        row = await admin.fetchrow("SELECT * FROM planner.journal WHERE id = $1", row_id)
        assert (row["kind"], row["run_id"], row["subject"]) == (RECORD_KIND, "", "set-v7")
        assert journal.open(row) == b'{"digest":"' + b"d" * 64 + b'"}'
        assert await admin.fetchval("SELECT count(*) FROM planner.journal") == 1
    finally:
        await admin.close()
