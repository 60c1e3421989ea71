"""Child processes that do not outlive the process that started them, however it ends.

`writ run` starts a dozen processes (NATS, PostgreSQL, the fakes, the six services), each in a
session of its own so that a terminal's Ctrl-C reaches `writ run` alone and it can stop them in
order. Without more, a `writ run` that is killed (SIGKILL, an OOM kill, a crash) would leave
them all running. Once `tie_children()` has been called, every child started with
`preexec(signal)` asks the kernel (Linux `prctl(PR_SET_PDEATHSIG)`) to be sent `signal` when
its parent dies: the Popen call's thread, so a child must be started from a thread that lives as
long as the process means to keep it (the main thread, or a supervisor's). Elsewhere it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

__all__ = ["preexec", "tie_children", "tied"]

_PR_SET_PDEATHSIG: Final = 1
_tied = False
_prctl: Callable[..., int] | None = None


def tie_children() -> bool:
    """From now on, `preexec` ties children to this process; whether the platform can."""
    global _tied, _prctl
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _prctl = libc.prctl
    _tied = True
    return True


def tied() -> bool:
    """Whether children started from now on die with this process."""
    return _tied


def preexec(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when its parent dies (and at
    once if the parent is already gone); None when children are not tied."""
    prctl = _prctl
    if not _tied or prctl is None:
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), sig)

    return in_child
