"""`RunHandle`: one run, followed by its results (`wait`, `result`) and cancelled by it."""

from __future__ import annotations

import time
from typing import Final, Protocol

from writ_client._wire.host import RunResult
from writ_client.errors import Timeout

__all__ = ["ENDED", "RunHandle", "RunWaiter"]

# A run in one of these has its last result; `awaiting_human` is a result that is not the last.
ENDED: Final = frozenset({"succeeded", "failed", "rejected", "cancelled"})


class RunWaiter(Protocol):
    """What a `RunHandle` needs of its client (`Client` or `NatsClient`)."""

    async def wait(self, run_id: str, *, after: int = -1, timeout_s: float = 60.0) -> RunResult:
        """The run's `RunResult` whose `version` is above `after`."""
        ...

    async def cancel(self, run_id: str, *, request_id: str | None = None) -> object:
        """Ask for the run to be cancelled."""
        ...


class RunHandle:
    """A run: `wait()` for its next result, `result()` for its last, `cancel()` it.

    The handle remembers the `version` of the last result it saw, so `wait()` returns only a
    newer one: after a decision or a cancel it waits for what followed, never the result that
    was already there.
    """

    def __init__(
        self,
        client: RunWaiter,
        run_id: str,
        *,
        request_id: str | None = None,
        last: RunResult | None = None,
    ) -> None:
        self._client, self.run_id, self.request_id = client, run_id, request_id
        self.last = last
        """The last result this handle saw (None: none yet)."""

    def __repr__(self) -> str:
        status = None if self.last is None else self.last.status
        return f"RunHandle({self.run_id!r}, last={status!r})"

    @property
    def version(self) -> int:
        """The `version` of the last result seen (-1: none)."""
        return -1 if self.last is None else self.last.version

    async def wait(self, *, timeout_s: float = 60.0) -> RunResult:
        """The run's next result, newer than the last this handle saw (`awaiting_human`
        included: answer the decision, then wait again).

        Raises:
            Timeout: no newer result within `timeout_s`.
        """
        result = await self._client.wait(self.run_id, after=self.version, timeout_s=timeout_s)
        self.last = result
        return result

    async def result(self, *, timeout_s: float = 60.0) -> RunResult:
        """The run's last result (it has ended: succeeded, failed, rejected or cancelled),
        waiting past any decision it asks a person for meanwhile.

        Raises:
            Timeout: it has not ended within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while self.last is None or self.last.status not in ENDED:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout("TIMEOUT", f"run {self.run_id} has not ended after {timeout_s}s")
            await self.wait(timeout_s=remaining)
        return self.last

    async def cancel(self, *, request_id: str | None = None) -> None:
        """Ask for the run to be cancelled (idempotent); `wait()` then gets its result."""
        await self._client.cancel(self.run_id, request_id=request_id)
