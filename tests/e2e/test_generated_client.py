"""A client generated from the committed OpenAPI document by `openapi-python-client`, with no
hand edits, drives a run, resumes its Server-Sent Events after the last id it saw, and cancels
a run, as a host would: with the base URL, issuer and signing key in its credentials folder
(`.writ/hosts/<tenant>/`) alone. The document is what the door does."""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.e2e.hostcreds import read_credentials
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ROOT = Path(__file__).parents[2]
GENERATOR = "openapi-python-client==0.29.1"


@pytest.fixture(scope="module")
def writ_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The package the generator writes from `schemas/openapi.json`, imported as is."""
    where = tmp_path_factory.mktemp("generated")
    uv = ROOT / ".tools" / "bin" / "uv"
    venv = where / "venv"
    subprocess.run(
        [str(uv), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120
    )
    subprocess.run(
        [str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), GENERATOR],
        check=True,
        timeout=600,
    )
    subprocess.run(
        [
            str(venv / "bin" / "openapi-python-client"),
            "generate",
            "--path",
            str(ROOT / "schemas" / "openapi.json"),
            "--meta",
            "none",
            "--output-path",
            str(where / "writ_api"),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module("writ_api")
    finally:
        sys.path.remove(str(where))
        for name in [m for m in sys.modules if m == "writ_api" or m.startswith("writ_api.")]:
            del sys.modules[name]


def _module(name: str) -> Any:
    return importlib.import_module(f"writ_api.{name}")


def _events(text: str) -> list[tuple[str, str]]:
    """(event, id) of each Server-Sent Event in a stream's text."""
    found = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if "event" in fields:
            found.append((fields["event"], fields.get("id", "")))
    return found


def test_a_generated_client_runs_resumes_the_stream_and_cancels(
    stack: Stack, writ_api: ModuleType
) -> None:
    given = read_credentials(stack.host_credentials("acme"), "acme")
    client = _module("client").AuthenticatedClient(
        base_url=given.api_url,  # what the host is given, `/api/v1` included
        token=given.token("alice@acme.example"),
        timeout=_module("client").httpx.Timeout(70.0),
    )
    with client:  # its connections closed with it, not left to the collector
        runs = {name: _module(f"api.runs.{name}") for name in ("create_run", "wait_run")}
        models = _module("models")

        accepted = runs["create_run"].sync(
            client=client,
            body=models.StartRun(agent="crm-assistant", input_="Note the delayed shipment call"),
            idempotency_key=f"generated-{uuid.uuid4().hex[:12]}",
        )
        assert isinstance(accepted, models.RunAccepted), accepted
        done = runs["wait_run"].sync(accepted.run_id, client=client, timeout_s=60)
        assert isinstance(done, models.RunResult) and done.status == "succeeded", done

        stream = _module("api.runs.stream_run_events")
        whole = _events(stream.sync_detailed(accepted.run_id, client=client).content.decode())
        steps = [i for event, i in whole if event == "step"]
        assert len(steps) >= 2 and whole[-1][0] == "result", whole
        # Resumed after the first step it saw (a string header, as the document types it).
        resumed = _events(
            stream.sync_detailed(
                accepted.run_id, client=client, last_event_id=steps[0]
            ).content.decode()
        )
        assert [i for event, i in resumed if event == "step"] == steps[1:]
        assert resumed[-1][0] == "result"

        stopped = runs["create_run"].sync(
            client=client,
            body=models.StartRun(agent="billing-assistant", input_="Refund order 7781"),
            idempotency_key=f"generated-{uuid.uuid4().hex[:12]}",
        )
        waiting = runs["wait_run"].sync(stopped.run_id, client=client, timeout_s=60)
        assert isinstance(waiting, models.RunResult) and waiting.status == "awaiting_human"
        cancelled = _module("api.runs.cancel_run").sync(
            stopped.run_id, client=client, idempotency_key=f"generated-{uuid.uuid4().hex[:12]}"
        )
        assert isinstance(cancelled, models.RunAccepted), cancelled
        ended = runs["wait_run"].sync(
            stopped.run_id, client=client, after=waiting.version, timeout_s=60
        )
        assert isinstance(ended, models.RunResult) and ended.status == "cancelled", ended
        assert ended.version > waiting.version
