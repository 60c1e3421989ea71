"""`writ.supervisor`: a dead instance is reported at once and restarted with backoff; one
stopped on purpose is left stopped. Real (tiny) processes stand in for the services."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from writ.supervisor import Supervisor, describe_exit


class _Stack:
    """What the supervisor uses of `writ.stack.Stack`."""

    def __init__(self, logs: Path) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.instances: dict[str, str] = {}
        self.lock = threading.RLock()
        self.logs = logs
        self.started: list[str] = []

    def start_instance(self, service: str, key: str) -> None:
        self.procs[key] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.instances[key] = service
        self.started.append(key)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[_Stack]:
    s = _Stack(tmp_path)
    yield s
    for proc in s.procs.values():
        proc.kill()
        proc.wait()


def _kill(stack: _Stack, key: str) -> None:
    proc = stack.procs[key]
    proc.kill()
    proc.wait()


def test_a_dead_instance_is_reported_at_once_and_restarted_with_growing_backoff(
    stack: _Stack,
) -> None:
    reports: list[tuple[str, str]] = []
    stack.start_instance("governance", "governance")
    supervisor = Supervisor(stack, report=lambda what, detail: reports.append((what, detail)))  # type: ignore[arg-type]
    supervisor.check(0.0)
    assert reports == []

    _kill(stack, "governance")
    supervisor.check(10.0)
    assert reports[0][0] == "died" and "governance killed by SIGKILL" in reports[0][1]
    assert "restarting in 1s" in reports[0][1]
    assert "governance" not in stack.procs
    supervisor.check(10.5)  # not yet
    assert stack.started == ["governance"]
    supervisor.check(11.0)
    assert stack.started == ["governance", "governance"] and reports[-1][0] == "restarted"

    # It dies again soon: the next delay doubles.
    _kill(stack, "governance")
    supervisor.check(12.0)
    assert "restarting in 2s" in reports[-1][1]
    supervisor.check(14.0)
    assert len(stack.started) == 3

    # Up for longer than a minute, then dead: back to the first delay.
    _kill(stack, "governance")
    supervisor.check(100.0)
    assert "restarting in 1s" in reports[-1][1]
    assert supervisor.restarts == 2


def test_an_instance_stopped_on_purpose_is_not_restarted(stack: _Stack) -> None:
    reports: list[tuple[str, str]] = []
    stack.start_instance("planner", "planner")
    supervisor = Supervisor(stack, report=lambda what, detail: reports.append((what, detail)))  # type: ignore[arg-type]
    with stack.lock:  # what Stack.stop_process does
        proc = stack.procs.pop("planner")
        stack.instances.pop("planner")
        proc.terminate()
        proc.wait()
    supervisor.check(5.0)
    supervisor.check(60.0)
    assert reports == [] and stack.started == ["planner"]


def test_exit_statuses_read_as_people_read_them() -> None:
    assert describe_exit(137) == "exited with status 137"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(None) == "running"
