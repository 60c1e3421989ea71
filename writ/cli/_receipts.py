"""`writ receipts keys|rotate|retire`: the approval receipts' keys of a `writ run` deployment."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]


def _folders(args: argparse.Namespace) -> tuple[Path, Path]:
    home = Path(args.home)
    secrets, config = home / "secrets", home / "config"
    if not secrets.is_dir() or not config.is_dir():
        raise SystemExit(f"no deployment under {home} (start it once with `writ run`)")
    return secrets, config


def _keys(args: argparse.Namespace) -> int:
    from writ import receipt_keys

    _, config = _folders(args)
    print((config / receipt_keys.PUBLIC).read_text())
    return 0


def _rotate(args: argparse.Namespace) -> int:
    from writ import receipt_keys

    secrets, config = _folders(args)
    kid = receipt_keys.rotate(secrets, config)
    listed = [k["kid"] for k in json.loads((config / receipt_keys.PUBLIC).read_text())["keys"]]
    print(f"signing key now {kid}; published: {', '.join(listed)}")
    print("restart admission to sign with it; retire the old key once its receipts expired")
    return 0


def _dsn(args: argparse.Namespace, secrets: Path) -> str:
    """A DSN that may read admission's receipts: --dsn, WRIT_DATABASE_URL, or writ run's own
    for admission."""
    import os
    from urllib.parse import urlsplit

    from libs.db import role_name, with_database

    if args.dsn or os.environ.get("WRIT_DATABASE_URL"):
        return str(args.dsn or os.environ["WRIT_DATABASE_URL"])
    audit, password = secrets / "audit.dsn", secrets / "pg-admission.password"
    if not (audit.exists() and password.exists()):
        raise SystemExit(
            f"cannot tell whether receipts signed by {args.kid} are still valid: no database "
            "(pass --dsn, or --force to retire it unchecked)"
        )
    dsn = audit.read_text().strip()
    database = urlsplit(dsn).path.lstrip("/")
    return with_database(
        dsn,
        database,
        user=role_name(database, "admission"),
        password=password.read_text().strip(),
    )


async def _still_valid(dsn: str, kid: str) -> tuple[int, datetime | None]:
    """How many receipts `kid` signed are unexpired, and until when the last one is valid."""
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, max(expires_at) AS until FROM admission.authorizations "
            "WHERE kid = $1 AND expires_at > now()",
            kid,
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["n"]), row["until"]


def _retire(args: argparse.Namespace) -> int:
    import anyio
    import asyncpg

    from libs.journal import SigningKey
    from writ import receipt_keys

    secrets, config = _folders(args)
    signing = SigningKey.from_json((secrets / receipt_keys.SIGNING).read_text()).key_id
    if args.kid == signing:
        raise SystemExit(f"{args.kid} is the signing key: rotate first")
    if not args.force:
        # A receipt may be sent again (a lost response, a killed dispatcher) until it expires:
        # retired earlier, its key is gone and the system of record refuses that write.
        dsn = _dsn(args, secrets)
        try:
            valid, until = anyio.run(_still_valid, dsn, args.kid)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise SystemExit(
                f"cannot reach the database to check {args.kid}'s receipts ({exc}): start the "
                "deployment, or pass --force to retire it unchecked"
            ) from None
        if valid:
            assert until is not None
            raise SystemExit(
                f"{valid} receipt(s) signed by {args.kid} are valid until "
                f"{until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC: retire it after that (with "
                "--force they fail as unknown_key if sent again)"
            )
    receipt_keys.retire(config, args.kid)
    print(f"retired {args.kid}: receipts it signed no longer verify")
    return 0


def add_parsers(sub: Any) -> None:
    """`writ receipts keys`, `rotate` and `retire`."""
    p = sub.add_parser("receipts", help="the approval receipts' keys: list, rotate, retire")
    actions = p.add_subparsers(dest="receipts_command", required=True)
    for name, func, text in (
        ("keys", _keys, "print the published key set (JWKS)"),
        ("rotate", _rotate, "make a new signing key, published beside the old one"),
        ("retire", _retire, "stop publishing a key (its receipts stop verifying)"),
    ):
        q = actions.add_parser(name, help=text)
        q.add_argument("--home", default=".writ", help="writ run's folder (default: .writ)")
        if name == "retire":
            q.add_argument("kid", help="the key id to retire")
            q.add_argument(
                "--dsn",
                default="",
                help="a DSN that may read admission's receipts (default: WRIT_DATABASE_URL, "
                "or writ run's own)",
            )
            q.add_argument(
                "--force",
                action="store_true",
                help="retire it without checking that every receipt it signed has expired",
            )
        q.set_defaults(func=func)
