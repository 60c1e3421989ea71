"""A process with nowhere to send spans builds none, and carries the trace on unchanged."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libs.telemetry import (
    PassThroughTracer,
    extract_context,
    inject_context,
    make_tracer_provider,
)

HOST = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_span_started_in_a_remote_parent_passes_that_parent_on_as_it_came() -> None:
    tracer = PassThroughTracer()
    with tracer.start_as_current_span("handle", context=extract_context({"traceparent": HOST})):
        assert inject_context({}) == {"traceparent": HOST}  # ids and sampled flag alike
        with tracer.start_as_current_span("inner") as inner:  # no context: the current span
            inner.set_attribute("writ.run_id", "r1")  # accepted, recorded nowhere
            assert not inner.is_recording()
            assert inject_context({}) == {"traceparent": HOST}
        span = tracer.start_span("detached", context=extract_context({"traceparent": HOST}))
        span.end()
        assert f"{span.get_span_context().span_id:016x}" == HOST.split("-")[2]
    assert inject_context({}) == {}  # detached on leaving: nothing current again


def test_without_a_parent_nothing_is_invented() -> None:
    tracer = PassThroughTracer()
    with tracer.start_as_current_span("handle", context=extract_context({})) as span:
        assert not span.get_span_context().is_valid
        assert inject_context({}) == {}


def test_a_recording_tracer_still_builds_child_spans_of_the_same_trace() -> None:
    """The other side of the switch: with an exporter, spans are recorded and exported."""
    exporter = InMemorySpanExporter()
    tracer = make_tracer_provider("t", exporter=exporter, environ={}).get_tracer("t")
    with tracer.start_as_current_span("handle", context=extract_context({"traceparent": HOST})):
        carried = inject_context({})["traceparent"]
    (span,) = exporter.get_finished_spans()
    assert carried.split("-")[1] == HOST.split("-")[1]  # the same trace
    assert carried.split("-")[2] != HOST.split("-")[2]  # a span of its own
    assert span.parent is not None and f"{span.parent.span_id:016x}" == HOST.split("-")[2]
    assert isinstance(trace.get_current_span(), trace.NonRecordingSpan)
