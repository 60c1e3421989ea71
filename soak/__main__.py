"""`python -m soak` (`make soak`): start a deployment, drive the load under the nemesis for
SOAK_S seconds, heal, settle, check, print the summary and write it to SOAK_OUT.

Exit status 0 when every invariant held, 1 when one broke (the deployment's folder, every log
in it, is then kept), 2 when the soak itself could not run. Settings: soak/settings.py.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import nats.errors

from soak.backlog import backlog
from soak.check import check, outcomes, settled, stream_replicas
from soak.deploy import Deployment, admin_connect
from soak.load import Load
from soak.nemesis import Fault, Nemesis, schedule
from soak.observe import (
    FD_SLACK,
    PG_SLACK,
    RSS_FACTOR,
    RSS_SLACK_MB,
    Observer,
    dropped_requests,
)
from soak.settings import SoakSettings
from writ.stack import Stack

SAMPLE_EVERY_S = 30.0
# How long the deployment rests after settling before its resources are read at the end: twice
# the dispatcher connectors' keep-alive (services/dispatcher/connectors/http.py).
AT_REST_S = 10.0
# The first part of the run under faults that still counts as warm-up for resources: pools
# open connections as bursts ask for them (after a PostgreSQL restart too), up to their size,
# so the baseline is each figure's peak over the first half; a leak keeps growing after it.
WARM_FRACTION, WARM_MIN_S = 0.5, 30.0


async def soak(
    deployment: Deployment, settings: SoakSettings, faults: list[Fault]
) -> dict[str, Any]:
    """The load, the nemesis, healing, settling and the checker; returns the summary."""
    stack, log = deployment.stack, deployment.log
    load = Load(
        stack,
        rng=random.Random(settings.seed + 1),
        command_rate=settings.command_rate,
        run_rate=settings.run_rate,
        refund_rate=settings.refund_rate,
        repeat_fraction=settings.repeat_fraction,
        conflict_fraction=settings.conflict_fraction,
        hostile_every_s=settings.hostile_every_s,
        chat_rate=settings.chat_rate,
    )
    await load.open()
    observer = Observer(stack, list(deployment.service_instances))
    nemesis = Nemesis(deployment, faults)
    settle: dict[str, Any] = {}
    driving_done = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(load.collect)
            tg.start_soon(load.approve)
            log(
                "load",
                f"warm-up {settings.warmup_s:.0f}s, then {settings.duration_s:.0f}s "
                "under the nemesis",
            )
            async with anyio.create_task_group() as driving:
                driving.start_soon(load.drive, settings.warmup_s + settings.duration_s)
                await anyio.sleep(settings.warmup_s)
                await observer.take_baseline()
                driving.start_soon(nemesis.run, time.monotonic())
                tg.start_soon(
                    _sample,
                    observer,
                    driving_done,
                    min(SAMPLE_EVERY_S, max(settings.duration_s / 12, 5.0)),
                )
            driving_done.set()
            log("load", "stopped; healing every fault")
            await nemesis.heal()
            healed = time.monotonic()  # the last fault healed: the bound counts from here
            await deployment.all_up(timeout=120)
            settle = await _settle(load, stack, settings.settle_s, log, since=healed)
            # Resources at rest: a connector's idle connections close after its keep-alive
            # (5 s), so a burst's pool is not mistaken for a leak; a leak stays.
            await anyio.sleep(AT_REST_S)
            end = await observer.sample("end")
            dropped = dropped_requests(stack, list(deployment.service_instances))
            load.stopping.set()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await load.close()
    assert observer.baseline is not None
    warm = observer.settled_baseline(
        observer.baseline["t"] + max(WARM_MIN_S, WARM_FRACTION * settings.duration_s)
    )
    checks = await check(
        deployment,
        load.ledger,
        faults=nemesis.kinds(),
        baseline=warm,
        end=end,
        instances=deployment.service_instances,
    )
    try:
        layout = await _streams(stack)
    except Exception as exc:  # the servers did not say: the replicas check fails with it
        layout = {"error": {"replicas": 0, "note": repr(exc)[:300]}}
    checks.append(stream_replicas(layout, 3 if settings.topology == "cluster" else 1))
    _within_bound(checks, settle, settings.bound_s)
    return {
        "seed": settings.seed,
        "topology": settings.topology,
        "duration_s": settings.duration_s,
        "warmup_s": settings.warmup_s,
        "bound_s": settings.bound_s,
        "rates_per_s": {
            "host_commands": settings.command_rate,
            "runs": settings.run_rate,
            "refunds": settings.refund_rate,
            "chat_messages": settings.chat_rate,
        },
        "schedule": [f.describe() for f in faults],
        "faults_injected": nemesis.kinds(),
        "faults": nemesis.applied,
        "restarts_by_supervisor": deployment.supervisor.restarts,
        "requests": load.ledger.counts(),
        "shed": load.ledger.shed,
        "requests_by_tenant": load.ledger.by_tenant(),
        "chat_sessions": len(load.ledger.sessions),
        "outcomes": outcomes(load.ledger),
        "settle": settle,
        "requests_dropped": dropped,
        "resources": {
            "bounds": {
                "rss": f"end <= {RSS_FACTOR}x warm-up + {RSS_SLACK_MB:.0f} MiB",
                "fds": f"end <= warm-up + {FD_SLACK} + the PostgreSQL pool",
                "pg_connections": f"end <= the role's pools + {PG_SLACK} per instance",
            },
            "warm_up": warm,
            "end": end,
            "samples": observer.samples,
        },
        "streams": layout,
        "invariants": [c.as_dict() for c in checks],
        "held": all(c.held for c in checks),
    }


async def _streams(stack: Stack) -> dict[str, Any]:
    """Each Writ stream's replicas, leader and messages at the end (the cluster's evidence)."""
    nc = await admin_connect(stack, connect_timeout=10)
    try:
        out: dict[str, Any] = {}
        for info in await nc.jetstream().streams_info():
            cluster = info.cluster
            out[info.config.name or "?"] = {
                "replicas": info.config.num_replicas,
                "messages": info.state.messages,
                "leader": cluster.leader if cluster else None,
                "current_replicas": [r.name for r in (cluster.replicas or []) if r.current]
                if cluster
                else [],
            }
        return out
    finally:
        await nc.close()


async def _sample(observer: Observer, done: anyio.Event, every_s: float) -> None:
    while not done.is_set():
        with anyio.move_on_after(every_s):
            await done.wait()
        if not done.is_set():
            await observer.sample()


def _within_bound(checks: list[Any], settle: dict[str, Any], bound_s: float) -> None:
    """`every_accepted_request_ended` holds only if it did within `bound_s` of the healing."""
    ended = next(c for c in checks if c.name == "every_accepted_request_ended")
    ended.note = f"within {bound_s:.0f}s of the last fault healed"
    seconds = settle.get("seconds_since_healed", 0.0)
    if seconds > bound_s:
        ended.fail(
            f"the last request ended {seconds:.0f}s after the last fault healed "
            f"(bound {bound_s:.0f}s)"
        )


async def _settle(
    load: Load, stack: Stack, wait_s: float, log: Any, *, since: float
) -> dict[str, Any]:
    """Until nothing is in flight, or `wait_s` passed; how long after `since` (the healing)
    that was. Every 15 s it logs what is left and where it waits (`backlog.py`)."""
    dsn = stack.database_dsn
    started = time.monotonic()
    note_at = started + 15.0
    left: dict[str, Any] = {}
    while time.monotonic() - started < wait_s:
        try:
            db = await asyncpg.connect(dsn, timeout=5)
            try:
                left = await settled(load.ledger, db)
                if left and any(left.values()) and time.monotonic() >= note_at:
                    # How the backlog drains, and where it waits, for the log.
                    log("settle", f"{time.monotonic() - since:.0f}s after healing, still: {left}")
                    log("settle", f"waiting in: {await backlog(stack, db)}")
                    note_at += 15.0
            finally:
                await db.close()
        except (OSError, asyncpg.PostgresError, nats.errors.Error) as exc:
            left = {"error": repr(exc)[:200]}
        if left and not any(left.values()):
            break
        await anyio.sleep(1.0)
    seconds = round(time.monotonic() - started, 1)
    since_healed = round(time.monotonic() - since, 1)
    log("settle", f"{seconds}s ({since_healed}s after the last fault healed): {left}")
    return {
        "seconds": seconds,
        "seconds_since_healed": since_healed,
        "wait_s": wait_s,
        "left": left,
    }


def _print(summary: dict[str, Any]) -> None:
    print("\n=== soak summary ===")
    print(
        f"seed {summary['seed']}  topology {summary['topology']}  "
        f"{summary['duration_s']:.0f}s under faults  rates {summary['rates_per_s']}"
    )
    print(
        f"faults injected: {summary['faults_injected']}  "
        f"(restarts by the supervisor: {summary['restarts_by_supervisor']})"
    )
    print(f"requests: {summary['requests']}  shed: {summary['shed']}")
    print(
        f"by tenant: {summary.get('requests_by_tenant')}  "
        f"chat sessions: {summary.get('chat_sessions')}"
    )
    print(f"outcomes: {summary['outcomes']}")
    replicas = {v["replicas"] for v in summary["streams"].values()}
    print(f"streams: {len(summary['streams'])} at {sorted(replicas)} replicas")
    print(
        f"settled {summary['settle'].get('seconds_since_healed')}s after the last fault healed "
        f"(bound {summary['bound_s']:.0f}s): {summary['settle'].get('left')}"
    )
    print(
        f"requests dropped by endpoints (since each instance started): "
        f"{summary.get('requests_dropped') or 'none'}"
    )
    for key, start in summary["resources"]["warm_up"]["processes"].items():
        end = summary["resources"]["end"]["processes"].get(key, {})
        print(
            f"  {key:<13} RSS {start['rss_mb']:>6} -> {end.get('rss_mb', '-'):>6} MiB   "
            f"fds {start['fds']:>4} -> {end.get('fds', '-')}"
        )
    print(
        f"  Postgres connections {summary['resources']['warm_up']['pg_connections']} -> "
        f"{summary['resources']['end']['pg_connections']}"
    )
    for inv in summary["invariants"]:
        mark = "held  " if inv["held"] else "BROKEN"
        print(f"{mark} {inv['name']} (examined {inv['examined']})")
        for example in inv["examples"]:
            print(f"         e.g. {example}")
    print("ALL INVARIANTS HELD" if summary["held"] else "AN INVARIANT BROKE")


def run(settings: SoakSettings, faults: list[Fault] | None = None) -> tuple[int, dict[str, Any]]:
    """One soak: its exit status (0 every invariant held, 1 one broke, 2 it could not run)
    and its summary (also written to `settings.out`). `faults`: this schedule instead of the
    seed's."""
    home = settings.home or Path(tempfile.mkdtemp(prefix="writ-soak-"))
    home.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(settings, home)
    faults = (
        faults
        if faults is not None
        else schedule(
            settings.seed,
            duration_s=settings.duration_s,
            every=settings.fault_every,
            lease_s=settings.lease_s,
            instances=sorted(deployment.service_instances),
            cluster=settings.topology == "cluster",
        )
    )
    print(
        f"Writ soak: seed {settings.seed} (SOAK_SEED={settings.seed} replays this schedule), "
        f"topology {settings.topology}, folder {home}",
        flush=True,
    )
    for fault in faults:
        print(f"  {fault.describe()}", flush=True)
    summary: dict[str, Any] = {"seed": settings.seed, "held": False}
    status = 2
    try:
        deployment.start()
        summary = anyio.run(soak, deployment, settings, faults)
        status = 0 if summary["held"] else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    except Exception:
        traceback.print_exc()
        summary["error"] = traceback.format_exc()[-3000:]
    finally:
        deployment.stop()
    summary["home"] = str(home)
    settings.out.write_text(json.dumps(summary, indent=2, default=str))
    if "invariants" in summary:
        _print(summary)
    print(f"Summary written to {settings.out}", flush=True)
    if status == 0 and not settings.keep:
        shutil.rmtree(home, ignore_errors=True)
    else:
        print(f"Deployment folder kept: {home} (logs in {home / 'stack' / 'logs'})")
    return status, summary


def main() -> int:
    """Run one soak as the environment says; 0 if every invariant held."""
    return run(SoakSettings.from_env())[0]


if __name__ == "__main__":
    sys.exit(main())
