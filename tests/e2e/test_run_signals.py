"""`writ run` ends with everything it started: Ctrl-C during the demo stops every process, and a
`writ run` killed outright leaves no orphan (each child asks the kernel to be signalled when its
parent dies)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _parents() -> dict[int, int]:
    """Every live process's parent (Linux /proc); zombies left out."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            after = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if after[0] != "Z":
            found[int(entry.name)] = int(after[1])
    return found


def _descendants(root: int) -> set[int]:
    parents, found, todo = _parents(), set(), [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    return pids & set(_parents())


def _start(home: Path) -> tuple[subprocess.Popen[str], list[str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WRIT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "writ.cli", "run", "--home", str(home)],
        env=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    ).start()
    return proc, lines


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def _wait_for(proc: subprocess.Popen[str], lines: list[str], text: str) -> None:
    deadline = time.monotonic() + 300
    while not any(text in line for line in list(lines)):
        assert proc.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, f"no {text!r} in:\n" + "".join(lines)
        time.sleep(0.05)


def _gone_within(pids: set[int], seconds: float) -> dict[int, str]:
    """Those of `pids` still alive after `seconds`, with their command lines; killed then, so
    a failure leaves none."""
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {}
    for pid in _alive(pids):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        left[pid] = cmdline.strip()[:200]
    return left


def test_ctrl_c_during_the_demo_stops_every_process(tmp_path: Path) -> None:
    proc, lines = _start(tmp_path)
    try:
        # The first request has succeeded: the demo is under way, nothing serves yet.
        _wait_for(proc, lines, "succeeded")
        children = _descendants(proc.pid)
        assert len(children) >= 11, children  # NATS, PostgreSQL, three fakes, six services
        proc.send_signal(signal.SIGINT)
        left = _gone_within(children | {proc.pid}, 10)
        output = "".join(lines)
        assert not left, f"still running 10 s after Ctrl-C: {left}\n{output}"
        assert proc.wait(timeout=5) == 130
        assert "Serving." not in output, output
    finally:
        _end(proc)


def test_a_killed_writ_run_leaves_no_orphan(tmp_path: Path) -> None:
    proc, lines = _start(tmp_path)
    try:
        _wait_for(proc, lines, "Serving.")
        children = _descendants(proc.pid)
        assert len(children) >= 11, children
        proc.kill()
        proc.wait()
        # Each child drains on SIGTERM (PostgreSQL: an immediate shutdown on SIGQUIT), its NATS
        # gone too; a service ends itself two drain periods and a margin after the signal
        # however its drain goes (libs/runtime.py). The rest is the suite's own load.
        left = _gone_within(children, 60)
        assert not left, f"orphans of a killed `writ run`: {left}"
    finally:
        _end(proc)
