"""`writ retention show|apply`: a tenant's payloads kept for as long as its policy says.

`apply` destroys the window keys the policy says are past (`libs/retention.py`); with
`--every` it is the scheduled job, applying the policy again at that interval until stopped.
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

    return anyio.run(_apply_run, _dsn(args), _policy(args), args.every, args.by)


async def _apply_run(dsn: str, policy: Any, every: float | None, by: str) -> int:
    import anyio
    import asyncpg

    from libs.retention import apply_policy

    while True:
        conn = await asyncpg.connect(dsn)
        try:
            erased = await apply_policy(conn, policy, by=by)
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
        if name == "apply":
            a.add_argument(
                "--every",
                type=float,
                default=None,
                help="seconds: apply again at this interval (the scheduled job)",
            )
            a.add_argument(
                "--by", default=getpass.getuser(), help="who applies it (recorded with each key)"
            )
