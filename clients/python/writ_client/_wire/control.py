# A copy of schemas/control.py made by clients/python/copy_wire.py: do not edit.
"""Run control: a host cancels a run (version 1 of the host contract).

A host publishes `CancelRun` on `writ.in.cancels.<tenant>` (`Nats-Msg-Id` = `request_id`), or
calls `POST /api/v1/runs/{run_id}/cancel`. Cancelling is idempotent and accepted even while the
run is still being started: the planner schedules nothing more for the run; a command already
admitted runs to its recorded outcome (never undone, never dropped); the run ends `cancelled`
with what was done so far, and the host gets its `RunResult` on `writ.out.results.<tenant>`.
"""

from __future__ import annotations

from .base import Command, Event, Id, Principal, Tenant, Token
from .subjects import cancel as cancel
from .subjects import run_cancel as run_cancel

__all__ = ["CANCEL_CODE", "CancelRun", "RunCancelRequested", "cancel", "run_cancel"]

# The `RunResult.error.code` of a cancelled run.
CANCEL_CODE = "CANCELLED"


class CancelRun(Command, frozen=True):
    """Cancel one of the tenant's runs, by its id."""

    request_id: Id
    token: Token
    run_id: Id


class RunCancelRequested(Event, frozen=True):
    """A verified `CancelRun`: the tenant and principal come from the token."""

    tenant: Tenant
    run_id: Id
    principal: Principal
    request_id: Id
