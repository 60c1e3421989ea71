"""`writ run` passes the user's settings on: `OTEL_*` and `WRIT_*` variables reach the services
(the deployment's own wiring excepted), so a local deployment can export its traces to a
collector and point the planner at a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fakes.llm import FakeLlm
from fakes.otlp import FakeOtlpCollector
from writ.demo import DEMO_INPUT
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


def test_writ_run_plays_the_demo_against_an_openai_compatible_model(tmp_path: Path) -> None:
    """The demo agents' manifests say `provider: default`: `WRIT_PROVIDER=openai make run` has
    their decisions made by the model it names (here the project's loopback model)."""
    token = "model-key-" + os.urandom(8).hex()
    key = tmp_path / "model.key"
    key.write_text(token)
    answer = "ACME-42's shipment is delayed; the note is left for a person to write."
    decision = {"next": {"decision": "answer_directly", "answer": answer}}
    accept = json.dumps({"critic": {"verdict": "accept"}})  # research-assistant has a critic
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WRIT_", "OTEL_"))}
    with FakeLlm(token=token) as model:
        httpx.post(
            f"{model.url}/_control/rules",
            json={
                "rules": [
                    {"when": ["Answer under the `critic` key"], "reply": {"content": accept}},
                    {"when": [], "reply": {"content": json.dumps(decision)}},
                ]
            },
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ).raise_for_status()
        done = subprocess.run(
            [sys.executable, "-m", "writ.cli", "run", "--once", "--home", str(tmp_path / "home")],
            env={
                **base,
                "WRIT_PROVIDER": "openai",
                "WRIT_MODEL_URL": f"{model.url}/v1",
                "WRIT_MODEL_NAME": "fake-model",
                "WRIT_MODEL_KEY_FILE": str(key),
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        asked = httpx.get(
            f"{model.url}/_control/requests",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        ).json()
    output = done.stdout + done.stderr
    assert "The planner asks the model fake-model at" in done.stdout, output
    # The demo's research run ended with the model's own answer, decided by the model.
    assert f"succeeded {answer}" in done.stdout, output
    assert asked, output
    assert {r["headers"]["authorization"] for r in asked} == {f"Bearer {token}"}
    assert any(DEMO_INPUT in json.dumps(r["body"]) for r in asked)
