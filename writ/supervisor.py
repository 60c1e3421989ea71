"""`writ run` supervises: a service process that dies is reported at once and restarted with
backoff.

The supervisor watches a `Stack`'s service instances from a thread (the demo and the serving
loop keep the main thread). A death is reported the moment it is seen (within `poll_s`), with
the exit status; the instance is started again after 1 s, then 2, 4 ... at most 30 s while it
keeps dying, and back to 1 s once it has stayed up for a minute. A process stopped on purpose
(`Stack.stop_process`) is not restarted.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from writ.stack import Stack

__all__ = ["Supervisor"]


def describe_exit(status: int | None) -> str:
    """How a process ended, as a person reads it."""
    if status is None:
        return "running"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


class Supervisor:
    """Reports and restarts the service instances of `stack` that die."""

    def __init__(
        self,
        stack: Stack,
        *,
        report: Callable[[str, str], None],
        poll_s: float = 0.2,
        first_delay_s: float = 1.0,
        max_delay_s: float = 30.0,
        stable_s: float = 60.0,
    ) -> None:
        self._stack, self._report = stack, report
        self._poll_s, self._first, self._max, self._stable = (
            poll_s,
            first_delay_s,
            max_delay_s,
            stable_s,
        )
        self._started: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._due: dict[str, tuple[float, str]] = {}  # key -> (restart at, service)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0

    def start(self) -> None:
        """Watch from a daemon thread until `stop`."""
        now = time.monotonic()
        for key in self._stack.instances:
            self._started.setdefault(key, now)
        self._thread = threading.Thread(target=self._watch, name="writ-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (what is running keeps running)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check(time.monotonic())
            except Exception as exc:  # the supervisor must outlive what it watches
                self._report("supervisor", f"check failed: {exc!r}")

    def check(self, now: float) -> None:
        """One pass: report the instances that died, restart those whose delay is over."""
        stack = self._stack
        with stack.lock:
            for key, service in list(stack.instances.items()):
                proc = stack.procs.get(key)
                if proc is None or proc.poll() is None:
                    continue
                del stack.procs[key], stack.instances[key]
                up = now - self._started.get(key, now)
                failures = 1 if up >= self._stable else self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(self._first * 2 ** (failures - 1), self._max)
                self._due[key] = (now + delay, service)
                self._report(
                    "died",
                    f"{key} {describe_exit(proc.returncode)} after "
                    f"{up:.1f}s up; restarting in {delay:.0f}s "
                    f"(log {stack.logs / f'{key}.log'})",
                )
            for key, (at, service) in list(self._due.items()):
                if at > now or self._stop.is_set():
                    continue
                del self._due[key]
                stack.start_instance(service, key)
                self._started[key] = now
                self.restarts += 1
                self._report(
                    "restarted",
                    f"{key} (pid {stack.procs[key].pid}, restart {self._failures.get(key, 1)})",
                )
