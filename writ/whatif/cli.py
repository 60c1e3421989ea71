"""`writ policy whatif | record | verify`: a candidate policy over the journaled decisions.

`whatif` opens one read-only database connection (an auditor's DSN) and no bus: it reads the
tenant's sealed decisions and amounts, rules them again (`_redecide.py`), and writes the
report file, nothing else. `record` journals the report's digest as the eval role, to be
sealed and signed with the planner's chain; `verify` says whether a report file is the one
sealed (0 it is, 1 it is not, 3 it cannot be checked).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["add_parsers", "parse_duration"]

_DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """`90m`, `24h`, `30d`: a positive whole number of one unit."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r} (like 30m, 24h or 7d)")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _dsn(args: argparse.Namespace, env: str, file: str) -> str:
    path = Path(args.home) / "secrets" / file
    return args.dsn or os.environ.get(env) or (path.read_text().strip() if path.exists() else "")


def _journal(args: argparse.Namespace, service: str, given: str) -> Any:
    from libs.journal import DataKeys, Journal

    path = Path(given or Path(args.home) / "secrets" / f"journal-{service}-data.json")
    return Journal(service=service, keys=DataKeys.from_json(path.read_text()))


def _whatif(args: argparse.Namespace) -> int:
    """Write the report; 0 written (its flips printed), 3 it cannot be made."""
    import anyio

    from writ.whatif._redecide import MAX_CANDIDATE_BYTES, Candidate, render, whatif

    try:
        raw = Path(args.policy).read_bytes()
        if len(raw) > MAX_CANDIDATE_BYTES:
            raise ValueError(f"the candidate is over {MAX_CANDIDATE_BYTES} bytes")
        candidate = msgspec.json.decode(raw, type=Candidate)
        until = datetime.fromisoformat(args.until) if args.until else datetime.now(UTC)
        if until.tzinfo is None:
            until = until.replace(tzinfo=UTC)  # a time without a zone is UTC
        since = until - parse_duration(args.since)
        dsn = _dsn(args, "WRIT_AUDIT_DATABASE_URL", "audit.dsn")
        if not dsn:
            raise ValueError(
                "no database: pass --dsn, set WRIT_AUDIT_DATABASE_URL or run `writ run`"
            )
        governance = _journal(args, "governance", args.governance_keys)
        admission = _journal(args, "admission", args.admission_keys)
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"cannot run the what-if: {exc}", file=sys.stderr)
        return 3
    try:
        decisions, amounts, not_evaluable = anyio.run(
            functools.partial(_read, dsn, governance, admission, args.tenant, since, until)
        )
    except (OSError, ValueError) as exc:
        print(f"cannot read the journal: {exc}", file=sys.stderr)
        return 3
    report = whatif(
        tenant=args.tenant,
        candidate=candidate,
        candidate_digest=hashlib.sha256(raw).hexdigest(),
        since=since.isoformat(),
        until=until.isoformat(),
        decisions=decisions,
        amounts=amounts,
        not_evaluable=not_evaluable,
    )
    out = Path(args.output or f"{args.tenant}-{candidate.version}.whatif.json")
    out.write_bytes(msgspec.json.encode(report))
    print(render(report))
    print(f"report -> {out}")
    return 0


async def _read(
    dsn: str, governance: Any, admission: Any, tenant: str, since: datetime, until: datetime
) -> Any:
    import asyncpg

    from writ.whatif._read import journaled_window

    conn = await asyncpg.connect(dsn)
    try:
        # Read-only, whatever the role may do: the what-if writes nothing but its report file.
        async with conn.transaction(readonly=True):
            lost: list[str] = []
            decisions, amounts = await journaled_window(
                conn,
                governance,
                admission,
                tenant=tenant,
                since=since,
                until=until,
                not_evaluable=lost,
            )
            return decisions, amounts, lost
    finally:
        await conn.close()


def _load_report(path: str) -> Any:
    from writ.whatif._redecide import Report

    return msgspec.json.decode(Path(path).read_bytes(), type=Report)


def _record(args: argparse.Namespace) -> int:
    """Journal a report's digest as the eval role: 0 recorded, 3 if it cannot be."""
    import anyio
    import asyncpg

    from writ.whatif._redecide import report_digest

    try:
        report = _load_report(args.report)
        planner = _journal(args, "planner", args.data_keys)
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"cannot record: {exc}", file=sys.stderr)
        return 3
    dsn = _dsn(args, "WRIT_EVAL_DATABASE_URL", "eval.dsn")
    if not dsn:
        print("no database: pass --dsn (the eval role's) or run `writ run`", file=sys.stderr)
        return 3
    digest = report_digest(report)
    try:
        row_id = anyio.run(functools.partial(_call, "record_report", dsn, planner, report, digest))
    except (OSError, ValueError, asyncpg.PostgresError) as exc:
        print(f"cannot record: {exc}", file=sys.stderr)
        return 3
    print(
        f"what-if {digest} of {report.candidate} on {report.tenant} journaled as planner "
        f"journal row {row_id}; the planner's sealer signs it"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    """0 the report's digest is sealed in its tenant's planner journal, 1 it is not, 3 it
    cannot be checked (the chain itself is `writ audit verify --service planner`'s)."""
    import anyio
    import asyncpg

    from writ.whatif._redecide import report_digest

    try:
        report = _load_report(args.report)
        planner = _journal(args, "planner", args.data_keys)
        dsn = _dsn(args, "WRIT_AUDIT_DATABASE_URL", "audit.dsn")
        if not dsn:
            raise ValueError("no database: pass --dsn (an auditor's) or run `writ run`")
        digest = report_digest(report)
        seq = anyio.run(functools.partial(_call, "sealed_report", dsn, planner, report, digest))
    except (OSError, ValueError, msgspec.DecodeError, asyncpg.PostgresError) as exc:
        print(f"cannot verify: {exc}", file=sys.stderr)
        return 3
    if seq is None:
        print(
            f"what-if {digest} of {report.candidate} is NOT in tenant {report.tenant}'s "
            "sealed planner journal",
            file=sys.stderr,
        )
        return 1
    print(
        f"what-if {digest} of {report.candidate} is sealed at planner journal seq {seq}; "
        "`writ audit verify --service planner` proves the chain and its signatures"
    )
    return 0


async def _call(name: str, dsn: str, planner: Any, report: Any, digest: str) -> Any:
    import asyncpg

    from writ.whatif import _read

    conn = await asyncpg.connect(dsn)
    try:
        return await getattr(_read, name)(conn, planner, report, digest)
    finally:
        await conn.close()


def add_parsers(pol: Any) -> None:
    """`whatif`, `record` and `verify` under `writ policy`."""
    w = pol.add_parser(
        "whatif", help="rule a candidate policy over a tenant's journaled decisions (no writes)"
    )
    w.add_argument("--policy", required=True, help="the candidate policy (JSON)")
    w.add_argument("--tenant", required=True)
    w.add_argument("--since", required=True, help="how far back: 30m, 24h, 7d")
    w.add_argument("--until", default="", help="ISO time the window ends (default: now)")
    w.add_argument("--output", default="", help="the report file (JSON)")
    w.add_argument("--dsn", default="", help="an auditor's DSN (default: writ run's)")
    w.add_argument("--governance-keys", default="", help="governance's journal data key file")
    w.add_argument("--admission-keys", default="", help="admission's journal data key file")
    w.add_argument("--home", default=".writ")
    w.set_defaults(func=_whatif)
    for name, func, help_, dsn in (
        ("record", _record, "journal a what-if report's digest (sealed and signed)", "eval"),
        ("verify", _verify, "check that a what-if report is the one sealed (0 it is)", "audit"),
    ):
        p = pol.add_parser(name, help=help_)
        p.add_argument("report")
        p.add_argument("--dsn", default="", help=f"the {dsn} role's DSN (default: writ run's)")
        p.add_argument("--data-keys", default="", help="the planner's journal data key file")
        p.add_argument("--home", default=".writ")
        p.set_defaults(func=func)
