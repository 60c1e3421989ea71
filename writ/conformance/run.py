"""The `writ conformance` command: run the crash matrix (or probe an endpoint) and report."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from writ.conformance.matrix import BOUNDARIES, CONTRACTS, Cell
from writ.conformance.target import ENV, Target, TargetError

__all__ = ["add_parser", "conforms", "table"]


def conforms(cells: list[Cell]) -> list[str]:
    """What the figures show to be wrong; empty when Writ and the connectors conform."""
    wrong = []
    for c in cells:
        where = f"{c.contract}/{c.boundary}"
        for verdict in ("duplicate", "lost", "mismatch"):
            if n := c.count(verdict):
                wrong.append(f"{where}: {n} {verdict}")
        if c.contract != "none" and (n := c.count("unknown")):
            wrong.append(f"{where}: {n} unknown where the provider can tell")
        if unlisted := sum(t.verdict == "unknown" and not t.listed for t in c.trials):
            wrong.append(f"{where}: {unlisted} unknown not listed by `writ reconcile list`")
        if c.reached < c.k:
            wrong.append(f"{where}: only {c.reached} of K = {c.k} commands reached the boundary")
    return wrong


def table(cells: list[Cell]) -> str:
    """The figures as a Markdown table (what docs/conformance.md shows)."""
    lines = [
        "| contract | boundary | K reached | commands | kills | interrupted | duplicates | losses "
        "| mismatches | unknown | listed | settled |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in cells:
        settled = "; ".join(f"{k} {v}" for k, v in sorted(c.settlements().items()))
        listed = sum(t.listed for t in c.trials)
        lines.append(
            f"| {c.contract} | {c.boundary} | {c.reached} | {len(c.trials)} | {c.crashes} "
            f"| {c.interrupted} "
            f"| {c.count('duplicate')} | {c.count('lost')} | {c.count('mismatch')} "
            f"| {c.count('unknown')} | {listed} | {settled} |"
        )
    return "\n".join(lines)


async def _matrix(args: argparse.Namespace) -> list[Cell]:
    from writ.conformance.deployment import Deployment
    from writ.conformance.matrix import run_cell

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="writ-conformance-") as home:
        dep = Deployment(Path(home), _target(args))
        try:
            await dep.start()
            if args.broken_crm:  # the deliberately broken connector: a repeated key acts again
                dep.control("crm", "/_control/idempotency", {"honour": False})
            for name in args.contract:
                for boundary in args.boundary:
                    cell = await run_cell(
                        dep, CONTRACTS[name], boundary, args.k, args.batch, progress
                    )
                    cells.append(cell)
                    progress(table([cell]).splitlines()[-1])  # each cell's figures as they come
        finally:
            if args.keep_logs and dep.stack is not None:
                import shutil

                shutil.copytree(dep.stack.logs, args.keep_logs, dirs_exist_ok=True)
            await dep.stop()
    return cells


def _target(args: argparse.Namespace) -> Target | None:
    """The running deployment to target, if `--target` or any of its settings says so."""
    given = {name: getattr(args, name) for name in ENV}
    if not args.target and not any(given.values()):
        return None
    try:
        return Target.read(given)
    except TargetError as exc:
        raise SystemExit(f"writ conformance --target: {exc}") from None


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _conformance(args: argparse.Namespace) -> int:
    if args.endpoint:
        return _endpoint(args)
    if not 0 < args.k <= 10_000 or not 0 < args.batch <= 64:
        raise SystemExit("--k must be 1..10000 and --batch 1..64")
    _target(args)  # refuse an incomplete target before anything starts
    signal.signal(signal.SIGTERM, _interrupted)  # stop the deployment on the way out
    started = time.monotonic()
    cells = anyio.run(_matrix, args)
    print(table(cells))
    wrong = conforms(cells)
    print(
        f"\n{len(cells)} cells, {sum(c.reached for c in cells)} commands at their boundary "
        f"of {sum(len(c.trials) for c in cells)} sent, "
        f"{time.monotonic() - started:.0f} s"
    )
    for line in wrong:
        print(f"NOT CONFORMING: {line}")
    if args.rows:
        with Path(args.rows).open("w") as out:
            for c in cells:
                for t in c.trials:
                    out.write(json.dumps(asdict(t)) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(_summary(cells, wrong), indent=2))
    return 1 if wrong else 0


def _summary(cells: list[Cell], wrong: list[str]) -> dict[str, Any]:
    return {
        "conforms": not wrong,
        "wrong": wrong,
        "cells": [
            {
                "contract": c.contract,
                "boundary": c.boundary,
                "k": c.k,
                "reached": c.reached,
                "commands": len(c.trials),
                "rounds": c.rounds,
                "kills": c.crashes,
                "interrupted": c.interrupted,
                "duplicates": c.count("duplicate"),
                "losses": c.count("lost"),
                "mismatches": c.count("mismatch"),
                "unknown": c.count("unknown"),
                "listed": sum(t.listed for t in c.trials),
                "settled": c.settlements(),
                "not_reached": c.not_reached,
            }
            for c in cells
        ],
    }


def _endpoint(args: argparse.Namespace) -> int:
    from writ.conformance.endpoint import probe_endpoint, read_credential

    if not args.credential_file:
        raise SystemExit("--endpoint needs --credential-file")
    report = probe_endpoint(
        args.endpoint,
        read_credential(Path(args.credential_file)),
        args.body,
        trials=args.k,
        id_field=args.id_field or None,
    )
    print(f"{report.url}: {report.trials} trials, each key sent twice")
    for verdict, n in sorted(report.verdicts.items()):
        print(f"  {verdict:<15} {n}   e.g. {report.examples[verdict]}")
    if report.conforms:
        print("conforms: every repeated key replayed the first answer")
        return 0
    if report.verdicts["double-applied"]:
        print("NOT CONFORMING: the endpoint acted again under a repeated idempotency key")
    else:
        print("NOT CONFORMING: the endpoint did not replay every repeated key")
    return 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "conformance",
        help="count duplicates, losses and unknowns under killed dispatchers (or check an "
        "endpoint's idempotency with --endpoint)",
    )
    p.add_argument(
        "--k",
        type=int,
        default=5,
        help="commands that must reach each boundary, per contract (rounds go on until they do)",
    )
    p.add_argument("--batch", type=int, default=32, help="commands killed together (1..64)")
    p.add_argument("--contract", nargs="+", choices=sorted(CONTRACTS), default=list(CONTRACTS))
    p.add_argument("--boundary", nargs="+", choices=list(BOUNDARIES), default=list(BOUNDARIES))
    p.add_argument(
        "--broken-crm",
        action="store_true",
        help="make the fake CRM act again under a repeated key (the kit must catch it)",
    )
    p.add_argument("--rows", default="", help="write every trial's row comparison (JSON lines)")
    p.add_argument("--json", default="", help="write the figures as JSON")
    p.add_argument("--keep-logs", default="", help="copy the services' logs to this folder")
    t = p.add_argument_group(
        "a running deployment (each setting also from its WRIT_CONFORMANCE_* variable)"
    )
    t.add_argument(
        "--target",
        action="store_true",
        help="run against a running deployment rather than one the kit starts",
    )
    t.add_argument("--nats-url", default="", help="an administrator's NATS URL (user:password@)")
    t.add_argument("--database-url", default="", help="Writ's database (reads the journal)")
    t.add_argument("--host-credentials", default="", help="the tenant's host folder")
    t.add_argument("--crm-url", default="", help="the CRM provider, with its control API")
    t.add_argument("--payments-url", default="", help="the payment provider, with its control API")
    t.add_argument("--faults-file", default="", help="the dispatcher's WRIT_FAULTS_FILE")
    p.add_argument("--endpoint", default="", help="a host's endpoint claiming idempotency")
    p.add_argument("--credential-file", default="", help="its bearer token (with --endpoint)")
    p.add_argument(
        "--body", default='{"body": "conformance trial {trial}"}', help="the JSON body sent"
    )
    p.add_argument("--id-field", default="", help="the answer's field naming what was done")
    p.set_defaults(func=_conformance)
