"""`writ migrate`: provision the per-service roles and apply the migrations, or check them.

    writ migrate                    roles, grants and pending migrations (a Helm hook Job runs it)
    writ migrate --check [--wait]   is the schema at the version this image expects? (init
                                    containers run it as the service's own role)

The migrations run as the administrator the DSN names: the database's owner role in production
(CloudNativePG's `owner`), never a service role. Per-service passwords come from files, one per
service (`<passwords-dir>/<service>/password`, each service's own Secret mounted), so the roles
get the passwords the services are given; with `--roles managed` the roles are created by
someone else (CloudNativePG's managed roles) and only granted and migrated here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import asyncpg

from libs.db import (
    Migration,
    load_migrations,
    provision,
    provision_auditor,
    schema_versions,
    with_database,
)
from libs.journal import AUDITOR_TABLES
from libs.settings import read_secret
from writ.stack import SERVICES

__all__ = ["add_parser", "behind", "expected_versions", "image_migrations"]

_ROOT = Path(__file__).resolve().parent.parent / "services"


def image_migrations() -> dict[str, list[Migration]]:
    """The migrations this image carries, per service, in migration order."""
    return {
        name: load_migrations(name, _ROOT / name / "migrations")
        for name in SERVICES
        if (_ROOT / name / "migrations").is_dir()
    }


def expected_versions(migrations: Mapping[str, list[Migration]] | None = None) -> dict[str, int]:
    """The schema version of each service this image was built with."""
    return {name: len(items) for name, items in (migrations or image_migrations()).items()}


def behind(current: Mapping[str, int], expected: Mapping[str, int]) -> list[str]:
    """What is missing, one line per service whose schema is older than the image's."""
    return [
        f"{name}: at {current.get(name, 0)}, the image expects {version}"
        for name, version in expected.items()
        if current.get(name, 0) < version
    ]


def _dsn(args: argparse.Namespace, *, admin: bool) -> tuple[str, str | None]:
    env = os.environ
    if admin:
        dsn = args.dsn or env.get("WRIT_ADMIN_DATABASE_URL", "")
        password_file = args.password_file or env.get("WRIT_ADMIN_DATABASE_PASSWORD_FILE", "")
    else:  # a service's own settings, as its container has them
        dsn = args.dsn or env.get("WRIT_DATABASE_URL", "") or env.get("WRIT_ADMIN_DATABASE_URL", "")
        password_file = (
            args.password_file
            or env.get("WRIT_DATABASE_PASSWORD_FILE", "")
            or env.get("WRIT_ADMIN_DATABASE_PASSWORD_FILE", "")
        )
    if not dsn:
        raise SystemExit(
            "no database: pass --dsn or set WRIT_ADMIN_DATABASE_URL (WRIT_DATABASE_URL for --check)"
        )
    return dsn, read_secret(password_file) if password_file else None


def _passwords(folder: str, services: list[str]) -> dict[str, str]:
    found = {}
    for name in services:
        path = Path(folder) / name / "password"
        if path.exists():
            found[name] = read_secret(path)
    return found


async def _migrate(args: argparse.Namespace) -> int:
    dsn, password = _dsn(args, admin=True)
    migrations = image_migrations()
    database = args.database or urlsplit(dsn).path.lstrip("/") or "writ"
    passwords = _passwords(args.passwords_dir, list(migrations)) if args.passwords_dir else {}
    if args.roles == "create" and args.passwords_dir:
        missing = sorted(set(migrations) - set(passwords))
        if missing:  # a role with a password nobody was given could never log in
            print(
                f"no password file for {', '.join(missing)} under {args.passwords_dir}",
                file=sys.stderr,
            )
            return 1
    # The password inside the DSN: provision opens two connections from it.
    admin = with_database(dsn, urlsplit(dsn).path.lstrip("/") or "postgres", password=password)
    await provision(admin, database, migrations, passwords, create_roles=args.roles == "create")
    auditor = _passwords(args.passwords_dir, ["auditor"]) if args.passwords_dir else {}
    if args.roles == "create" and auditor:
        # The journal's threat is whoever can write to the database: auditors get a role that
        # can only read the journals (with managed roles, CloudNativePG declares it).
        await provision_auditor(admin, database, AUDITOR_TABLES, auditor["auditor"])
        print("auditor: read-only role provisioned")
    recorder = _passwords(args.passwords_dir, ["eval"]) if args.passwords_dir else {}
    if args.roles == "create" and recorder:
        # `writ eval record` journals a report's digest through one function, nothing else.
        from writ.eval._record import provision_eval_recorder

        await provision_eval_recorder(admin, database, recorder["eval"])
        print("eval: recorder role provisioned")
    conn = await asyncpg.connect(with_database(admin, database))
    try:
        current = await schema_versions(conn)
    finally:
        await conn.close()
    for name, version in sorted(current.items()):
        print(f"{name}: schema at {version}")
    return 0


async def _check(args: argparse.Namespace) -> int:
    dsn, password = _dsn(args, admin=False)
    expected = expected_versions()
    last = "not checked"
    with anyio.move_on_after(args.timeout if args.wait else 30.0):
        while True:
            try:
                conn = await asyncpg.connect(dsn, password=password, timeout=5.0)
                try:
                    missing = behind(await schema_versions(conn), expected)
                finally:
                    await conn.close()
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                missing = [f"database unreachable: {type(exc).__name__}: {exc}"]
            if not missing:
                print("schema current: " + ", ".join(f"{k} {v}" for k, v in expected.items()))
                return 0
            if missing[0] != last:
                print("waiting: " + "; ".join(missing), file=sys.stderr, flush=True)
                last = missing[0]
            if not args.wait:
                return 1
            await anyio.sleep(args.interval)
    print(f"gave up after {args.timeout:.0f}s: {last}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    return anyio.run(_check if args.check else _migrate, args)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `writ migrate` to the `writ` command."""
    p = sub.add_parser("migrate", help="provision roles and apply migrations, or --check them")
    p.add_argument(
        "--dsn",
        default="",
        help="administrator (database owner) DSN; default "
        "WRIT_ADMIN_DATABASE_URL (for --check: WRIT_DATABASE_URL)",
    )
    p.add_argument(
        "--password-file",
        default="",
        help="that DSN's password, as a file "
        "(default WRIT_ADMIN_DATABASE_PASSWORD_FILE / WRIT_DATABASE_PASSWORD_FILE)",
    )
    p.add_argument("--database", default="", help="Writ's database (default: the DSN's)")
    p.add_argument(
        "--passwords-dir",
        default=os.environ.get("WRIT_ROLE_PASSWORDS_DIR", ""),
        help="<dir>/<service>/password: each service role's password",
    )
    p.add_argument(
        "--roles",
        choices=["create", "managed"],
        default=os.environ.get("WRIT_MIGRATE_ROLES", "create"),
        help="create the service roles, or expect them (CloudNativePG managed roles)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 0 if the schema is at this image's version, 1 if not",
    )
    p.add_argument("--wait", action="store_true", help="with --check: wait until it is")
    p.add_argument("--timeout", type=float, default=600.0, help="--wait gives up after this")
    p.add_argument("--interval", type=float, default=2.0, help="--wait polls this often")
    p.set_defaults(func=_run)
