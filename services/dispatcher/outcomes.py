"""A command's outcome, published once it is recorded: to the run that proposed it or to the
host that submitted it (`subjects.outcome(tenant, origin)`), under a message id derived from the
command, so publishing it again (a redelivery, the sweeper, a reconciliation) is a duplicate."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from nats.js import JetStreamContext

from libs.bus import publish
from schemas import subjects
from schemas.dispatcher import CommandOutcome, CommandState

if TYPE_CHECKING:
    from services.dispatcher.store import Claim

__all__ = ["Outcomes"]


class Outcomes:
    """Publishes recorded outcomes on the bus."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    async def publish(
        self,
        tenant: str,
        operation_id: str,
        run_id: str,
        step: int,
        action: str,
        state: str,
        receipt: str | None,
        reason: str | None,
        *,
        origin: str,
        suffix: str = "",
    ) -> None:
        """Publish the outcome recorded for `operation_id` (`suffix` names a later record of
        the same command, such as a reconciliation, so it is not taken for a duplicate)."""
        await publish(
            self._js,
            subjects.outcome(tenant, origin),
            CommandOutcome(
                tenant=tenant,
                operation_id=operation_id,
                run_id=run_id,
                step=step,
                action=action,
                state=cast(CommandState, state),  # a terminal state, as the store records it
                receipt=receipt,
                reason=(reason or "")[:500] or None,
            ),
            msg_id=f"outcome:{tenant}:{operation_id}{suffix}",
        )

    async def of_claim(
        self, claim: Claim, state: str, receipt: str | None, reason: str | None
    ) -> None:
        """Publish the outcome this worker recorded for the command it claimed."""
        await self.publish(
            claim.tenant,
            claim.operation_id,
            claim.run_id,
            claim.step,
            claim.action,
            state,
            receipt,
            reason,
            origin=claim.origin,
        )
