"""A run's timeline over Server-Sent Events (`GET /runs/{id}/events`): every committed step
with its sequence as `id:`, then the result; `Last-Event-ID` resumes right after a step, with
no gap and no duplicate. And the operators' reconciliation routes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_http_api import BODY, auth, key
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=40) as client:
        yield client


def _events(api: httpx.Client, path: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The stream's events until it ends, each as {event, id, data}."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with api.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                if "data" in current:
                    events.append(current)
                current = {}
                continue
            field, _, value = line.partition(":")
            if field:
                current[field] = value.strip()
    return events


def test_the_timeline_streams_each_step_then_the_result_and_resumes_exactly(
    stack: Stack, api: httpx.Client
) -> None:
    run_id = api.post("/runs", json=BODY, headers={**auth(stack), **key()}).json()["run_id"]
    everything = _events(api, f"/runs/{run_id}/events", auth(stack))
    steps, result = everything[:-1], everything[-1]
    assert result["event"] == "result" and "id" not in result
    assert json.loads(result["data"])["status"] == "succeeded"
    ids = [int(e["id"]) for e in steps]
    assert ids == sorted(set(ids)) and len(ids) >= 3
    kinds = [json.loads(e["data"])["kind"] for e in steps]
    assert kinds[0] == "decision" and "observation" in kinds
    # A client that saw up to the second step reconnects: the rest, exactly once each.
    resumed = _events(api, f"/runs/{run_id}/events", {**auth(stack), "Last-Event-ID": str(ids[1])})
    assert [int(e["id"]) for e in resumed[:-1]] == ids[2:]
    assert [e["data"] for e in resumed[:-1]] == [e["data"] for e in steps[2:]]
    assert resumed[-1]["event"] == "result"
    other = api.get(f"/runs/{run_id}/events", headers=auth(stack, "globex", "bob@globex.example"))
    assert (other.status_code, other.json()["code"]) == (404, "NOT_FOUND")


def test_reconciliation_needs_an_operator_and_names_the_command(
    stack: Stack, api: httpx.Client
) -> None:
    assert api.get("/reconciliation", headers=auth(stack)).json()["code"] == "FORBIDDEN"
    operator = auth(stack, principal="ops@acme.example", roles=["approver"])
    listed = api.get("/reconciliation", headers=operator)
    assert listed.status_code == 200 and isinstance(listed.json()["commands"], list)
    body = {"state": "failed", "evidence": "the provider says it never arrived"}
    headers = {**operator, **key()}
    path = f"/reconciliation/{uuid.uuid4()}/resolve"
    first = api.post(path, json=body, headers=headers)
    assert first.status_code == 200, first.text
    assert first.json()["ok"] is False  # no such unknown command of the tenant
    assert api.post(path, json=body, headers=headers).json() == first.json()
    assert (
        api.post(path, json={**body, "state": "succeeded"}, headers=headers).json()["code"]
        == "CONFLICT"
    )


def test_audit_verify_reports_every_journal_for_an_auditor(stack: Stack, api: httpx.Client) -> None:
    run_id = api.post("/runs", json=BODY, headers={**auth(stack), **key()}).json()["run_id"]
    assert api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()["status"] == "succeeded"
    assert api.get("/audit/verify", headers=auth(stack)).json()["code"] == "FORBIDDEN"
    auditor = auth(stack, principal="audit@acme.example", roles=["auditor"])
    states = api.get("/audit/verify", headers=auditor)
    assert states.status_code == 200, states.text
    document = states.json()
    assert document["ok"] is True, document
    assert [j["service"] for j in document["journals"]] == [
        "admission",
        "dispatcher",
        "governance",
        "planner",
    ]
    assert all(j["entries"] + j["unsealed"] > 0 for j in document["journals"]), document
    replay = api.post(f"/audit/replay/{run_id}", headers=auditor)
    assert replay.status_code == 200, replay.text
    assert replay.json()["run_id"] == run_id
