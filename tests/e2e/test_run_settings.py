"""`writ run` passes the user's settings on: `OTEL_*` and `WRIT_*` variables reach the services
(the deployment's own wiring excepted), so a local deployment can export its traces to a
collector and point the planner at a model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fakes.otlp import FakeOtlpCollector
from writ.stack import NOT_INHERITED, SERVICES, Stack

pytestmark = pytest.mark.e2e

TOKEN = "collector-token"


def test_the_users_settings_reach_every_service_below_the_deployments_own(
    tmp_path: Path,
) -> None:
    stack = Stack(tmp_path, admin_dsn="postgresql://writ@127.0.0.1:5432/postgres")
    passed = stack.inherit(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "WRIT_PROVIDER": "openai",
            "WRIT_MODEL_URL": "http://model:8000/v1",
            "WRIT_DATABASE_URL": "postgresql://admin@db/writ",
            "WRIT_METRICS_PORT": "9090",
            "WRIT_DECISIONS_FILE": "/elsewhere.json",
            "HOME_GROWN": "x",
        }
    )
    assert passed.keys() == {
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "WRIT_PROVIDER",
        "WRIT_MODEL_URL",
        "WRIT_DECISIONS_FILE",
    }
    assert not passed.keys() & NOT_INHERITED
    for name in SERVICES:
        env = stack.service_env(name)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318", name
        assert env["WRIT_PROVIDER"] == "openai", name
        assert env["WRIT_METRICS_PORT"] == "0", name  # six processes, six ports
        assert env.get("WRIT_DATABASE_URL") != "postgresql://admin@db/writ", name
        assert "HOME_GROWN" not in env
    # What the deployment sets for a service itself wins over the user's.
    assert stack.service_env("planner")["WRIT_DECISIONS_FILE"] != "/elsewhere.json"


def test_writ_run_exports_spans_from_all_six_services_to_the_users_collector(
    tmp_path: Path,
) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WRIT_", "OTEL_"))}
    with FakeOtlpCollector(token=TOKEN) as collector:
        done = subprocess.run(
            [sys.executable, "-m", "writ.cli", "run", "--once", "--home", str(tmp_path)],
            env={
                **base,
                "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}",
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        # Each service sends what it holds as it stops, before `writ run` returns.
        spans = httpx.get(f"{collector.url}/_control/spans", timeout=10).json()
    services = {s["service"] for s in spans}
    assert services >= {f"writ-{name}" for name in SERVICES}, sorted(services)
