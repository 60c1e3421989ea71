"""A simulated OpenTelemetry collector: a real loopback OTLP/HTTP server that records spans.

It accepts `POST /v1/traces` with an `application/x-protobuf` `ExportTraceServiceRequest`
(optionally gzip- or deflate-encoded, as `OTEL_EXPORTER_OTLP_COMPRESSION` asks), answers with an
empty `ExportTraceServiceResponse`, and lists what it received on `GET /_control/spans`, each span
in the shape `libs.telemetry.JsonLinesSpanExporter` writes, plus its links. The shared fault
modes apply to exports: `fail` answers 503, which exporters retry.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import SplitResult, parse_qs, urlsplit

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from fakes import _http
from fakes._http import MODES, HttpError, Reply

__all__ = ["MAX_EXPORT_BYTES", "MODES", "TRACES_PATH", "FakeOtlpCollector", "decode_spans", "main"]

TRACES_PATH: Final = "/v1/traces"
PROTOBUF: Final = "application/x-protobuf"
# A batch of 512 spans (the SDK's default batch size) is far past the JSON fakes' 64 KiB.
MAX_EXPORT_BYTES: Final = 8 * 1024 * 1024


def decode_spans(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """Flatten an export request into one dict per span, ids as lowercase hex."""
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "name": span.name,
                        "service": resource.get("service.name"),
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "attributes": _attributes(span.attributes),
                        "links": [
                            {
                                "trace_id": link.trace_id.hex(),
                                "span_id": link.span_id.hex(),
                                "attributes": _attributes(link.attributes),
                            }
                            for link in span.links
                        ],
                        "scope": scope_spans.scope.name,
                    }
                )
    return spans


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


class _State(_http.State):
    """The spans received, in arrival order, and the fault mode."""

    def _clear(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.exports = 0  # export requests accepted

    def record(self, spans: list[dict[str, Any]]) -> Reply:
        with self.lock:
            self.exports += 1
            self.spans.extend(spans)
        return Reply(200, ExportTraceServiceResponse().SerializeToString())


class FakeOtlpCollector(_http.LoopbackFake):
    """An OTLP/HTTP trace collector on loopback; point `OTEL_EXPORTER_OTLP_ENDPOINT` at `url`.

    With a `token`, exports must carry `Authorization: Bearer <token>` (set through
    `OTEL_EXPORTER_OTLP_HEADERS`); without one, any exporter may send.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, token: str = "") -> None:
        # Bind now so `url` is known before start(), e.g. to hand to a subprocess.
        super().__init__(_http.Server((host, port), _Handler, token=token.encode(), state=_State()))


class _Handler(_http.Handler):
    server: _http.Server[_State]

    def do_POST(self) -> None:
        if urlsplit(self.path).path != TRACES_PATH:
            super().do_POST()
            return
        # The base handler answers JSON only; an exporter reads a protobuf answer.
        try:
            self._raw = self._read_body()
            reply = self._export()
        except HttpError as exc:
            reply = exc.reply
        if reply is None:  # lose_response: the spans were recorded, the answer never leaves
            self.close_connection = True
            _http._hang_up(self.connection)
            return
        if isinstance(reply.body, bytes):
            data, content_type = reply.body, PROTOBUF
        else:
            data, content_type = json.dumps(reply.body).encode(), "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if reply.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _export(self) -> Reply | None:
        state = self.server.state
        state.count_call()
        if self.server.token:
            self._authorize()
        content_type = self.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if content_type != PROTOBUF:
            raise HttpError(415, f"content type must be {PROTOBUF}")
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(self._decompress(self._raw))
        except DecodeError:
            raise HttpError(400, "malformed ExportTraceServiceRequest") from None
        spans = decode_spans(request)
        return self._under_mode(lambda: state.record(spans))

    def _decompress(self, body: bytes) -> bytes:
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        try:
            if encoding == "gzip":
                return gzip.decompress(body)
            if encoding == "deflate":
                return zlib.decompress(body)
        except (OSError, zlib.error, EOFError):
            raise HttpError(400, f"malformed {encoding} body") from None
        if encoding != "identity":
            raise HttpError(415, f"unsupported content encoding {encoding}")
        return body

    def _read_body(self) -> bytes:
        # Larger than the JSON fakes' limit: an export batch is legitimately big.
        length = self.headers.get("Content-Length", "0")
        if (
            urlsplit(self.path).path != TRACES_PATH
            or self.headers.get("Transfer-Encoding")
            or not length.isdigit()
            or int(length) > MAX_EXPORT_BYTES
        ):
            return super()._read_body()
        return self.rfile.read(int(length))

    def _route_control(self, method: str, path: str) -> Reply:
        state = self.server.state
        if (method, path) == ("GET", "/_control/spans"):
            trace_ids = parse_qs(urlsplit(self.path).query).get("trace_id")
            with state.lock:
                return Reply(
                    200, [s for s in state.spans if trace_ids is None or s["trace_id"] in trace_ids]
                )
        if (method, path) == ("GET", "/_control/exports"):
            with state.lock:
                return Reply(200, {"exports": state.exports, "spans": len(state.spans)})
        raise HttpError(404, "not found")

    def _route_api(self, method: str, url: SplitResult) -> Reply | None:
        if url.path == TRACES_PATH:
            raise HttpError(405, "method not allowed")
        raise HttpError(404, "not found")


def main(argv: list[str] | None = None) -> None:
    """Serve the fake OTLP collector until SIGTERM or SIGINT."""
    parser = _http.arg_parser("python -m fakes.otlp", main.__doc__)
    _http.serve(
        parser,
        argv,
        lambda args, token: FakeOtlpCollector(host=args.host, port=args.port, token=token),
    )


if __name__ == "__main__":
    main()
