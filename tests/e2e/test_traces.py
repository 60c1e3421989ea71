"""One run is one trace across the six processes: W3C trace context travels in NATS
headers, through request/reply and through the outbox."""

from __future__ import annotations

import json
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from schemas import subjects
from schemas.host import ApproveProposal, RunRequest
from tests.e2e.conftest import Host, recorded_spans
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-traces-") as home:
        deployment = Stack(
            Path(home),
            database="traces",
            durable_pg=False,
            extra_env={"*": {"WRIT_OTEL_SPANS_FILE": str(Path(home) / "spans")}},
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


SERVICES = frozenset(
    f"writ-{name}"
    for name in ("ingress", "retrieval", "planner", "governance", "admission", "dispatcher")
)
# The spans one successful run produces, whichever exporter carries them.
RUN_SPANS = frozenset(
    {
        "ingress-runs handle",
        "ingress verify",
        "governance register_run",
        "retrieval search",
        "planner handle",
        "planner step",
        "planner model",
        "admission handle",
        "admission admit",
        "governance decide",
        "relay publish",
        "dispatcher handle",
        "dispatch",
    }
)


class TracedRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run the host started inside its own span: its request, and the trace it should be."""

    request: RunRequest
    trace_id: str
    host_span: str


async def start_traced_run(host: Host) -> TracedRun:
    """Publish a run request with a `traceparent` and wait until the run succeeds."""
    run = TracedRun(
        request=host.request(), trace_id=secrets.token_hex(16), host_span=secrets.token_hex(8)
    )
    # The host starts the trace; every hop after it must continue it.
    await host.js.publish(
        subjects.request("acme"),
        msgspec.json.encode(run.request),
        headers={
            "Nats-Msg-Id": run.request.request_id,
            "traceparent": f"00-{run.trace_id}-{run.host_span}-01",
        },
    )
    result = await host.wait_result(run.request.request_id)
    assert result.status == "succeeded"
    return run


def tree_complete(spans: list[dict[str, Any]], run: TracedRun) -> bool:
    """Whether every span of the run has arrived, each with its parent."""
    ids = {s["span_id"] for s in spans} | {run.host_span}
    return RUN_SPANS <= {s["name"] for s in spans} and all(
        s["parent_span_id"] in ids for s in spans
    )


async def wait_for_tree(
    read: Callable[[], list[dict[str, Any]]], run: TracedRun, *, timeout: float = 15
) -> list[dict[str, Any]]:
    """`read()`'s spans of the run, once the whole tree is there."""
    # A parent span ends (and is exported) after its children: wait for the whole tree.
    with anyio.fail_after(timeout):
        while not tree_complete(spans := [s for s in read() if s["trace_id"] == run.trace_id], run):
            await anyio.sleep(0.1)
    return spans


def assert_run_tree(spans: list[dict[str, Any]], run: TracedRun) -> None:
    """One trace through the six services, shaped as a run is: a tree under the host's span."""
    assert {s["trace_id"] for s in spans} == {run.trace_id}
    by_id = {s["span_id"]: s for s in spans}
    assert len(by_id) == len(spans), "a span was exported twice"
    assert {s["service"] for s in spans} == SERVICES
    # A tree: every span's parent is in the trace, up to the host's span.
    for span in spans:
        assert span["parent_span_id"] in by_id or span["parent_span_id"] == run.host_span, span
    roots = [s for s in spans if s["parent_span_id"] == run.host_span]
    assert [r["name"] for r in roots] == ["ingress-runs handle"]
    # The dispatch hangs off the admission that created the command (through the outbox),
    # and the governance decisions off their callers.
    dispatch = next(s for s in spans if s["name"] == "dispatcher handle")
    assert by_id[dispatch["parent_span_id"]]["name"] == "relay publish"
    chain = []
    node = dispatch
    while node["parent_span_id"] in by_id:
        node = by_id[node["parent_span_id"]]
        chain.append(node["name"])
    assert "admission admit" in chain and chain[-1] == "ingress-runs handle"
    decides = [
        s
        for s in spans
        if s["name"] == "governance decide"
        and by_id.get(s["parent_span_id"], {}).get("name") == "governance decide"
    ]
    # Admission's decision only: nothing governance reads changed before the dispatch, so the
    # dispatcher's re-check is that decision (and its span says so).
    assert len(decides) == 1
    rechecks = [s["attributes"].get("writ.recheck", "") for s in spans if s["name"] == "dispatch"]
    assert len(rechecks) == 1 and rechecks[0].startswith("admission decision "), rechecks
    # Spans carry ids and digests, never payloads.
    text = json.dumps(spans)
    assert run.request.input not in text and run.request.token not in text


async def test_a_run_is_one_trace_through_every_service(stack: Stack, host: Host) -> None:
    run = await start_traced_run(host)
    assert_run_tree(await wait_for_tree(lambda: recorded_spans(stack), run), run)


async def test_an_approval_is_its_own_trace_linked_to_the_runs(stack: Stack, host: Host) -> None:
    run_trace, approval_trace = secrets.token_hex(16), secrets.token_hex(16)
    request = host.request(agent="refund-assistant", text="Refund the missing discount.")
    await host.js.publish(
        subjects.request("acme"),
        msgspec.json.encode(request),
        headers={
            "Nats-Msg-Id": request.request_id,
            "traceparent": f"00-{run_trace}-{secrets.token_hex(8)}-01",
        },
    )
    waiting = await host.wait_result(request.request_id)
    assert waiting.status == "awaiting_human" and waiting.proposal is not None

    approve = ApproveProposal(
        request_id=f"apr-{secrets.token_hex(6)}",
        token=stack.token("acme", "ops@acme.example", roles=["approver"]),
        proposal_id=waiting.proposal.proposal_id,
        answer="approve",
    )
    await host.js.publish(
        subjects.approval("acme"),
        msgspec.json.encode(approve),
        headers={
            "Nats-Msg-Id": approve.request_id,
            "traceparent": f"00-{approval_trace}-{secrets.token_hex(8)}-01",
        },
    )
    assert (await host.wait_approval(approve.request_id)).status == "claimed"

    with anyio.fail_after(15):
        while not {"admission approve", "dispatch"} <= {
            s["name"] for s in recorded_spans(stack) if s["trace_id"] == approval_trace
        }:
            await anyio.sleep(0.1)
    approving = [s for s in recorded_spans(stack) if s["trace_id"] == approval_trace]
    [approve_span] = [s for s in approving if s["name"] == "admission approve"]
    # The work the approval resumes runs in the approver's trace, linked back to the run's.
    assert [(link["trace_id"], link["attributes"]) for link in approve_span["links"]] == [
        (run_trace, {"writ.link": "resumed"})
    ]
    proposing = [
        s
        for s in recorded_spans(stack)
        if s["trace_id"] == run_trace and s["name"] == "admission admit"
    ]
    assert any(link["span_id"] == s["span_id"] for s in proposing for link in approve_span["links"])


async def test_a_run_over_http_is_one_trace_from_the_hosts_span(stack: Stack) -> None:
    trace_id, host_span = secrets.token_hex(16), secrets.token_hex(8)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=40) as api:
        started = await api.post(
            "/runs",
            json={"agent": "crm-assistant", "input": "Note the delayed shipment call"},
            headers={
                "Authorization": f"Bearer {stack.token('acme', 'alice@acme.example')}",
                "Idempotency-Key": f"traced-{secrets.token_hex(6)}",
                "traceparent": f"00-{trace_id}-{host_span}-01",
            },
        )
        assert started.status_code == 202, started.text
        waited = await api.get(
            f"/runs/{started.json()['run_id']}/wait",
            headers={"Authorization": f"Bearer {stack.token('acme', 'alice@acme.example')}"},
        )
        assert waited.json()["status"] == "succeeded", waited.text
    # The HTTP request's span stands where a NATS run request's `ingress-runs handle` does.
    wanted = (RUN_SPANS - {"ingress-runs handle"}) | {"ingress http POST /api/v1/runs"}
    with anyio.fail_after(20):
        while True:
            spans = [s for s in recorded_spans(stack) if s["trace_id"] == trace_id]
            ids = {s["span_id"] for s in spans} | {host_span}
            if wanted <= {s["name"] for s in spans} and all(
                s["parent_span_id"] in ids for s in spans
            ):
                break
            await anyio.sleep(0.1)
    assert {s["service"] for s in spans} == SERVICES
    roots = [s for s in spans if s["parent_span_id"] == host_span]
    assert [r["name"] for r in roots] == ["ingress http POST /api/v1/runs"]
    assert roots[0]["attributes"]["http.response.status_code"] == 202
    # Nothing of the run is in a trace of its own: every span naming it is in the host's.
    run_id = started.json()["run_id"]
    naming = [s for s in recorded_spans(stack) if s["attributes"].get("writ.run_id") == run_id]
    assert naming and {s["trace_id"] for s in naming} == {trace_id}
