"""The fake OTLP collector, fed by the real OpenTelemetry exporter over loopback HTTP."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link

from fakes.otlp import TRACES_PATH, FakeOtlpCollector
from libs.telemetry import make_tracer_provider, otlp_configured

TOKEN = "collector-token"
ROOT = Path(__file__).resolve().parents[2]
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(autouse=True)
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets configures the exporter, whatever this shell has."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def collector() -> Iterator[FakeOtlpCollector]:
    with FakeOtlpCollector() as server:
        yield server


@pytest.fixture
def otlp_env(monkeypatch: pytest.MonkeyPatch, collector: FakeOtlpCollector) -> None:
    """The standard variables pointing this process's exporters at the fake collector."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    # Nothing leaves before shutdown() on its own: what arrives came from the flush.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")


def spans(collector: FakeOtlpCollector, trace_id: str | None = None) -> list[dict[str, Any]]:
    params = {"trace_id": trace_id} if trace_id else None
    return httpx.get(f"{collector.url}/_control/spans", params=params).json()


def control(collector: FakeOtlpCollector, path: str) -> Any:
    return httpx.get(f"{collector.url}/_control/{path}").json()


def emit_parent_and_child(provider: TracerProvider) -> tuple[str, str]:
    """A parent span with a child carrying one attribute of each kind and a link."""
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("parent") as parent:
        linked = parent.get_span_context()
        with tracer.start_as_current_span(
            "child",
            links=[Link(linked, {"writ.link": "x"})],
            attributes={"s": "v", "i": 3, "f": 0.5, "b": True, "list": ["a", "b"]},
        ):
            pass
    return f"{linked.trace_id:032x}", f"{linked.span_id:016x}"


def export_request(trace_id: str = "ab" * 16, span_id: str = "cd" * 8) -> bytes:
    span = Span(trace_id=bytes.fromhex(trace_id), span_id=bytes.fromhex(span_id), name="hand")
    resource_spans = ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])
    resource_spans.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value="hand-made"))
    )
    return ExportTraceServiceRequest(resource_spans=[resource_spans]).SerializeToString()


def test_otlp_is_configured_by_either_standard_variable() -> None:
    assert otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert otlp_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})
    assert not otlp_configured({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318"})


@pytest.mark.usefixtures("otlp_env")
def test_the_exporter_sends_spans_in_batches_and_shutdown_flushes_them(
    collector: FakeOtlpCollector,
) -> None:
    provider = make_tracer_provider("unit")
    trace_id, parent_id = emit_parent_and_child(provider)
    assert spans(collector) == []  # batched, not sent as each span ends
    provider.shutdown()

    got = {s["name"]: s for s in spans(collector)}
    assert set(got) == {"parent", "child"}
    parent, child = got["parent"], got["child"]
    assert (parent["trace_id"], parent["span_id"], parent["parent_span_id"]) == (
        trace_id,
        parent_id,
        None,
    )
    assert (child["trace_id"], child["parent_span_id"]) == (trace_id, parent_id)
    assert {parent["service"], child["service"]} == {"writ-unit"}
    assert child["attributes"] == {"s": "v", "i": 3, "f": 0.5, "b": True, "list": ["a", "b"]}
    assert child["links"] == [
        {"trace_id": trace_id, "span_id": parent_id, "attributes": {"writ.link": "x"}}
    ]
    assert child["scope"] == "test"
    assert parent["start"] <= child["start"] <= child["end"] <= parent["end"]
    assert control(collector, "exports") == {"exports": 1, "spans": 2}


def test_no_endpoint_no_otlp(collector: FakeOtlpCollector, monkeypatch: pytest.MonkeyPatch) -> None:
    # Set in the process, but the mapping the caller passed says no.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    provider = make_tracer_provider("unit", environ={})
    emit_parent_and_child(provider)
    provider.shutdown()
    assert spans(collector) == [] and control(collector, "calls") == {"calls": 0}


@pytest.mark.usefixtures("otlp_env")
def test_the_traces_endpoint_and_compression_variables_are_honoured(
    collector: FakeOtlpCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{collector.url}{TRACES_PATH}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    provider = make_tracer_provider("unit")
    trace_id, _ = emit_parent_and_child(provider)
    provider.shutdown()
    assert {s["name"] for s in spans(collector, trace_id)} == {"parent", "child"}


def test_a_token_is_required_when_set_and_carried_by_the_headers_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with FakeOtlpCollector(token=TOKEN) as collector:
        r = httpx.post(f"{collector.url}{TRACES_PATH}", content=export_request(), headers=PROTOBUF)
        assert r.status_code == 401
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{TOKEN}")
        provider = make_tracer_provider("unit")
        emit_parent_and_child(provider)
        provider.shutdown()
        assert len(spans(collector)) == 2
        assert control(collector, "calls") == {"calls": 2}


def test_answers_a_protobuf_response(collector: FakeOtlpCollector) -> None:
    r = httpx.post(f"{collector.url}{TRACES_PATH}", content=export_request(), headers=PROTOBUF)
    assert (r.status_code, r.headers["content-type"], r.content) == (
        200,
        "application/x-protobuf",
        b"",
    )  # an empty ExportTraceServiceResponse
    [span] = spans(collector)
    assert span == {
        "trace_id": "ab" * 16,
        "span_id": "cd" * 8,
        "parent_span_id": None,
        "name": "hand",
        "service": "hand-made",
        "start": 0,
        "end": 0,
        "attributes": {},
        "links": [],
        "scope": "",
    }


def test_gzip_bodies_are_decoded(collector: FakeOtlpCollector) -> None:
    r = httpx.post(
        f"{collector.url}{TRACES_PATH}",
        content=gzip.compress(export_request()),
        headers={**PROTOBUF, "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and len(spans(collector)) == 1


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"Content-Type": "application/json"}, b"{}", 415),
        (PROTOBUF, b"\xff\xff\xff", 400),
        ({**PROTOBUF, "Content-Encoding": "gzip"}, b"not gzip", 400),
        ({**PROTOBUF, "Content-Encoding": "br"}, b"", 415),
    ],
)
def test_refuses_what_is_not_an_export(
    collector: FakeOtlpCollector, headers: dict[str, str], body: bytes, status: int
) -> None:
    r = httpx.post(f"{collector.url}{TRACES_PATH}", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert spans(collector) == []


def test_other_paths_and_methods(collector: FakeOtlpCollector) -> None:
    assert httpx.get(f"{collector.url}{TRACES_PATH}").status_code == 405
    assert (
        httpx.post(f"{collector.url}/v1/metrics", content=b"", headers=PROTOBUF).status_code == 404
    )
    assert httpx.get(f"{collector.url}/healthz").json() == {"status": "ok"}


def test_large_batches_fit(collector: FakeOtlpCollector) -> None:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for n in range(2000):
        scope.spans.add(trace_id=bytes(16), span_id=n.to_bytes(8, "big"), name="x" * 64)
    body = request.SerializeToString()
    assert len(body) > 64 * 1024
    r = httpx.post(f"{collector.url}{TRACES_PATH}", content=body, headers=PROTOBUF)
    assert r.status_code == 200 and control(collector, "exports")["spans"] == 2000


@pytest.mark.usefixtures("otlp_env")
def test_the_exporter_retries_a_failed_export(collector: FakeOtlpCollector) -> None:
    assert (
        httpx.post(f"{collector.url}/_control/mode", json={"mode": "fail", "count": 1}).status_code
        == 200
    )
    provider = make_tracer_provider("unit")
    trace_id, _ = emit_parent_and_child(provider)
    provider.shutdown()  # the 503 is retried after a backoff of about a second
    assert len(spans(collector, trace_id)) == 2
    assert control(collector, "calls") == {"calls": 2}


def test_filters_by_trace_and_resets(collector: FakeOtlpCollector) -> None:
    for trace_id in ("01" * 16, "02" * 16):
        httpx.post(
            f"{collector.url}{TRACES_PATH}", content=export_request(trace_id), headers=PROTOBUF
        ).raise_for_status()
    assert [s["trace_id"] for s in spans(collector, "02" * 16)] == ["02" * 16]
    assert len(spans(collector)) == 2
    httpx.post(f"{collector.url}/_control/reset").raise_for_status()
    assert spans(collector) == [] and control(collector, "exports") == {"exports": 0, "spans": 0}


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    token_file, ready = tmp_path / "token", tmp_path / "ready"
    token_file.write_text(TOKEN + "\n")
    cmd = [
        sys.executable,
        "-m",
        "fakes.otlp",
        "--port",
        "0",
        "--token-file",
        str(token_file),
        "--ready-file",
        str(ready),
    ]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            deadline = time.monotonic() + 20
            while not ready.exists():
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.01)
            url = ready.read_text()
            r = httpx.post(
                f"{url}{TRACES_PATH}",
                content=export_request(),
                headers={**PROTOBUF, "Authorization": f"Bearer {TOKEN}"},
            )
            assert r.status_code == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
