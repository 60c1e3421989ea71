"""Load generators (closed and open loop), the statistics they report, and reply matching."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import anyio
import msgspec

__all__ = ["Awaiting", "Op", "Measurement", "Watcher", "closed_loop", "open_loop", "percentile"]

T = TypeVar("T")

# One unit of work: performs it and says whether it succeeded.
Op = Callable[[], Awaitable[bool]]


class Watcher(Protocol):
    """Something that observes the measured window (CPU, service metrics)."""

    async def begin(self) -> None: ...

    async def end(self) -> None: ...


class Measurement(msgspec.Struct, kw_only=True):
    """What one measurement counted inside its window (monotonic seconds)."""

    completed: int
    failed: int
    window_start: float
    window_end: float
    latencies_s: list[float]
    late_s: float = 0.0  # open loop: how far the pacer fell behind its schedule, at worst

    @property
    def seconds(self) -> float:
        """The measured window's length."""
        return self.window_end - self.window_start

    @property
    def rate(self) -> float:
        """Completed operations per second of window."""
        return self.completed / self.seconds

    def latency_ms(self, q: float) -> float:
        """The q-th percentile (0-100) of the recorded latencies, in milliseconds."""
        return percentile(self.latencies_s, q) * 1000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[min(rank, len(ordered)) - 1]


async def _watch(watcher: Watcher | None, start: float, end: float) -> None:
    if watcher is None:
        return
    await anyio.sleep(max(start - time.monotonic(), 0))
    await watcher.begin()
    await anyio.sleep(max(end - time.monotonic(), 0))
    await watcher.end()


async def closed_loop(
    op: Op, *, concurrency: int, warmup_s: float, duration_s: float, watcher: Watcher | None = None
) -> Measurement:
    """Keep `concurrency` operations in flight; count those that complete inside the window.

    Operations that complete during the warm-up or after the window are not counted. Workers
    finish the operation they hold when the window closes, so the pipeline is empty again when
    this returns and the next measurement starts from nothing queued.
    """
    start = time.monotonic() + warmup_s
    end = start + duration_s
    latencies: list[float] = []
    failed = 0

    async def worker() -> None:
        nonlocal failed
        while time.monotonic() < end:
            began = time.monotonic()
            ok = await op()
            done = time.monotonic()
            if start <= done <= end:
                if ok:
                    latencies.append(done - began)
                else:
                    failed += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch, watcher, start, end)
        for _ in range(concurrency):
            tg.start_soon(worker)
    return Measurement(
        completed=len(latencies),
        failed=failed,
        window_start=start,
        window_end=end,
        latencies_s=latencies,
    )


async def open_loop(
    op: Op, *, rate: float, warmup_s: float, duration_s: float, watcher: Watcher | None = None
) -> Measurement:
    """Start operations at a fixed rate whatever the completions, and time each one.

    Latency runs from the operation's scheduled start, not from when the pacer got round to it,
    so a stalled pacer shows up as latency instead of hiding it (no coordinated omission).
    Operations scheduled in the window are counted, however late they complete.
    """
    interval = 1.0 / rate
    begin = time.monotonic()
    start = begin + warmup_s
    end = start + duration_s
    latencies: list[float] = []
    failed = 0
    late = 0.0

    async def one(scheduled: float, measured: bool) -> None:
        nonlocal failed
        ok = await op()
        done = time.monotonic()
        if measured:
            if ok:
                latencies.append(done - scheduled)
            else:
                failed += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch, watcher, start, end)
        index = 0
        while (scheduled := begin + index * interval) < end:
            delay = scheduled - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            else:
                late = max(late, -delay)
            tg.start_soon(one, scheduled, scheduled >= start)
            index += 1
    return Measurement(
        completed=len(latencies),
        failed=failed,
        window_start=start,
        window_end=end,
        latencies_s=latencies,
        late_s=late,
    )


class _Slot(Generic[T]):
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.value: T | None = None


class Awaiting(Generic[T]):
    """Replies arriving on a subscription, handed to whoever registered their key."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot[T]] = {}

    def expect(self, key: str) -> None:
        """Register before publishing: the reply may arrive before anyone waits for it."""
        self._slots[key] = _Slot()

    def resolve(self, key: str, value: T) -> None:
        """Hand a reply to its waiter; replies nobody expects (or duplicates) are dropped."""
        slot = self._slots.get(key)
        if slot is not None and slot.value is None:
            slot.value = value
            slot.event.set()

    def discard(self, key: str) -> None:
        """Stop expecting a reply (its request was never published)."""
        self._slots.pop(key, None)

    async def wait(self, key: str, timeout: float) -> T | None:
        """The reply for `key`, or None if it did not arrive within `timeout`."""
        slot = self._slots[key]
        try:
            with anyio.move_on_after(timeout):
                await slot.event.wait()
            return slot.value
        finally:
            del self._slots[key]
