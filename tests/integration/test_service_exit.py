"""A service process asked to stop always stops: however its drain goes (here a start-up that
never finishes, as one still binding to a NATS server that went away with `writ run`), it ends
itself two drain periods and a margin after SIGTERM, saying so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from libs.runtime import EXIT_MARGIN_S, stop_bound_s

DRAIN_S = 0.5

SERVICE = """
import sys
from pathlib import Path

import anyio

from libs.runtime import run_service
from libs.settings import BaseSettings


async def main(rt, *, task_status):
    await anyio.sleep(0.3)  # the signal receiver is listening by now
    Path(sys.argv[2]).write_text("starting")
    await anyio.sleep_forever()  # a start-up that never ends, deaf to the drain


run_service(
    "retrieval",
    BaseSettings(nats_url=sys.argv[1], drain_timeout_s=float(sys.argv[3])),
    main,
    description="a service stuck in its start-up",
)
"""


def test_a_service_stuck_in_its_drain_ends_itself(nats_url: str, tmp_path: Path) -> None:
    ready, log_file = tmp_path / "ready", tmp_path / "service.log"
    with log_file.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVICE, nats_url, str(ready), str(DRAIN_S)],
            cwd=Path(__file__).resolve().parents[2],
            env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, log_file.read_text()
            assert time.monotonic() < deadline, "the service never started"
            time.sleep(0.05)
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=2 * DRAIN_S + EXIT_MARGIN_S + 20)
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_file.read_text()
    assert code == 1, log
    assert took >= 2 * DRAIN_S + EXIT_MARGIN_S - 0.5, took  # it waited out its drain first
    assert "did not stop within" in log, log


def test_the_bound_covers_the_span_flush_when_spans_are_exported() -> None:
    assert stop_bound_s(10, {}) == 20 + EXIT_MARGIN_S
    exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert stop_bound_s(10, exporting) == 20 + 30 + EXIT_MARGIN_S
    assert stop_bound_s(10, {**exporting, "OTEL_BSP_EXPORT_TIMEOUT": "10000"}) == 35.0
