"""With the standard OTLP variables set, the six processes send a run's trace to a collector:
here a fake one on loopback that decodes what the real exporter sends."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.otlp import FakeOtlpCollector
from tests.e2e.conftest import Host
from tests.e2e.test_traces import assert_run_tree, start_traced_run, tree_complete, wait_for_tree
from writ.stack import SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

TOKEN = "otlp-collector-token"
SOON_MS, NEVER_MS = 200, 600_000  # OTEL_BSP_SCHEDULE_DELAY: export while running, or only at exit


@pytest.fixture
def collector() -> Iterator[FakeOtlpCollector]:
    with FakeOtlpCollector(token=TOKEN) as server:
        yield server


@pytest.fixture
def stack(request: pytest.FixtureRequest, collector: FakeOtlpCollector) -> Iterator[Stack]:
    """A deployment of its own whose services export to `collector`, batching for
    `request.param` milliseconds."""
    with tempfile.TemporaryDirectory(prefix="writ-otlp-") as home:
        deployment = Stack(
            Path(home),
            database="otlp",
            durable_pg=False,
            extra_env={
                "*": {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                    "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}",
                    "OTEL_BSP_SCHEDULE_DELAY": str(request.param),
                }
            },
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


def received(collector: FakeOtlpCollector) -> list[dict[str, Any]]:
    return httpx.get(f"{collector.url}/_control/spans", timeout=5).json()


@pytest.mark.parametrize("stack", [SOON_MS], indirect=True)
async def test_a_run_is_one_trace_in_the_collector(
    stack: Stack, host: Host, collector: FakeOtlpCollector
) -> None:
    run = await start_traced_run(host)
    assert_run_tree(await wait_for_tree(lambda: received(collector), run), run)


@pytest.mark.parametrize("stack", [NEVER_MS], indirect=True)
async def test_a_service_stopping_sends_the_spans_it_holds(
    stack: Stack, host: Host, collector: FakeOtlpCollector
) -> None:
    run = await start_traced_run(host)
    assert [s for s in received(collector) if s["trace_id"] == run.trace_id] == []
    for name in SERVICES:
        assert stack.stop_process(name) == 0, stack.log_tail(name)
    # Each process flushed its batch before it exited: the tree is already whole.
    spans = [s for s in received(collector) if s["trace_id"] == run.trace_id]
    assert tree_complete(spans, run), sorted(s["name"] for s in spans)
    assert_run_tree(spans, run)
