"""`writ eval build | run | record`: the command line of the evaluation (`writ/eval/`).

`build` reads journaled runs with an auditor's read-only DSN and the planner's data keys, the
facts admission resolved their proposals against and the policy governance ruled them with
(`_sources.py`), and hand-written case files, and writes an encrypted set. `run` opens no bus
and no database connection: it reads the set and the candidate config, asks the candidate, and
writes the report. `record` journals a report's digest as the eval role, which may call one
function and nothing else, to be sealed and signed with the planner's chain (`_record.py`).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["add_parser"]


def _keys(path: Path, *, create: bool) -> Any:
    from libs.journal import DataKeys

    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(DataKeys.generate("eval-1"))
        path.chmod(0o600)
    return DataKeys.from_json(path.read_text())


def _set_keys(args: argparse.Namespace, *, create: bool = False) -> Any:
    return _keys(
        Path(args.set_keys or Path(args.home) / "secrets" / "eval-data.json"), create=create
    )


def _build(args: argparse.Namespace) -> int:
    """Build a set; 0 written, 1 some runs could not be used (listed), 3 nothing to build from."""
    import anyio

    from libs.errors import ConfigError
    from writ.eval._case import load_case_file, make_set, seal_set
    from writ.eval._sources import governance, journal_cases, journal_source

    facts = _json_file(args.facts) if args.facts else {}
    policy = _json_file(args.policy) if args.policy else None
    cases: list[Any] = []
    skipped: list[Any] = []
    try:
        for path in args.cases or []:
            cases += load_case_file(path)
        if args.from_journal:
            dsn, journal = journal_source(args)
            ruled = governance(args)
            found, skipped = anyio.run(
                functools.partial(journal_cases, args, dsn, journal, ruled, facts, policy)
            )
            cases += found
        eval_set = make_set(args.tenant, cases)
        stored = seal_set(eval_set, _set_keys(args, create=True))
    except (ConfigError, OSError) as exc:
        print(f"cannot build the set: {exc}", file=sys.stderr)
        return 3
    if not eval_set.cases:
        print("no case: pass --cases or --from-journal with runs to use", file=sys.stderr)
        return 3
    Path(args.out).write_bytes(stored)
    for why in skipped:
        print(f"skipped: {why}", file=sys.stderr)
    print(
        f"set {eval_set.version} (tenant {eval_set.tenant}): {len(eval_set.cases)} cases "
        f"written to {args.out}, encrypted"
    )
    return 1 if skipped else 0


def _json_file(path: str) -> Any:
    import json

    return json.loads(Path(path).read_text())


def _run(args: argparse.Namespace) -> int:
    """Run a candidate on a set: the gate's exit code (0 pass, 1 regression, 2 incomplete), or
    3 if it cannot run (no set, wrong keys, another version's baseline)."""
    import anyio

    from libs.errors import ConfigError
    from writ.eval._case import open_set
    from writ.eval._cost import parse_cost_limit
    from writ.eval._report import Report, junit_xml, render, report_digest, summarize
    from writ.eval._run import load_candidate

    try:
        limits = [parse_cost_limit(t, scope="total") for t in args.cost_ratio or ()] + [
            parse_cost_limit(t, scope="case") for t in args.case_cost_ratio or ()
        ]
        if limits and not args.baseline:
            raise ConfigError(
                "--cost-ratio and --case-cost-ratio compare with a baseline report: pass --baseline"
            )
        eval_set = open_set(Path(args.set).read_bytes(), _set_keys(args), tenant=args.tenant)
        candidate = load_candidate(args.candidate)
        baseline = (
            msgspec.json.decode(Path(args.baseline).read_bytes(), type=Report)
            if args.baseline
            else None
        )
    except (ConfigError, OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 3
    results, runs = anyio.run(
        functools.partial(_ask_all, eval_set, candidate, args.k, tuple(args.allow or ()), args.mode)
    )
    try:
        report = summarize(
            eval_set,
            candidate.name,
            results,
            k=args.k,
            baseline=baseline,
            max_tokens=args.max_tokens,
            cost_fails=args.cost_fails,
            cost_limits=limits,
            mode=args.mode,
            runs=runs,
        )
    except ValueError as exc:
        print(f"cannot compare: {exc}", file=sys.stderr)
        return 3
    encoded = msgspec.json.format(msgspec.json.encode(report, order="sorted"), indent=2)
    if args.json:
        Path(args.json).write_bytes(encoded)
    if args.junit:
        Path(args.junit).write_bytes(junit_xml(report))
    print(render(report))
    print(f"report sha256 {report_digest(report)}")
    return report.gate.exit_code


async def _ask_all(eval_set: Any, candidate: Any, k: int, allow: tuple[str, ...], mode: str) -> Any:
    from writ.eval._run import candidate_provider, run_rollout, run_step

    async with candidate_provider(candidate, allow=allow) as provider:
        if mode == "rollout":
            return await run_rollout(eval_set, provider, k=k)
        return await run_step(eval_set, provider, k=k), None


def _record(args: argparse.Namespace) -> int:
    """Journal a report's digest (kind `eval.report`) as the eval role: 0 recorded, 3 if it
    cannot be (`_record.py`)."""
    import anyio
    import asyncpg

    from libs.journal import DataKeys, Journal
    from writ.eval._report import Report, report_digest

    home = Path(args.home)
    try:
        report = msgspec.json.decode(Path(args.report).read_bytes(), type=Report)
        keys = DataKeys.from_json(
            Path(args.data_keys or home / "secrets" / "journal-planner-data.json").read_text()
        )
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"cannot record: {exc}", file=sys.stderr)
        return 3
    dsn_file = home / "secrets" / "eval.dsn"
    dsn = (
        args.dsn
        or os.environ.get("WRIT_EVAL_DATABASE_URL")
        or (dsn_file.read_text().strip() if dsn_file.exists() else "")
    )
    if not dsn:
        print(
            "no database: pass --dsn (the eval role's), set WRIT_EVAL_DATABASE_URL or run "
            "`writ run`",
            file=sys.stderr,
        )
        return 3
    digest = report_digest(report)
    try:
        row_id = anyio.run(
            functools.partial(
                _journal_report, dsn, Journal(service="planner", keys=keys), report, digest
            )
        )
    except (OSError, ValueError, asyncpg.PostgresError) as exc:
        print(f"cannot record: {exc}", file=sys.stderr)
        return 3
    print(
        f"report {digest} of {report.candidate} on set {report.set_version} "
        f"({report.gate.verdict}) journaled as planner journal row {row_id}; the planner's "
        "sealer signs it"
    )
    return 0


async def _journal_report(dsn: str, journal: Any, report: Any, digest: str) -> int:
    import asyncpg

    from writ.eval._record import record_report

    conn = await asyncpg.connect(dsn)
    try:
        return await record_report(conn, journal, report, digest)
    finally:
        await conn.close()


def _verify(args: argparse.Namespace) -> int:
    """Whether a report file is the one journaled: 0 its digest is in a sealed `eval.report`
    entry of its tenant's planner journal (the chain itself is `writ audit verify`'s to
    prove), 1 it is not, 3 it cannot be checked."""
    import anyio

    from libs.errors import ConfigError
    from writ.eval._report import Report, report_digest
    from writ.eval._sources import journal_source

    try:
        report = msgspec.json.decode(Path(args.report).read_bytes(), type=Report)
        dsn, journal = journal_source(args)
    except (ConfigError, OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"cannot verify: {exc}", file=sys.stderr)
        return 3
    digest = report_digest(report)
    seq = anyio.run(functools.partial(_sealed_report, dsn, journal, report, digest))
    if seq is None:
        print(
            f"report {digest} of {report.candidate} on set {report.set_version} is NOT in "
            f"tenant {report.tenant}'s sealed planner journal",
            file=sys.stderr,
        )
        return 1
    print(
        f"report {digest} of {report.candidate} on set {report.set_version} "
        f"({report.gate.verdict}) is sealed at planner journal seq {seq}; "
        "`writ audit verify --service planner` proves the chain and its signatures"
    )
    return 0


async def _sealed_report(dsn: str, journal: Any, report: Any, digest: str) -> int | None:
    import json

    import asyncpg

    from libs.journal import read_entries
    from writ.eval._record import RECORD_KIND

    conn = await asyncpg.connect(dsn)
    try:
        for seq, row, plaintext in await read_entries(
            conn, journal, tenant=report.tenant, subject=report.set_version
        ):
            if row["kind"] == RECORD_KIND and json.loads(plaintext).get("digest") == digest:
                return int(seq)
    finally:
        await conn.close()
    return None


def _shadow(args: argparse.Namespace) -> int:
    """Shadow the runs that start beside the deployment, as NATS user `eval`, following them
    through the planner's journal with the auditor's read-only DSN, until `--count` runs
    settled (or SIGINT); then each tenant's report, and its gate's exit code (0 pass,
    1 regression, 2 incomplete), or 3 if it cannot start."""
    import anyio

    from libs.errors import ConfigError
    from writ.eval._run import load_candidate
    from writ.eval._sources import journal_source

    home = Path(args.home)
    try:
        candidate = load_candidate(args.candidate)
        password = (home / "secrets" / "nats-eval.password").read_text().strip()
        nats_url = args.nats_url or os.environ.get("WRIT_NATS_URL", "")
        if not nats_url:
            raise ConfigError("no NATS: pass --nats-url or set WRIT_NATS_URL")
        dsn, journal = journal_source(args)
        policy = _json_file(args.policy) if args.policy else None
        facts = _json_file(args.facts) if args.facts else {}
    except (ConfigError, OSError, ValueError, msgspec.DecodeError) as exc:
        print(f"cannot shadow: {exc}", file=sys.stderr)
        return 3
    out = open(args.out, "ab") if args.out else None  # noqa: SIM115 - closed below

    def write(record: Any) -> None:
        if out is not None:
            out.write(msgspec.json.encode(record) + b"\n")
            out.flush()
        print(
            f"{record.run_id}@{record.step} {record.agent}: would {record.would} "
            f"{record.capability or ''} {record.ruling or ''}".rstrip()
            + ("" if record.follows else " (not production's)")
            + (" WIDENING" if record.widening else ""),
            flush=True,
        )

    scored: list[Any] = []
    try:
        anyio.run(
            functools.partial(
                _shadow_run,
                nats_url,
                password,
                candidate,
                dsn,
                journal,
                policy,
                facts,
                args.count,
                write,
                scored,
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        if out is not None:
            out.close()
    return _shadow_summary(scored, candidate.name, args.json)


def _shadow_summary(scored: list[Any], candidate: str, json_path: str) -> int:
    """Each tenant's shadowed decisions as a report (table, and JSON if asked); the worst
    gate's exit code, 0 if nothing was shadowed."""
    from writ.eval._report import render, report_digest
    from writ.eval._shadow import shadow_reports

    reports = shadow_reports(scored, candidate)
    for tenant, report in reports.items():
        print(render(report))
        print(f"report sha256 {report_digest(report)}")
        if json_path:
            path = Path(json_path)
            if len(reports) > 1:
                path = path.with_name(f"{path.stem}.{tenant}{path.suffix}")
            path.write_bytes(
                msgspec.json.format(msgspec.json.encode(report, order="sorted"), indent=2)
            )
    return max((r.gate.exit_code for r in reports.values()), default=0)


async def _shadow_run(
    nats_url: str,
    password: str,
    candidate: Any,
    dsn: str,
    journal: Any,
    policy: Any,
    facts: Any,
    count: int | None,
    write: Any,
    scored: list[Any],
) -> None:
    import asyncpg
    import nats

    from libs.natsauth import EVAL, inbox_prefix
    from services.planner.store import read_replay
    from writ.eval._facts import recorded_facts
    from writ.eval._run import candidate_provider
    from writ.eval._shadow import shadow

    conn = await asyncpg.connect(dsn)
    nc = await nats.connect(
        nats_url,
        user=EVAL,
        password=password,
        inbox_prefix=inbox_prefix(EVAL),
        max_reconnect_attempts=-1,
    )

    async def replay(tenant: str, run_id: str) -> Any:
        entries, _, _ = await read_replay(conn, journal, tenant=tenant, run_id=run_id)
        return entries

    async def facts_of(tenant: str, run_id: str) -> Any:
        return await recorded_facts(conn, tenant, run_id)

    try:
        async with candidate_provider(candidate) as provider:
            await shadow(
                nc,
                provider,
                replay=replay,
                facts_of=facts_of,
                policy=policy,
                facts=facts,
                count=count,
                on_record=write,
                scored=scored,
                on_ready=lambda: print("shadowing as NATS user eval", flush=True),
            )
    finally:
        await nc.close()
        await conn.close()


def add_parser(sub: Any) -> None:
    """`writ eval` and its subcommands."""
    p = sub.add_parser(
        "eval",
        help="score a candidate model on a versioned set of decision points (no write can leave)",
    )
    ev = p.add_subparsers(dest="action", required=True)
    b = ev.add_parser("build", help="build an encrypted set from journaled runs and case files")
    b.add_argument("--tenant", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--cases", action="append", help="a hand-written case file (repeatable)")
    b.add_argument(
        "--from-journal",
        action="store_true",
        help="add the decision points of the tenant's journaled runs",
    )
    b.add_argument("--agent", default=None)
    b.add_argument("--outcome", default=None, help="runs that ended so (e.g. succeeded)")
    b.add_argument("--since", default=None, help="ISO time, inclusive")
    b.add_argument("--until", default=None, help="ISO time, exclusive")
    b.add_argument(
        "--facts", default="", help='JSON {"<kind>:<id>": facts} the contracts resolve against'
    )
    b.add_argument(
        "--policy",
        default="",
        help="JSON of governance facts for the cases governance journaled none for",
    )
    b.add_argument(
        "--governance-keys",
        default="",
        help="governance's journal data keys, to read the policy each proposal was ruled with "
        "(default: writ run's, if present)",
    )
    b.add_argument("--dsn", default="", help="an auditor's DSN (default: writ run's)")
    b.add_argument("--data-keys", default="", help="the planner's journal data key file")
    for q in (b,):
        q.add_argument("--home", default=".writ")
        q.add_argument(
            "--set-keys",
            default="",
            help="the sets' data key file (default: <home>/secrets/eval-data.json)",
        )
    b.set_defaults(func=_build)
    r = ev.add_parser(
        "run", help="ask a candidate every case k times; exit 0 pass, 1 regression, 2 incomplete"
    )
    r.add_argument("--set", required=True)
    r.add_argument("--candidate", required=True, help="a candidate provider config (JSON)")
    r.add_argument("-k", type=int, default=1)
    r.add_argument(
        "--mode",
        choices=("step", "rollout"),
        default="step",
        help="step: each decision point k times; rollout: the candidate drives "
        "each journaled run k times, served from the recording",
    )
    r.add_argument("--tenant", default=None, help="refuse a set of another tenant")
    r.add_argument("--baseline", default="", help="an earlier report on the same set version")
    r.add_argument("--json", default="", help="write the JSON report here")
    r.add_argument("--junit", default="", help="write JUnit XML here")
    r.add_argument("--max-tokens", type=int, default=None, help="cost threshold")
    r.add_argument("--cost-fails", action="store_true", help="above it fail, not warn")
    r.add_argument(
        "--cost-ratio",
        action="append",
        metavar="METRIC=RATIO[:fail]",
        help="at most RATIO times the baseline's calls, tokens or steps per pass "
        "over the set; above it warns, or fails with :fail (repeatable; "
        "needs --baseline)",
    )
    r.add_argument(
        "--case-cost-ratio",
        action="append",
        metavar="METRIC=RATIO[:fail]",
        help="the same limit on every case (repeatable; needs --baseline)",
    )
    r.add_argument(
        "--allow",
        action="append",
        help="another origin the candidate's client may reach (a loopback fake)",
    )
    r.add_argument("--home", default=".writ")
    r.add_argument("--set-keys", default="")
    r.set_defaults(func=_run)
    sh = ev.add_parser(
        "shadow",
        help="run a candidate beside the deployment on a copy of the "
        "runs that start; its asks and proposals are recorded, "
        "never sent or admitted",
    )
    sh.add_argument("--candidate", required=True)
    sh.add_argument("--out", default="", help="append the would-be decisions here (JSON lines)")
    sh.add_argument(
        "--json",
        default="",
        help="write the report of what was shadowed here (one file per tenant if several)",
    )
    sh.add_argument(
        "--count",
        type=int,
        default=None,
        help="stop once this many runs settled (ended, or stopped for a person)",
    )
    sh.add_argument("--policy", default="")
    sh.add_argument(
        "--facts",
        default="",
        help='JSON {"<kind>:<id>": facts} the contracts resolve and preview against (read-only)',
    )
    sh.add_argument("--nats-url", default="")
    sh.add_argument("--dsn", default="", help="an auditor's DSN (default: writ run's)")
    sh.add_argument("--data-keys", default="", help="the planner's journal data key file")
    sh.add_argument("--home", default=".writ")
    sh.set_defaults(func=_shadow)
    c = ev.add_parser(
        "record", help="journal a report's digest (sealed and signed with the planner's chain)"
    )
    c.add_argument("report")
    c.add_argument(
        "--dsn",
        default="",
        help="the eval role's DSN (default: WRIT_EVAL_DATABASE_URL, or writ run's)",
    )
    c.add_argument("--data-keys", default="")
    c.add_argument("--home", default=".writ")
    c.set_defaults(func=_record)
    v = ev.add_parser(
        "verify",
        help="check that a report is the one sealed in the planner's "
        "journal (exit 0 it is, 1 it is not)",
    )
    v.add_argument("report")
    v.add_argument("--dsn", default="", help="an auditor's DSN (default: writ run's)")
    v.add_argument("--data-keys", default="", help="the planner's journal data key file")
    v.add_argument("--home", default=".writ")
    v.set_defaults(func=_verify)
