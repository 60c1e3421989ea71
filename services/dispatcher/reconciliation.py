"""Reconciliation of `unknown` commands, for operators (`writ reconcile`): list them
(`writ.int.dispatcher.unknown`), and record what a person established with its evidence
(`writ.int.dispatcher.reconcile`), whose outcome then reaches the run or the host. Nothing here
generates a new key to escape uncertainty: a reconciliation records, it never re-executes."""

from __future__ import annotations

import msgspec
from nats.micro.request import Request

from schemas.dispatcher import ListUnknown, Reconcile, Reconciled, UnknownCommand, UnknownCommands
from services.dispatcher.outcomes import Outcomes
from services.dispatcher.store import DispatcherStore

__all__ = ["Reconciliation"]


class Reconciliation:
    """The operators' endpoints for commands that ended `unknown`."""

    def __init__(self, *, store: DispatcherStore, outcomes: Outcomes) -> None:
        self._store, self._outcomes = store, outcomes
        self._encoder = msgspec.json.Encoder()

    async def list_unknown(self, request: Request) -> None:
        """The tenant's `unknown` commands, oldest first (400: undecodable)."""
        try:
            ask = msgspec.json.decode(request.data, type=ListUnknown)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ListUnknown: {exc}")
            return
        rows = await self._store.unknown(ask.tenant)
        answer = UnknownCommands(
            commands=[
                UnknownCommand(
                    operation_id=r.operation_id,
                    action=r.action,
                    principal=r.principal,
                    arguments=r.arguments,
                    reason=(r.reason or "")[:500] or None,
                    since=r.updated_at.isoformat(),
                )
                for r in rows
            ]
        )
        await request.respond(self._encoder.encode(answer))

    async def reconcile(self, request: Request) -> None:
        """Record a reconciliation of one `unknown` command and publish its outcome."""
        try:
            ask = msgspec.json.decode(request.data, type=Reconcile)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid Reconcile: {exc}")
            return
        moved = await self._store.reconcile(
            ask.tenant,
            ask.operation_id,
            state=ask.state,
            receipt=ask.receipt,
            evidence=ask.evidence,
            resolved_by=ask.resolved_by,
        )
        if moved is None:
            answer = Reconciled(
                operation_id=ask.operation_id, ok=False, message="no such command in state unknown"
            )
        else:
            await self._outcomes.publish(
                ask.tenant,
                ask.operation_id,
                moved.run_id,
                moved.step,
                moved.action,
                moved.state,
                moved.receipt,
                moved.reason,
                origin=moved.origin,
                suffix=":reconciled",
            )
            answer = Reconciled(
                operation_id=ask.operation_id,
                ok=True,
                message=f"recorded {ask.state} with evidence",
            )
        await request.respond(self._encoder.encode(answer))
