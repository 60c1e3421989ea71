"""One run is one trace across the six processes (issue 7): W3C trace context travels in NATS
headers, through request/reply and through the outbox."""

from __future__ import annotations

import json
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from schemas import subjects
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-traces-") as home:
        deployment = Stack(Path(home), database="traces", durable_pg=False, extra_env={
            "*": {"WRIT_OTEL_SPANS_FILE": str(Path(home) / "spans")}})
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


def _spans(stack: Stack, trace_id: str) -> list[dict[str, Any]]:
    found = []
    for path in stack.home.glob("spans.*"):
        for line in path.read_text().splitlines():
            span = json.loads(line)
            if span["trace_id"] == trace_id:
                found.append(span)
    return found


async def test_a_run_is_one_trace_through_every_service(stack: Stack, host: Host) -> None:
    trace_id, host_span = secrets.token_hex(16), secrets.token_hex(8)
    request = host.request()
    # The host starts the trace; every hop after it must continue it.
    await host.js.publish(subjects.request("acme"), msgspec.json.encode(request),
                          headers={"Nats-Msg-Id": request.request_id,
                                   "traceparent": f"00-{trace_id}-{host_span}-01"})
    result = await host.wait_result(request.request_id)
    assert result.status == "succeeded"

    expected = {"ingress handle", "ingress verify", "governance register_run",
                "retrieval handle", "retrieval search", "planner handle", "planner step",
                "planner model", "admission handle", "admission admit", "governance decide",
                "dispatcher handle", "dispatch"}
    # A parent span ends (and is exported) after its children: wait for the whole tree.
    with anyio.fail_after(15):
        while True:
            spans = _spans(stack, trace_id)
            ids = {s["span_id"] for s in spans} | {host_span}
            if expected <= {s["name"] for s in spans} and all(
                    s["parent_span_id"] in ids for s in spans):
                break
            await anyio.sleep(0.1)

    by_id = {s["span_id"]: s for s in spans}
    services = {s["service"] for s in spans}
    assert services == {f"writ-{name}" for name in ("ingress", "retrieval", "planner",
                                                    "governance", "admission", "dispatcher")}
    # A tree: every span's parent is in the trace, up to the host's span.
    for span in spans:
        assert span["parent_span_id"] in by_id or span["parent_span_id"] == host_span, span
    roots = [s for s in spans if s["parent_span_id"] == host_span]
    assert [r["name"] for r in roots] == ["ingress handle"]
    # The dispatch hangs off the admission that created the command (through the outbox),
    # and the governance decisions off their callers.
    dispatch = next(s for s in spans if s["name"] == "dispatcher handle")
    chain = []
    node = dispatch
    while node["parent_span_id"] in by_id:
        node = by_id[node["parent_span_id"]]
        chain.append(node["name"])
    assert "admission admit" in chain and chain[-1] == "ingress handle"
    decides = [s for s in spans if s["name"] == "governance decide"
               and by_id.get(s["parent_span_id"], {}).get("name") == "governance decide"]
    assert len(decides) == 2  # admission's decision and the dispatcher's re-check
    # Spans carry ids and digests, never payloads.
    text = json.dumps(spans)
    assert request.input not in text and request.token not in text
