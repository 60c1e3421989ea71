# A copy of schemas/host_reads.py made by clients/python/copy_wire.py: do not edit.
"""Host reads over NATS (request/reply), the same reads as the HTTP API's GETs.

A host sends `HostRead` to `writ.api.<tenant>.<read>` (`run`, `wait`, `events`, `command`,
`pending`, `proposals`, `proposal`, `replay`) and gets the same Struct the HTTP route answers, or a
NATS micro error: `Nats-Service-Error-Code` the HTTP status, `Nats-Service-Error`
`"<CODE>: <detail>"` with the stable code. The token's tenant must be the subject's.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from .base import Command, Id, Token
from .reads import ProposalState
from .subjects import host_read as host_read

__all__ = ["DEADLINE_HEADER", "HOST_READS", "HostRead", "host_read"]

HOST_READS: Final = (
    "run",
    "wait",
    "events",
    "command",
    "pending",
    "proposals",
    "proposal",
    "replay",
)
# A request's deadline, seconds since the epoch (`time.time()`, three decimals): Writ's
# endpoints drop a request past it unanswered, before any work (`libs/deadline.py`), so a
# service that fell behind does not spend itself on callers who left. Hosts send it too.
DEADLINE_HEADER: Final = "Writ-Deadline"


class HostRead(Command, frozen=True):
    """One read; only the fields the read names are used.

    `after`: for `events`, the last step seen; for `wait`, the `version` of the last
    `RunResult` seen (-1: none). `wait` answers the run's `RunResult` once it has one whose
    `version` is above `after`, or `TIMEOUT` (504) when none came within `timeout_s`.

    `pending` and `proposals` page as the HTTP door's lists do: a page of `limit` (None: the
    list's own default, 500 pending decisions or 100 proposals) after `cursor`, the
    `next_cursor` of the page before; `requester` and `agent` filter both."""

    token: Token
    run_id: Id | None = None
    operation_key: Id | None = None
    proposal_id: Id | None = None
    state: ProposalState | None = None
    after: Annotated[int, msgspec.Meta(ge=-1)] = -1
    timeout_s: Annotated[float, msgspec.Meta(ge=0, le=60)] = 30.0
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] | None = None
    cursor: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    requester: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    agent: Annotated[str, msgspec.Meta(max_length=128)] | None = None
