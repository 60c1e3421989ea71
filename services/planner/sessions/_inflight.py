"""A closed session's model call in flight is abandoned, not answered ("closing
cancels the exchange in flight").

A turn's model call runs inside its run's transaction, under the run's row lock, in whichever
planner replica took the run's delivery; the close is answered by whichever replica took the
session operation. So the close is told to every replica on core NATS (`TurnCancelling` on
`writ.int.sessions.cancelling.<tenant>`, fan-out, after the close committed its cancellation),
and the replica that holds a model call for that run cancels it (`InFlightCalls.watch`). The
call's text sink then publishes a `reset` (a client drops the deltas it showed of the abandoned
attempt) and raises `ModelCallAbandoned`; the loop ends the run `cancelled` in the same
transaction, with nothing recorded of the call.

A notice lost (core NATS is at most once) or sent before the call registered is covered by
the cancellation row itself: the call checks it once it is registered (`cancelled_before`), and
otherwise the run ends cancelled at its next step, as before. Nothing but a model call is ever
cancelled here: a command already admitted runs to its recorded outcome.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Final

import anyio
import msgspec
from nats.aio.client import Client

from libs.errors import WritError
from schemas.sessions import TURN_CANCELLING, TurnCancelling, turn_cancelling
from services.planner.sessions._listen import listen

__all__ = ["InFlightCalls", "ModelCallAbandoned"]

log = logging.getLogger("writ.planner.sessions")
_DECODER: Final = msgspec.json.Decoder(TurnCancelling)
_ENCODER: Final = msgspec.json.Encoder()


class ModelCallAbandoned(WritError):
    """A turn's model call was cancelled mid-way because its session closed: nothing of it is
    recorded, and the run ends `cancelled`."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"turn {run_id}: the model call was abandoned (the session closed)")
        self.run_id = run_id


class InFlightCalls:
    """The model calls of session turns in flight in this process, cancellable by run id."""

    def __init__(self, *, nc: Client) -> None:
        self._nc = nc
        self._calls: dict[str, set[anyio.CancelScope]] = {}

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[anyio.CancelScope]:
        """A cancel scope for one model call of `run_id`, cancelled when the turn is (enter
        it around the call; `cancelled_caught` then says the call was abandoned)."""
        scope = anyio.CancelScope()
        self._calls.setdefault(run_id, set()).add(scope)
        try:
            yield scope
        finally:
            held = self._calls.get(run_id)
            if held is not None:
                held.discard(scope)
                if not held:
                    del self._calls[run_id]

    def cancel(self, run_id: str) -> int:
        """Cancel the calls of `run_id` in flight here; how many there were."""
        held = self._calls.get(run_id, set())
        for scope in held:
            scope.cancel()
        return len(held)

    async def tell(self, tenant: str, run_id: str) -> None:
        """Tell every planner replica that the turn `run_id` was cancelled (after the commit
        that recorded it); a failure to tell is logged, the run still ends cancelled."""
        try:
            await self._nc.publish(
                turn_cancelling(tenant),
                _ENCODER.encode(TurnCancelling(tenant=tenant, run_id=run_id)),
            )
        except Exception as exc:
            log.warning("turn %s: cancellation not told to the planners: %r", run_id, exc)

    async def follow(self) -> None:
        """Hear the turns cancelled (by any replica) and cancel their model calls here."""

        async def heard(notice: TurnCancelling) -> None:
            if self.cancel(notice.run_id):
                log.info("turn %s: model call abandoned (the session closed)", notice.run_id)

        await listen(self._nc, TURN_CANCELLING, _DECODER, turn_cancelling, heard)


async def cancelled_before(conn: Any, run_id: str) -> bool:
    """Whether the run's cancellation was recorded already (a close that came before the call
    registered its scope, whose notice this process could not have heard)."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM planner.cancellations WHERE run_id = $1)", run_id
        )
    )
