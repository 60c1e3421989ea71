"""Model text deltas, batched for a session's stream (docs/design.md §10).

A provider streams an answer a few characters at a time; a session's subject should carry tens
of events a second, not one per token. `DeltaBatcher` is the `TextSink` the planner hands the
provider: it coalesces deltas and publishes a batch when `interval_s` has passed since the last
one, when `max_chars` are waiting, and when the decision completes (`flush`). A `reset` drops
what is still waiting (it belongs to the abandoned attempt) and publishes the reset, so a client
discards that attempt's batches; the next attempt's batches carry the next `attempt` number.

Publishing goes through an injected async callable, so the batcher knows nothing of NATS or of
the session's event schema: the planner maps a `TextBatch` to its `TextDelta` event and an
`AttemptReset` to its `TextReset`. The clock is injected too, so tests drive time themselves.
A stalled stream still shows what arrived: `run` (in the planner's task group, for the length
of the model call) publishes a due batch every `interval_s` without waiting for the next delta.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import msgspec
from anyio.abc import TaskStatus

__all__ = ["DEFAULT_INTERVAL_S", "DEFAULT_MAX_CHARS", "AttemptReset", "DeltaBatcher", "TextBatch"]

DEFAULT_INTERVAL_S: Final = 0.075
DEFAULT_MAX_CHARS: Final = 256


class TextBatch(msgspec.Struct, frozen=True, kw_only=True):
    """Coalesced text of one model attempt; `index` orders the batches within it (0, 1, ...)."""

    attempt: int
    index: int
    text: str


class AttemptReset(msgspec.Struct, frozen=True, kw_only=True):
    """Attempt `attempt` was abandoned: discard its batches."""

    attempt: int
    reason: str


Publish = Callable[[TextBatch | AttemptReset], Awaitable[None]]


class DeltaBatcher:
    """A `TextSink` that coalesces deltas into batches and publishes them in order.

    Each published batch holds at most `max_chars` characters; attempts are numbered from 1.
    """

    def __init__(
        self,
        publish: Publish,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_chars: int = DEFAULT_MAX_CHARS,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        if interval_s <= 0 or max_chars < 1:
            raise ValueError("interval_s and max_chars must be positive")
        self._publish, self._interval_s, self._max_chars = publish, interval_s, max_chars
        self._clock = clock
        self._pending: list[str] = []
        self._size = 0
        # The first delta goes out at once: the time to the first visible text is what a
        # person waits for; coalescing starts after it.
        self._last = -math.inf
        self._attempt, self._index = 1, 0
        self._lock = anyio.Lock()  # batches leave in order even with `run` flushing alongside

    @property
    def attempt(self) -> int:
        """The current attempt's number (1 + the resets so far)."""
        return self._attempt

    async def delta(self, text: str) -> None:
        """Take the next piece of text; publish a batch if one is due."""
        if not text:
            return
        async with self._lock:
            self._pending.append(text)
            self._size += len(text)
            if self._size >= self._max_chars or self._due():
                await self._flush()

    async def reset(self, reason: str) -> None:
        """Drop what is waiting and publish the reset of the current attempt."""
        async with self._lock:
            self._pending, self._size = [], 0
            await self._publish(AttemptReset(attempt=self._attempt, reason=reason))
            self._attempt, self._index = self._attempt + 1, 0
            self._last = -math.inf

    async def flush(self) -> None:
        """Publish whatever is waiting (the decision is complete)."""
        async with self._lock:
            await self._flush()

    async def flush_due(self) -> None:
        """Publish what is waiting if `interval_s` has passed since the last batch."""
        async with self._lock:
            if self._due():
                await self._flush()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Publish due batches every `interval_s` until cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(self._interval_s)
            await self.flush_due()

    def _due(self) -> bool:
        return bool(self._pending) and self._clock() - self._last >= self._interval_s

    async def _flush(self) -> None:
        if not self._pending:
            return
        text, self._pending, self._size = "".join(self._pending), [], 0
        for start in range(0, len(text), self._max_chars):
            await self._publish(
                TextBatch(
                    attempt=self._attempt,
                    index=self._index,
                    text=text[start : start + self._max_chars],
                )
            )
            self._index += 1
        self._last = self._clock()
