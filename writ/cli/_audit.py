"""`writ audit verify|export|replay|re-anchor`: the audit journal, checked, exported, replayed,
and its record outside the database started again by an operator when it was lost."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from writ.stack import JOURNALS, SERVICES

__all__ = ["add_parsers"]


async def _ignore(_exc: Exception) -> None:
    """nats-py logs every failed connect itself; the caller says what failed."""


# Connect once, fail fast (nats-py's 0 attempts means "retry forever").
_ONCE: dict[str, Any] = {
    "allow_reconnect": False,
    "max_reconnect_attempts": 1,
    "connect_timeout": 5,
    "error_cb": _ignore,
}


def _audit_dsn(args: argparse.Namespace) -> str:
    import os

    dsn_file = Path(args.home) / "secrets" / "audit.dsn"  # written by `writ run`
    dsn = (
        args.dsn
        or os.environ.get("WRIT_AUDIT_DATABASE_URL")
        or (dsn_file.read_text().strip() if dsn_file.exists() else "")
    )
    if not dsn:
        raise SystemExit("no database: pass --dsn, set WRIT_AUDIT_DATABASE_URL or run `writ run`")
    return dsn


def _audit_nats_url(args: argparse.Namespace) -> str:
    import os

    # The record lives in an account of its own (`AUDIT`): `writ run` writes the URL of its
    # administrator there; a server without authentication has one account, WRIT_NATS_URL's.
    record_file = Path(args.home) / "nats-audit.url"
    url_file = Path(args.home) / "nats-admin.url"  # written by `writ run`
    return (
        args.nats_url
        or os.environ.get("WRIT_AUDIT_NATS_URL")
        or (record_file.read_text().strip() if record_file.exists() else "")
        or os.environ.get("WRIT_NATS_URL")
        or (url_file.read_text().strip() if url_file.exists() else "")
    )


def _audit(args: argparse.Namespace) -> int:
    import functools
    import os

    import anyio

    from libs.journal import DataKeys, load_verify_keys

    home = Path(args.home)
    dsn = _audit_dsn(args)
    keys_file = Path(
        args.keys
        or os.environ.get("WRIT_JOURNAL_VERIFY_KEYS_FILE")
        or home / "config" / "journal-keys.json"
    )
    keys = load_verify_keys(keys_file.read_text())
    data_keys = None
    if args.data_keys:
        if len(args.service or []) != 1:
            raise SystemExit(
                "--data-keys authenticates one service's payloads: name it with --service"
            )
        data_keys = DataKeys.from_json(Path(args.data_keys).read_text())
    nats_url = "" if args.no_record or args.record_file else _audit_nats_url(args)
    if not (nats_url or args.record_file or args.no_record):
        raise SystemExit(
            "no record of the checkpoints to hold the database against: pass "
            "--nats-url (or set WRIT_AUDIT_NATS_URL), --record-file, or --no-record "
            "(then a cut tail or a re-hashed chain is not detected)"
        )
    return anyio.run(functools.partial(_audit_verify, args, dsn, keys, data_keys, nats_url))


async def _audit_verify(
    args: argparse.Namespace, dsn: str, keys: Any, data_keys: Any, nats_url: str
) -> int:
    """Verify each service's journal; 0 if all check out, 1 naming the first bad entry."""
    from datetime import timedelta

    import asyncpg
    import nats
    import nats.errors

    from libs.journal import (
        FileRecord,
        JetStreamRecord,
        Journal,
        RecordError,
        keys_for,
        verify,
    )

    try:
        nc = await nats.connect(nats_url, **_ONCE) if nats_url else None
    except (OSError, nats.errors.Error) as exc:
        print(
            f"cannot reach the record of checkpoints at {nats_url}: {exc!r} (pass "
            "--record-file <export> or, knowingly, --no-record)",
            file=sys.stderr,
        )
        return 2
    record: Any = (
        JetStreamRecord(nc.jetstream())
        if nc is not None
        else FileRecord(args.record_file)
        if args.record_file
        else None
    )
    conn = await asyncpg.connect(dsn)
    try:
        services = args.service or [
            r["table_schema"]
            for r in await conn.fetch(
                "SELECT table_schema FROM information_schema.tables WHERE table_name = 'journal' "
                "ORDER BY table_schema"
            )
        ]
        if not services:
            print("no audit journal in this database", file=sys.stderr)
            return 1
        failed = False
        for service in services:
            journal = (
                Journal(service=service, keys=await keys_for(conn, data_keys, schema=service))
                if data_keys
                else None
            )
            try:
                report = await verify(
                    conn,
                    service=service,
                    keys=keys,
                    tenant=args.tenant,
                    grace=timedelta(seconds=args.grace_s),
                    journal=journal,
                    record=record,
                )
            except RecordError as exc:
                print(f"{service}: cannot read its record: {exc}", file=sys.stderr)
                return 2
            counts = (
                f"{report.entries} entries, {report.checkpoints} signed checkpoints, "
                f"{report.unsealed} not sealed yet"
            )
            if report.recorded is not None:
                counts += f", {report.recorded} recorded outside the database"
            else:
                counts += ", NOT checked against a record"
            if report.pending is not None:
                counts += f"; checkpoint {report.pending} recorded, being committed"
            if args.tenant is not None:
                counts += f"; {report.tenant_entries} of tenant {args.tenant}"
            if report.ok and report.reanchored:
                # Never "intact" alone: what a re-anchoring lost stays in every report.
                print(f"{service}: RE-ANCHORED, checks out since ({counts})")
                for note in report.reanchored:
                    print(f"    {note}")
                continue
            if report.ok:
                print(f"{service}: intact ({counts})")
                _print_expired(report.expired)
                continue
            failed = True
            first = report.problems[0]
            where = " at " if first.seq is not None or first.entry_id is not None else ": "
            print(f"{service}: FAILED{where}{first} ({counts})")
            for problem in report.problems[1:6]:
                print(f"    then {problem}")
            if len(report.problems) > 6:
                print(f"    and {len(report.problems) - 6} more")
            for note in report.reanchored:
                print(f"    {note}")
        return 1 if failed else 0
    finally:
        await conn.close()
        if nc is not None:
            await nc.close()


def _print_expired(expired: dict[str, int]) -> None:
    for window, count in sorted(expired.items()):
        print(
            f"    expired window {window}: {count} payload(s) erased; "
            "their digests still match the chain"
        )


def _audit_export(args: argparse.Namespace) -> int:
    import anyio

    nats_url = _audit_nats_url(args)
    if not nats_url:
        raise SystemExit("no NATS: pass --nats-url or set WRIT_NATS_URL")
    return anyio.run(_audit_export_run, args, nats_url)


async def _audit_export_run(args: argparse.Namespace, nats_url: str) -> int:
    """Append the checkpoints recorded since the export file was last written."""
    import nats

    from libs.journal import FileRecord, JetStreamRecord

    nc = await nats.connect(nats_url, **_ONCE)
    try:
        added = await FileRecord(args.out).export(
            JetStreamRecord(nc.jetstream()), args.service or JOURNALS
        )
    finally:
        await nc.close()
    print(f"{added} checkpoint(s) appended to {args.out}")
    return 0


def _audit_reanchor(args: argparse.Namespace) -> int:
    """Start a journal's lost record again at its database's head, naming what was lost."""
    import functools

    import anyio

    from libs.errors import ConfigError
    from libs.journal import DataKeys, SigningKey

    nats_url = _audit_nats_url(args)
    if not nats_url:
        raise SystemExit("no NATS: pass --nats-url or set WRIT_NATS_URL")
    secrets = Path(args.home) / "secrets"
    try:
        signing = SigningKey.from_json(
            Path(args.signing_key or secrets / f"journal-{args.service}-signing.json").read_text()
        )
        data_keys = DataKeys.from_json(
            Path(args.data_keys or secrets / f"journal-{args.service}-data.json").read_text()
        )
    except (OSError, ConfigError) as exc:
        print(f"cannot read {args.service}'s journal keys: {exc}", file=sys.stderr)
        return 2
    return anyio.run(
        functools.partial(
            _audit_reanchor_run, args, nats_url, _service_dsn(args), signing, data_keys
        )
    )


def _service_dsn(args: argparse.Namespace) -> str:
    """A DSN that may write the service's journal: --dsn, or writ run's own for the service."""
    import os
    from urllib.parse import urlsplit

    from libs.db import role_name, with_database

    if args.dsn or os.environ.get("WRIT_DATABASE_URL"):
        return args.dsn or os.environ["WRIT_DATABASE_URL"]
    secrets = Path(args.home) / "secrets"
    audit = secrets / "audit.dsn"
    password = secrets / f"pg-{args.service}.password"
    if not (audit.exists() and password.exists()):
        raise SystemExit(f"no database: pass --dsn (one that may write {args.service}'s journal)")
    dsn = audit.read_text().strip()
    database = urlsplit(dsn).path.lstrip("/")
    return with_database(
        dsn,
        database,
        user=role_name(database, args.service),
        password=password.read_text().strip(),
    )


async def _audit_reanchor_run(
    args: argparse.Namespace, nats_url: str, dsn: str, signing: Any, data_keys: Any
) -> int:
    import asyncpg
    import nats

    from libs.journal import (
        JetStreamRecord,
        Journal,
        ReAnchorError,
        RecordError,
        describe,
        reanchor,
    )

    nc = await nats.connect(nats_url, **_ONCE)
    conn = await asyncpg.connect(dsn)
    try:
        anchor = await reanchor(
            conn,
            record=JetStreamRecord(nc.jetstream()),
            journal=Journal(service=args.service, keys=data_keys),
            signing=signing,
            by=args.by,
            reason=args.reason,
        )
    except (ReAnchorError, RecordError) as exc:
        print(f"{args.service}: not re-anchored: {exc}", file=sys.stderr)
        return 1
    finally:
        await conn.close()
        await nc.close()
    print(f"{args.service}: {describe(anchor)}")
    return 0


def _audit_replay(args: argparse.Namespace) -> int:
    """Replay a run offline from the planner's journal: 0 identical, 1 divergent, 2 incomplete,
    3 if it cannot be replayed (no database, no keys, no such run)."""
    import functools
    import os

    import anyio

    from libs.errors import ConfigError
    from libs.journal import DataKeys

    home = Path(args.home)
    dsn_file = home / "secrets" / "audit.dsn"  # written by `writ run`
    dsn = (
        args.dsn
        or os.environ.get("WRIT_AUDIT_DATABASE_URL")
        or (dsn_file.read_text().strip() if dsn_file.exists() else "")
    )
    keys_file = Path(args.data_keys or home / "secrets" / "journal-planner-data.json")
    if not dsn:
        print(
            "no database: pass --dsn, set WRIT_AUDIT_DATABASE_URL or run `writ run`",
            file=sys.stderr,
        )
        return 3
    try:
        data_keys = DataKeys.from_json(keys_file.read_text())
    except (OSError, ConfigError) as exc:
        print(f"cannot read the planner's data keys ({keys_file}): {exc}", file=sys.stderr)
        return 3
    return anyio.run(functools.partial(_audit_replay_run, args, dsn, data_keys))


async def _audit_replay_run(args: argparse.Namespace, dsn: str, data_keys: Any) -> int:
    import asyncpg

    from libs.journal import Journal, PayloadExpired, keys_for
    from services.planner.replay import expired, render, replay_run
    from services.planner.store import read_replay

    conn = await asyncpg.connect(dsn)
    try:
        journal = Journal(service="planner", keys=await keys_for(conn, data_keys, schema="planner"))
        # A chat session (`ses-...`): each of its turns is a run, replayed in turn order.
        runs = [args.run_id]
        if args.run_id.startswith("ses-") and "-t" not in args.run_id.removeprefix("ses-"):
            runs = sorted(
                {
                    r["run_id"]
                    for r in await conn.fetch(
                        "SELECT DISTINCT run_id FROM planner.journal WHERE run_id LIKE $1 "
                        "AND run_id NOT LIKE '%.%'",
                        f"{args.run_id}-t%",
                    )
                },
                key=lambda r: int(r.rpartition("-t")[2]),
            )
            if not runs:
                print(f"session {args.run_id}: no turn in the planner's journal", file=sys.stderr)
                return 3
        tenant = args.tenant
        if tenant is None:  # the run's tenant, from the ids in clear in the journal
            tenants = [
                r["tenant"]
                for r in await conn.fetch(
                    "SELECT DISTINCT tenant FROM planner.journal WHERE run_id = $1", runs[0]
                )
            ]
            if len(tenants) != 1:
                print(
                    f"run {runs[0]}: "
                    + (
                        "not in the planner's journal"
                        if not tenants
                        else f"journaled for several tenants ({', '.join(tenants)}): pass --tenant"
                    ),
                    file=sys.stderr,
                )
                return 3
            tenant = tenants[0]
        read: list[tuple[str, Any]] = []
        for run_id in runs:
            try:
                read.append(
                    (run_id, await read_replay(conn, journal, tenant=tenant, run_id=run_id))
                )
            except PayloadExpired as exc:
                read.append((run_id, exc))
    finally:
        await conn.close()
    worst = 0
    for run_id, got in read:
        if isinstance(got, PayloadExpired):
            print(render(expired(run_id, got.key_id)))
            worst = 2
            continue
        entries, record, unsealed = got
        if not entries and record is None:
            print(f"run {run_id}: no such run of tenant {tenant}", file=sys.stderr)
            return 3
        report = replay_run(run_id, entries, record=record, unsealed=unsealed)
        print(render(report))
        worst = max(worst, {"identical": 0, "divergent": 1}.get(report.verdict, 2))
    return worst


def add_parsers(sub: Any) -> None:
    """`writ audit` and its subcommands."""
    p = sub.add_parser("audit", help="the audit journal")
    aud = p.add_subparsers(dest="action", required=True)
    v = aud.add_parser(
        "verify",
        help="check the whole chain, every checkpoint and signature, "
        "against the record outside the database; exit 1 naming "
        "the first bad entry, 2 if the record cannot be read",
    )
    v.add_argument("--home", default=".writ")
    v.add_argument(
        "--dsn",
        default="",
        help="an auditor's (read-only) DSN of Writ's database "
        "(default: WRIT_AUDIT_DATABASE_URL, or writ run's)",
    )
    v.add_argument(
        "--service",
        action="append",
        choices=SERVICES,
        help="verify this service's journal (repeatable; default: every journal)",
    )
    v.add_argument(
        "--tenant",
        default=None,
        help="also count this tenant's entries (the chain is always verified whole)",
    )
    v.add_argument(
        "--keys",
        default="",
        help="public keys, {service: {key id: PEM}} (default: "
        "WRIT_JOURNAL_VERIFY_KEYS_FILE, or writ run's)",
    )
    v.add_argument(
        "--data-keys",
        default="",
        help="the service's data key file: also authenticate every payload",
    )
    v.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        help="how long a committed row may wait to be sealed (default 10 s)",
    )
    v.add_argument(
        "--nats-url",
        default="",
        help="the NATS holding the record of checkpoints, as its account's user (default: "
        "WRIT_AUDIT_NATS_URL, or writ run's)",
    )
    v.add_argument(
        "--record-file",
        default="",
        help="hold the database against this export of the record instead (writ audit export)",
    )
    v.add_argument(
        "--no-record",
        action="store_true",
        help="check the database alone (a cut tail is then not detected)",
    )
    v.set_defaults(func=_audit)
    x = aud.add_parser(
        "export",
        help="append the checkpoints recorded since the last export to a file an auditor keeps",
    )
    x.add_argument("--out", required=True, help="the export (JSON lines), appended to")
    x.add_argument("--home", default=".writ")
    x.add_argument(
        "--nats-url",
        default="",
        help="the record's account's user (default: WRIT_AUDIT_NATS_URL, or writ run's)",
    )
    x.add_argument(
        "--service",
        action="append",
        choices=JOURNALS,
        help="this service's checkpoints (repeatable; default: every journal)",
    )
    x.set_defaults(func=_audit_export)
    a = aud.add_parser(
        "re-anchor",
        help="start a journal's record outside the database again at the database's head, "
        "after the record was lost or the tail cut: signed with the journal's key, naming "
        "what was lost, and journaled (the sealer refuses until then)",
    )
    a.add_argument("--service", required=True, choices=JOURNALS)
    a.add_argument("--by", required=True, help="who re-anchors (recorded and signed)")
    a.add_argument("--reason", required=True, help="why (recorded and signed)")
    a.add_argument("--home", default=".writ")
    a.add_argument(
        "--nats-url",
        default="",
        help="the record's account's user (default: WRIT_AUDIT_NATS_URL, or writ run's)",
    )
    a.add_argument(
        "--dsn",
        default="",
        help="a DSN that may write the service's journal (default: WRIT_DATABASE_URL, or "
        "writ run's service role)",
    )
    a.add_argument(
        "--signing-key", default="", help="the service's checkpoint key (default: writ run's)"
    )
    a.add_argument(
        "--data-keys", default="", help="the service's journal data keys (default: writ run's)"
    )
    a.set_defaults(func=_audit_reanchor)
    r = aud.add_parser(
        "replay",
        help="walk a run's captured model responses and tool outputs "
        "offline (no model, no tool); exit 0 identical, "
        "1 divergent, 2 incomplete",
    )
    r.add_argument("run_id")
    r.add_argument(
        "--tenant",
        default=None,
        help="the run's tenant (default: the one its journal entries name)",
    )
    r.add_argument("--home", default=".writ")
    r.add_argument(
        "--dsn",
        default="",
        help="an auditor's DSN of Writ's database (default: "
        "WRIT_AUDIT_DATABASE_URL, or writ run's)",
    )
    r.add_argument(
        "--data-keys", default="", help="the planner's journal data key file (default: writ run's)"
    )
    r.set_defaults(func=_audit_replay)
