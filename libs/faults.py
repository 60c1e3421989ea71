"""Crash points for the fault suite: a process exits, for real, at a named boundary.

A test writes point names, one per line, into the file named by `WRIT_FAULTS_FILE`; the first
process to reach an armed point removes it from the file (so its restarted successor runs on)
and exits at once with status 137, as if killed: no cleanup, no ack, no commit.

`hold:<point>` instead stops every task that reaches the point there, for good, and appends
`<pid> <point> <operation id>` to `<file>.reached` for each operation it holds: a test that
wants the kill to come from outside reads that file and sends the process SIGKILL itself, once
the operations it is waiting for are all held at the boundary. A hold stays armed until the
test disarms it.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Final

import anyio

__all__ = ["CRASH_STATUS", "FaultInjected", "Faults"]

CRASH_STATUS: Final = 137
log = logging.getLogger("writ.faults")


class FaultInjected(Exception):  # noqa: N818  (deliberately none of Writ's own errors)
    """An error nobody anticipated, raised at an armed `raise:<point>`."""


class Faults:
    """The armed crash points of one process; inert when no file is configured."""

    def __init__(self, path: str | None = None) -> None:
        self._path = Path(path) if path else None

    def raise_if(self, point: str) -> None:
        """Raise `FaultInjected` if `raise:<point>` is armed (once, like a crash point)."""
        if self._take(f"raise:{point}"):
            log.warning("fault injected: raising at %s", point)
            raise FaultInjected(f"injected at {point}")

    def crash_if(self, point: str) -> None:
        """Exit the process now if `point` is armed."""
        if not self._take(point):
            return
        log.warning("fault injected: crashing at %s", point)
        logging.shutdown()
        os._exit(CRASH_STATUS)

    async def reach(self, point: str, *operation_ids: str) -> None:
        """At `point` with these operations: hold them there if `hold:<point>` is armed (the
        process is to be killed from outside), else crash if `point` is armed."""
        if self._held(point):
            assert self._path is not None
            reached = self._path.with_name(self._path.name + ".reached")
            lines = "".join(f"{os.getpid()} {point} {op}\n" for op in operation_ids)
            with reached.open("a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.write(lines)
                handle.flush()
                os.fsync(handle.fileno())
            log.warning("fault injected: holding %d operation(s) at %s", len(operation_ids), point)
            await anyio.sleep_forever()
        self.crash_if(point)

    def _held(self, point: str) -> bool:
        if self._path is None or not self._path.exists():
            return False
        with self._path.open() as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            return f"hold:{point}" in handle.read().split()

    def _take(self, point: str) -> bool:
        if self._path is None or not self._path.exists():
            return False
        with self._path.open("r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # two replicas must not both take one crash
            armed = handle.read().split()
            if point not in armed:
                return False
            armed.remove(point)
            handle.seek(0)
            handle.truncate()
            handle.write("\n".join(armed))
            handle.flush()
            os.fsync(handle.fileno())
        return True
