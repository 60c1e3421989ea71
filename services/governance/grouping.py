"""Group commit: concurrent callers' items handled together, one statement for all of them.

Each single `decide` request reads its facts and records its decision; 64 of them in flight
were 128 statements, and 64 commits, each a round trip and a WAL flush of its own. `Grouped`
lets a caller that arrives while its batch function is busy wait for the next batch instead,
so under load the statements per decision fall with the load, and with no load nothing waits:
a caller alone goes at once, in a batch of one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

__all__ = ["Grouped", "GroupFailed"]

T = TypeVar("T")
R = TypeVar("R")


class GroupFailed(Exception):
    """The batch this item was in failed as a whole (`__cause__`): the item may be fine."""


class _Waiting(Generic[T, R]):
    __slots__ = ("done", "error", "item", "result", "taken", "turn")

    def __init__(self, item: T) -> None:
        self.item = item
        self.taken = False  # in a batch under way
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None
        self.turn = anyio.Event()  # done, or it may lead the next batch


class Grouped(Generic[T, R]):
    """Calls `batch` with the items of concurrent callers, at most `in_flight` batches at a
    time and `max_batch` items in one; `batch` returns one result per item, in order.

    No task of its own: the caller whose turn it is runs the batch for everyone in it, so it
    needs no task group and ends with its callers. If `batch` raises, every caller in it gets
    `GroupFailed` from that error (and decides for itself what to do on its own).
    """

    def __init__(self, batch: Callable[[list[T]], Awaitable[list[R]]], *, in_flight: int = 2,
                 max_batch: int = 256) -> None:
        self._batch, self._in_flight, self._max_batch = batch, in_flight, max_batch
        self._queue: list[_Waiting[T, R]] = []
        self._running = 0
        self.batches = 0  # how many batches ran, and how many items they held (tests, metrics)
        self.items = 0

    @property
    def waiting(self) -> int:
        """Items queued for a batch not started yet."""
        return len(self._queue)

    async def __call__(self, item: T) -> R:
        """`item`'s result, from the batch it went in (GroupFailed if that batch failed)."""
        me: _Waiting[T, R] = _Waiting(item)
        self._queue.append(me)
        try:
            while not me.done:
                if not me.taken and self._running < self._in_flight:
                    await self._run()
                else:
                    await me.turn.wait()
                    me.turn = anyio.Event()
        finally:
            if not me.taken:  # cancelled while it waited: nobody runs it now
                self._queue.remove(me)
        if me.error is not None:
            raise GroupFailed(str(me.error)) from me.error
        return me.result  # type: ignore[return-value]

    async def _run(self) -> None:
        group, self._queue = self._queue[:self._max_batch], self._queue[self._max_batch:]
        for w in group:
            w.taken = True
        self._running += 1
        self.batches, self.items = self.batches + 1, self.items + len(group)
        try:
            # The others in the batch wait on this caller: if it is cancelled they must not
            # be left waiting, nor the batch cut half way (the store's statement timeout
            # bounds how long this can take).
            with anyio.CancelScope(shield=True):
                results = await self._batch([w.item for w in group])
            if len(results) != len(group):
                raise RuntimeError(f"{len(results)} results for {len(group)} items")
            for w, result in zip(group, results, strict=True):
                w.result = result
        except Exception as exc:
            for w in group:
                w.error = exc
        finally:
            self._running -= 1
            for w in group:
                w.done = True
                w.turn.set()
            if self._queue:  # the next caller waiting leads the next batch
                self._queue[0].turn.set()
