"""The outbox relay: publishes admitted commands to `writ.cmd.<tenant>`.

It wakes on LISTEN/NOTIFY and also polls, because a notification sent while its listening
connection is down is simply lost. Rows are claimed with `FOR UPDATE SKIP LOCKED`, so several
replicas can relay side by side. A crash between publishing and deleting a row publishes it
again, and `Nats-Msg-Id` = `<tenant>:<operation_id>` makes the server drop the duplicate inside
the stream's duplicate window; beyond it, the dispatcher's registry check stops a second effect.
"""

from __future__ import annotations

import logging

import anyio
import anyio.abc
import asyncpg
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer

from libs.bus import publish
from libs.faults import Faults
from libs.telemetry import extract_context
from schemas import subjects
from schemas.admission import DispatchCommand
from services.admission.receipts import Authorizer
from services.admission.store import OUTBOX_CHANNEL, AdmissionStore, OutboxRow

__all__ = ["OutboxRelay"]

log = logging.getLogger("writ.admission.relay")


class OutboxRelay:
    """Moves outbox rows onto the bus until stopped."""

    def __init__(
        self,
        *,
        store: AdmissionStore,
        js: JetStreamContext,
        listen_dsn: str,
        listen_password: str | None,
        batch: int = 256,
        poll_s: float = 1.0,
        faults: Faults | None = None,
        tracer: Tracer | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self._store, self._js = store, js
        self._authorizer = authorizer
        self._tracer = tracer or trace.get_tracer("writ.relay")
        self._faults = faults or Faults()
        self._listen_dsn, self._listen_password = listen_dsn, listen_password
        self._batch, self._poll_s = batch, poll_s
        self._wake = anyio.Event()
        self.published = 0

    async def run(
        self,
        stopping: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Relay until `stopping` is set."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._listen)
            task_status.started()
            while not stopping.is_set():
                try:
                    moved = await self.relay_once()
                except Exception as exc:  # Postgres or NATS away: the rows wait in the outbox
                    log.warning("relay pass failed, trying again: %r", exc)
                    moved = 0
                if moved >= self._batch:
                    continue
                with anyio.move_on_after(self._poll_s):
                    await self._wake.wait()
                self._wake = anyio.Event()
            tg.cancel_scope.cancel()

    async def relay_once(self) -> int:
        """Publish one batch of due rows; returns how many were published.

        Each publish waits out an election on its own (`libs.bus.publish`); a row that still
        failed stays in the outbox for the next pass while the rows published are deleted, so
        one row meeting a lost leader does not send the whole batch again. A pass that fails
        altogether (PostgreSQL away) raises, and `run` tries again.
        """
        async with self._store.acquire() as conn, conn.transaction():
            rows = await self._store.claim_outbox(conn, self._batch)
            if not rows:
                return 0
            unsigned = [(row.tenant, row.operation_id) for row in rows if not row.signed]
            if self._authorizer is not None and unsigned:
                # Each command's receipt, committed before it is published (on a connection of
                # its own), so the dispatcher that claims it finds the receipt to forward. One
                # admitted on a decision's allow got its receipt with its admission.
                async with self._store.acquire() as signing:
                    await self._authorizer.authorize(signing, unsigned)
            self._faults.crash_if("relay.before_publish")
            published: list[int] = []
            failed: list[BaseException] = []

            async def publish_one(row: OutboxRow) -> None:
                try:
                    await self._publish(row)
                except Exception as exc:
                    failed.append(exc)
                else:
                    published.append(row.id)

            async with anyio.create_task_group() as tg:
                for row in rows:
                    tg.start_soon(publish_one, row)
            self._faults.crash_if("relay.after_publish")
            await self._store.delete_outbox(conn, published)
        if failed:
            log.warning(
                "relay pass: %d of %d rows not published, kept for the next pass: %r",
                len(failed),
                len(rows),
                failed[0],
            )
        self.published += len(published)
        return len(published)

    async def _publish(self, row: OutboxRow) -> None:
        # A span of the run's trace (the admission's context was stored with the row), so the
        # dispatch that follows hangs off the relay's publish.
        parent = extract_context({"traceparent": row.traceparent} if row.traceparent else {})
        with self._tracer.start_as_current_span(
            "relay publish", context=parent, kind=SpanKind.PRODUCER
        ) as span:
            span.set_attribute("writ.operation_id", row.operation_id)
            await publish(
                self._js,
                subjects.command(row.tenant),
                DispatchCommand(tenant=row.tenant, operation_id=row.operation_id),
                msg_id=f"{row.tenant}:{row.operation_id}",
            )

    async def _listen(self) -> None:
        while True:
            try:
                conn = await asyncpg.connect(self._listen_dsn, password=self._listen_password)
            except Exception as exc:
                log.warning("relay listener cannot connect: %r", exc)
                await anyio.sleep(1.0)
                continue
            lost = anyio.Event()
            try:
                await conn.add_listener(OUTBOX_CHANNEL, lambda *_: self._wake.set())
                conn.add_termination_listener(lambda *_, lost=lost: lost.set())
                self._wake.set()  # catch up on whatever was missed while not listening
                await lost.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    await conn.close(timeout=2)
