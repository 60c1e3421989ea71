"""The raw ceilings the command path is bounded by: JetStream alone, and the admission
transaction alone, on the same servers."""

from __future__ import annotations

import hashlib
import json
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import anyio
import asyncpg
import msgspec
import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

from bench.measure import Measurement, Watcher, closed_loop
from libs.db import connect_pool
from libs.journal import Sealer, open_journal
from libs.settings import read_secret
from schemas.admission import DispatchCommand
from schemas.governance import Decision
from services.admission.store import AdmissionStore
from writ.stack import Stack

__all__ = ["CEILING_TENANT", "admission_ceiling", "ceiling_twin", "jetstream_ceiling"]

# The admission ceiling's rows go under their own tenant so they can be removed afterwards.
CEILING_TENANT = "bench-ceiling"
_STREAM = "BENCH_JS"
# The admission statement's wake-up of the relay; replaced to measure the transaction without it.
_NOTIFY = "pg_notify($20, '')"


async def ceiling_twin(stack: Stack) -> Stack:
    """A second database on the same Postgres server, provisioned exactly as the deployment's
    (same migrations, roles, journal keys), for the admission ceiling.

    The ceiling is measured between passes of the command path, while the services run: in the
    deployment's own database the relay would be woken by every ceiling row and publish it, and
    the dispatcher execute it, inside the ceiling's window. Nothing listens on the twin. Same
    server, same WAL and disk, same CPU: only the rows are elsewhere.
    """
    twin = Stack(
        home=stack.home / "ceiling-twin",
        nats_url=stack.nats_url,
        admin_dsn=stack.admin_dsn,
        database=f"{stack.database}_ceiling",
    )
    for folder in (twin.secrets, twin.config, twin.logs):
        folder.mkdir(parents=True, exist_ok=True)
    twin.secrets.chmod(0o700)
    await twin.provision()
    return twin


async def jetstream_ceiling(
    nats_url: str,
    *,
    publishers: int,
    batch: int,
    warmup_s: float,
    duration_s: float,
    watcher: Watcher | None = None,
) -> tuple[Measurement, Measurement]:
    """(published, consumed) DispatchCommand-sized messages: publish + pull + explicit ack.

    Publishers keep `publishers` PubAcks outstanding; a pull consumer in its own process
    (`bench.jsconsume`) fetches `batch` at a time and acks each message, at the same time.
    Both count only what completed inside the same window; the consumed count is the
    end-to-end figure.
    """
    payload = msgspec.json.encode(DispatchCommand(tenant="acme", operation_id=str(uuid.uuid4())))
    nc = await nats.connect(nats_url, name="bench-js-publisher")
    js = nc.jetstream()
    # The same shape as WRIT_CMD: file storage, limits retention, dedupe on Nats-Msg-Id.
    await js.add_stream(
        StreamConfig(
            name=_STREAM,
            subjects=["bench.js.>"],
            storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS,
            duplicate_window=120.0,
        )
    )
    try:
        await js.add_consumer(
            _STREAM,
            ConsumerConfig(
                durable_name="bench",
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30.0,
                max_ack_pending=max(10 * batch, 1000),
            ),
        )
        counter = iter(range(1 << 62))

        async def publish_one() -> bool:
            # A unique Nats-Msg-Id, as the relay sends: the server checks it against its window.
            await js.publish(
                "bench.js.acme",
                payload,
                headers={"Nats-Msg-Id": f"bench:{next(counter)}"},
                timeout=30,
            )
            return True

        start = time.monotonic() + warmup_s
        end = start + duration_s
        consumer: dict[str, float] = {}

        async def consume() -> None:
            done = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "bench.jsconsume",
                    nats_url,
                    str(batch),
                    repr(start),
                    repr(end),
                ],
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    "the JetStream consumer process failed:\n"
                    + done.stderr.decode(errors="replace")[-2000:]
                )
            consumer.update(json.loads(done.stdout))

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            published = await closed_loop(
                publish_one,
                concurrency=publishers,
                warmup_s=start - time.monotonic(),
                duration_s=duration_s,
                watcher=watcher,
            )
        if consumer["ready"] > published.window_start:
            # A consumer that started late would count a backlog, not a steady state.
            raise RuntimeError(
                "the JetStream consumer process began pulling "
                f"{consumer['ready'] - published.window_start:.1f} s into the "
                "window: give the ceiling a longer warm-up"
            )
        consumed = Measurement(
            completed=int(consumer["acked"]),
            failed=0,
            window_start=published.window_start,
            window_end=published.window_end,
            latencies_s=[],
        )
        return published, consumed
    finally:
        await js.delete_stream(_STREAM)
        await nc.close()


def ceiling_decision() -> Decision:
    """A decision as governance gives it for `writ.noop` to an agent with a standing grant."""
    return Decision(
        decision_id=str(uuid.uuid4()),
        verdict="allow",
        line=5,
        family="write_delete",
        reason="standing grant for write_delete",
        policy_version="default",
    )


async def admission_ceiling(
    stack: Stack,
    *,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    journal: bool = True,
    notify: bool = True,
    watcher: Watcher | None = None,
) -> Measurement:
    """`AdmissionStore.admit` alone (proposal + command + outbox + notify in one transaction),
    as the admission role, with a pool of `concurrency` connections kept busy.

    With `journal` (as deployed), each admission also writes its encrypted journal row, and the
    journal's sealer chains and signs them in this process meanwhile, as it does in admission's.
    `notify=False` is a diagnostic, never the ceiling: the same statement without its
    `pg_notify` (Postgres serialises the commits of notifying transactions database-wide).
    """
    env = stack.service_env("admission")
    pool = await connect_pool(
        env["WRIT_DATABASE_URL"],
        password=read_secret(env["WRIT_DATABASE_PASSWORD_FILE"]),
        min_size=concurrency + 1,
        max_size=concurrency + 1,
        application_name="bench-admission",
    )
    journal_, signing = open_journal(
        "admission",
        signing_key_file=env["WRIT_JOURNAL_SIGNING_KEY_FILE"],
        data_keys_file=env["WRIT_JOURNAL_DATA_KEYS_FILE"],
    )
    store = AdmissionStore(pool, journal=journal_ if journal else None)
    if not notify:
        # The store's private statement, edited for this diagnostic only: the parameter stays
        # (cast to text, as pg_notify types it) so the statement's arguments are unchanged.
        assert _NOTIFY in store._admit
        store._admit = store._admit.replace(_NOTIFY, "$20::text")
    decision = ceiling_decision()
    ttl = timedelta(hours=1)

    async def admit_one() -> bool:
        operation_id = str(uuid.uuid4())
        await store.admit(
            tenant=CEILING_TENANT,
            operation_id=operation_id,
            proposal_id=str(uuid.uuid4()),
            run_id=operation_id,
            step=0,
            principal="bench@acme.example",
            agent="crm-assistant",
            action="writ.noop",
            version=1,
            arguments={"marker": operation_id},
            # Any 32 bytes do: the transaction stores the hash, it does not recompute it.
            request_hash=hashlib.sha256(operation_id.encode()).digest(),
            decision=decision,
            ttl=ttl,
            preview={"marker": operation_id},
        )
        return True

    try:
        async with anyio.create_task_group() as tg:
            if journal:
                await tg.start(Sealer(pool=pool, journal=journal_, signing=signing).run)
            sample = await closed_loop(
                admit_one,
                concurrency=concurrency,
                warmup_s=warmup_s,
                duration_s=duration_s,
                watcher=watcher,
            )
            tg.cancel_scope.cancel()
        return sample
    finally:
        await pool.close()
        await remove_ceiling_rows(stack.database_dsn)


async def remove_ceiling_rows(dsn: str) -> dict[str, Any]:
    """Delete what the admission ceiling wrote, children first (foreign keys)."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            counts = {}
            for table in ("outbox", "commands", "proposals"):
                status = await conn.execute(
                    f"DELETE FROM admission.{table} WHERE tenant = $1", CEILING_TENANT
                )
                counts[table] = int(status.split()[-1])
        # The relay scans the outbox: leave it no dead rows the services would not have made.
        for table in ("outbox", "commands", "proposals"):
            await conn.execute(f"VACUUM ANALYZE admission.{table}")
        return counts
    finally:
        await conn.close()
