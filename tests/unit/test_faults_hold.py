"""`hold:<point>`: a process holds each operation that reaches the point, names it in
`<faults file>.reached`, and is killed from outside (libs/faults.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

from libs.faults import Faults

_PROGRAM = """
import sys, anyio
from libs.faults import Faults

async def main() -> None:
    faults = Faults(sys.argv[1])
    async with anyio.create_task_group() as tg:
        for op in ("op-1", "op-2"):
            tg.start_soon(faults.reach, "dispatcher.after_remote_write", op)
        tg.start_soon(faults.reach, "dispatcher.before_ack", "op-3")  # not held: runs on
    print("past every point", flush=True)

anyio.run(main)
"""


def _run(faults: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _PROGRAM, str(faults)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_a_held_process_names_what_it_holds_and_dies_only_when_killed(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.write_text("hold:dispatcher.after_remote_write")
    reached = tmp_path / "faults.reached"
    with _run(faults) as proc:
        deadline = time.monotonic() + 30
        while len(reached.read_text().splitlines() if reached.exists() else []) < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None  # held, not exited
        lines = sorted(reached.read_text().splitlines())
        assert lines == [
            f"{proc.pid} dispatcher.after_remote_write op-1",
            f"{proc.pid} dispatcher.after_remote_write op-2",
        ]
        assert faults.read_text() == "hold:dispatcher.after_remote_write"  # still armed
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        assert proc.stdout is not None and proc.stdout.read() == ""


def test_without_a_hold_every_operation_goes_past(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    faults.write_text("")
    with _run(faults) as proc:
        out, _ = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (0, "past every point\n")
    assert not (tmp_path / "faults.reached").exists()


def test_reach_without_a_faults_file_is_inert() -> None:
    anyio.run(Faults().reach, "dispatcher.before_send", "op-1")
