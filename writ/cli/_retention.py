"""`writ retention show|apply`: a tenant's payloads kept for as long as its policy says.

`apply` destroys the window keys the policy says are past (`libs/retention.py`); with
`--every` it is the scheduled job, applying the policy again at that interval until stopped.
`erase` destroys the keys of one principal's runs. Both journal what they erased in the
planner's journal, so they need the planner's data key file.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]


def _dsn(args: argparse.Namespace) -> str:
    dsn: str = args.dsn or os.environ.get("WRIT_DATABASE_URL", "")
    if not dsn:
        raise SystemExit(
            "no database: pass --dsn or set WRIT_DATABASE_URL (a role that owns the journals)"
        )
    return dsn


def _recorder(args: argparse.Namespace) -> Any:
    from libs.errors import ConfigError
    from libs.retention import recorder

    path = Path(args.data_keys or Path(args.home) / "secrets" / "journal-planner-data.json")
    try:
        return recorder(path.read_text())
    except (OSError, ConfigError) as exc:
        raise SystemExit(
            f"no planner data key file to journal the erasure in ({path}): {exc}"
        ) from None


def _policy(args: argparse.Namespace) -> Any:
    import msgspec

    from libs.retention import RetentionPolicy

    try:
        return RetentionPolicy.from_json(Path(args.policy).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        raise SystemExit(f"invalid retention policy {args.policy}: {exc}") from None


def _show(args: argparse.Namespace) -> int:
    import anyio

    return anyio.run(_show_run, _dsn(args), _policy(args))


async def _show_run(dsn: str, policy: Any) -> int:
    import asyncpg

    from libs.retention import show_windows

    conn = await asyncpg.connect(dsn)
    try:
        windows = await show_windows(conn, policy)
    finally:
        await conn.close()
    if not windows:
        print("no journal keys its payloads by tenant and day")
    for w in windows:
        days = policy.days(w.tenant)
        kept = f"kept {days} day(s)" if days is not None else "kept until a policy says"
        line = f"{w.service} {w.tenant} {w.day.isoformat()}: {w.state.upper()} ({kept})"
        if w.destroyed_at is not None:
            line += f", erased {w.destroyed_at.isoformat()} by {w.destroyed_by}"
        print(line)
    return 0


def _apply(args: argparse.Namespace) -> int:
    import anyio

    return anyio.run(_apply_run, _dsn(args), _policy(args), args.every, args.by, _recorder(args))


async def _apply_run(dsn: str, policy: Any, every: float | None, by: str, journal: Any) -> int:
    import anyio
    import asyncpg

    from libs.retention import apply_policy

    while True:
        conn = await asyncpg.connect(dsn)
        try:
            erased = await apply_policy(conn, policy, by=by, record_in=journal)
        finally:
            await conn.close()
        for e in erased:
            for key_id in e.key_ids:
                print(f"{e.service} {e.tenant}: erased window {key_id}")
        if every is None:
            if not erased:
                print("nothing past its retention")
            return 0
        sys.stdout.flush()
        await anyio.sleep(every)


def _erase(args: argparse.Namespace) -> int:
    import anyio

    return anyio.run(_erase_run, _dsn(args), args, _recorder(args))


async def _erase_run(dsn: str, args: argparse.Namespace, journal: Any) -> int:
    import asyncpg

    from libs.retention import erase_principal

    conn = await asyncpg.connect(dsn)
    try:
        done = await erase_principal(
            conn,
            tenant=args.tenant,
            principal=args.principal,
            by=args.by,
            reason=args.reason,
            record_in=journal,
        )
    finally:
        await conn.close()
    keys = sum(len(k) for k in done.key_ids.values())
    print(
        f"{done.tenant}: erased {len(done.runs)} run(s) of the principal, {keys} key(s), "
        f"{done.reasons_erased} answer reason(s) on others' runs; "
        f"journaled as planner row {done.journal_id}"
    )
    for service, key_ids in sorted(done.key_ids.items()):
        for key_id in key_ids:
            print(f"{service} {done.tenant}: erased {key_id}")
    return 0


def add_parsers(sub: Any) -> None:
    """`writ retention` and its subcommands."""
    p = sub.add_parser("retention", help="how long stored payloads are kept")
    act = p.add_subparsers(dest="action", required=True)
    for name, func, text in (
        ("show", _show, "every window of every journal: live, due or expired"),
        ("apply", _apply, "destroy the keys of the windows past their retention"),
    ):
        a = act.add_parser(name, help=text)
        a.add_argument("--policy", required=True, help="the retention policy (JSON)")
        a.add_argument("--dsn", default="", help="default: WRIT_DATABASE_URL")
        a.set_defaults(func=func)
        a.add_argument("--home", default=".writ")
        if name == "apply":
            a.add_argument(
                "--data-keys",
                default="",
                help="the planner's journal data keys, to journal the expiry (default: writ run's)",
            )
            a.add_argument(
                "--every",
                type=float,
                default=None,
                help="seconds: apply again at this interval (the scheduled job)",
            )
            a.add_argument(
                "--by", default=getpass.getuser(), help="who applies it (recorded with each key)"
            )
    e = act.add_parser("erase", help="erase one principal's payloads (their runs' keys)")
    e.add_argument("--tenant", required=True)
    e.add_argument("--principal", required=True, help="whose runs and sessions to erase")
    e.add_argument("--by", required=True, help="who asked (journaled)")
    e.add_argument("--reason", required=True, help="why (journaled)")
    e.add_argument("--dsn", default="", help="default: WRIT_DATABASE_URL")
    e.add_argument("--home", default=".writ")
    e.add_argument(
        "--data-keys",
        default="",
        help="the planner's journal data keys, to journal the erasure (default: writ run's)",
    )
    e.set_defaults(func=_erase)
