"""The store: asyncpg pools, ordered SQL migrations, and one Postgres role per service.

Each service owns one Postgres schema named after it and connects as its own role,
`<database>_<service>`, which has privileges on its own schema only (plus what a migration grants
explicitly, such as the dispatcher's update of a command's state columns). Migrations run as an
administrator, never as a service role.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

import asyncpg

__all__ = [
    "Migration",
    "connect_pool",
    "load_migrations",
    "provision",
    "schema_versions",
    "provision_auditor",
    "role_name",
    "with_database",
]

_MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
_ROLE_TOKEN = re.compile(r"\{role:([a-z]+)\}")


class Migration:
    """One ordered SQL file of one service."""

    __slots__ = ("name", "service", "sql", "version")

    def __init__(self, service: str, version: int, name: str, sql: str) -> None:
        self.service, self.version, self.name, self.sql = service, version, name, sql


def role_name(database: str, service: str) -> str:
    """The login role of `service` in `database` (roles are per cluster, schemas per database)."""
    return f"{database}_{service}"


def with_database(
    dsn: str, database: str, *, user: str | None = None, password: str | None = None
) -> str:
    """The same server DSN, pointing at another database and optionally another user."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    user = user if user is not None else (parts.username or "")
    password = password if password is not None else (parts.password or "")
    auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
    netloc = f"{auth}@{host}{port}" if auth else f"{host}{port}"
    return urlunsplit((parts.scheme, netloc, f"/{database}", parts.query, ""))


# `{include:<name>}` in a migration is `libs/<name>.sql` with `{schema}` as the service's schema:
# tables every service keeps the same way (the audit journal) are written once.
_INCLUDE = re.compile(r"\{include:([a-z_]+)\}")


def _shared(name: str, service: str) -> str:
    return (
        (Path(__file__).resolve().parent / f"{name}.sql").read_text().replace("{schema}", service)
    )


def load_migrations(service: str, folder: Path) -> list[Migration]:
    """The service's `NNN_name.sql` files, in order; a gap or a duplicate number is an error."""
    found = []
    for path in sorted(folder.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if match is None:
            raise ValueError(f"badly named migration {path}")
        sql = _INCLUDE.sub(lambda m: _shared(m.group(1), service), path.read_text())
        found.append(Migration(service, int(match.group(1)), path.name, sql))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations of {service} are not numbered 001, 002, ...: {versions}")
    return found


async def connect_pool(
    dsn: str,
    *,
    password: str | None = None,
    min_size: int = 1,
    max_size: int = 10,
    statement_timeout_ms: int = 5000,
    application_name: str = "writ",
) -> asyncpg.Pool:
    """A pool whose every statement is bounded by `statement_timeout`."""
    pool = await asyncpg.create_pool(
        dsn,
        password=password,
        min_size=min_size,
        max_size=max_size,
        reset=_keep_session,
        # Client-side bounds too: a connection broken mid-protocol (Postgres killed under it)
        # must fail the handler, not hang it and the actor slot it holds.
        timeout=5.0,
        command_timeout=statement_timeout_ms / 1000 + 5.0,
        # `synchronous_commit` on whatever the server's default: a commit Writ acts on (an
        # outbox row relayed, a command acked) must survive a Postgres crash. With it off, a
        # killed Postgres forgot commands whose dispatch messages were already on the bus.
        server_settings={
            "synchronous_commit": "on",
            "statement_timeout": str(statement_timeout_ms),
            "application_name": application_name,
            "idle_in_transaction_session_timeout": "60000",
        },
    )
    assert pool is not None
    return pool


async def provision(
    admin_dsn: str,
    database: str,
    migrations: Mapping[str, Sequence[Migration]],
    passwords: Mapping[str, str] | None = None,
    *,
    create_roles: bool = True,
) -> dict[str, str]:
    """Create the database, one role per service, and apply pending migrations in order.

    `migrations` maps each service to its migrations; services are migrated in the mapping's
    order, so a migration may grant on tables of a service migrated before it. Returns each
    service role's password (the given one, or a new one): store them as secret files.

    With `create_roles=False` the roles are someone else's to create (CloudNativePG's managed
    roles): they must exist, their passwords are left alone, and `admin_dsn` needs no
    CREATEROLE, only to own the database (the migrations run as that owner).
    """
    admin = await asyncpg.connect(admin_dsn)
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            await admin.execute(f'CREATE DATABASE "{database}"')
        # Nobody but the owner may connect unless granted; roles get CONNECT below.
        await admin.execute(f'REVOKE ALL ON DATABASE "{database}" FROM PUBLIC')
        result: dict[str, str] = {}
        for service in migrations:
            role = role_name(database, service)
            password = (passwords or {}).get(service) or secrets.token_urlsafe(24)
            result[service] = password
            has_role = await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
            if not create_roles:
                if not has_role:
                    raise ValueError(f"role {role} does not exist (roles are managed elsewhere)")
                await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
                continue
            verb = "ALTER" if has_role else "CREATE"
            # Passwords cannot be bound parameters in DDL; token_urlsafe has no quote characters.
            await admin.execute(
                f'{verb} ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                f"NOINHERIT PASSWORD '{_literal(password)}'"
            )
            await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
    finally:
        await admin.close()

    conn = await asyncpg.connect(with_database(admin_dsn, database))
    try:
        await conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS public.writ_migrations ("
            " service text NOT NULL, version int NOT NULL, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (service, version))"
        )
        # Each service's init container (`writ migrate --check`) reads the versions as itself.
        roles = ", ".join(f'"{role_name(database, service)}"' for service in migrations)
        if roles:
            await conn.execute(f"GRANT USAGE ON SCHEMA public TO {roles}")
            await conn.execute(f"GRANT SELECT ON public.writ_migrations TO {roles}")
        for service, items in migrations.items():
            applied = {
                r["version"]
                for r in await conn.fetch(
                    "SELECT version FROM public.writ_migrations WHERE service = $1", service
                )
            }
            for migration in items:
                if migration.version in applied:
                    continue
                sql = _ROLE_TOKEN.sub(
                    lambda m: f'"{role_name(database, m.group(1))}"', migration.sql
                )
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO public.writ_migrations (service, version, name) "
                        "VALUES ($1, $2, $3)",
                        service,
                        migration.version,
                        migration.name,
                    )
    finally:
        await conn.close()
    return result


async def schema_versions(conn: asyncpg.Connection) -> dict[str, int]:
    """The highest migration applied of each service (none: no schema yet)."""
    exists = await conn.fetchval("SELECT to_regclass('public.writ_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch(
        "SELECT service, max(version) AS version FROM public.writ_migrations GROUP BY service"
    )
    return {r["service"]: int(r["version"]) for r in rows}


async def provision_auditor(
    admin_dsn: str, database: str, tables: Mapping[str, Sequence[str]], password: str | None = None
) -> str:
    """A login role, `<database>_auditor`, that may read `tables` ({schema: [table]}) and do
    nothing else: no write, no other table, every transaction read-only. Its password (the given
    one, or a new one).

    An auditor checks the journal; the journal's threat is whoever can write to the database,
    so the auditor must not be handed a DSN that can.
    """
    role = role_name(database, "auditor")
    password = password or secrets.token_urlsafe(24)
    admin = await asyncpg.connect(admin_dsn)
    try:
        verb = (
            "ALTER"
            if await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role)
            else "CREATE"
        )
        await admin.execute(
            f'{verb} ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
            f"NOINHERIT NOREPLICATION PASSWORD '{_literal(password)}'"
        )
        await admin.execute(f'ALTER ROLE "{role}" SET default_transaction_read_only = on')
        await admin.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(with_database(admin_dsn, database))
    try:
        for schema, names in tables.items():
            await conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
            for table in names:
                await conn.execute(f'GRANT SELECT ON "{schema}"."{table}" TO "{role}"')
    finally:
        await conn.close()
    return password


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's reset on release: Writ sets no session state on pooled connections.

    The default reset (RESET ALL, UNLISTEN, advisory unlocks...) costs a round trip per
    release; LISTEN happens only on the relay's own connection, outside any pool, and every
    transaction is closed by its context manager before release.
    """


def _literal(value: str) -> str:
    if "'" in value or "\\" in value:
        raise ValueError("password contains quote characters")
    return value
