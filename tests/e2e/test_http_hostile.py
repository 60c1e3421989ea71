"""Hostile input on the HTTP door, as on the NATS door: every route of the committed OpenAPI
document, sent U+0000, lone surrogates and bytes that are not UTF-8 in each body field, path id
and query parameter, JSON nested far too deep, and bodies that are not JSON. Each is answered
400 (naming the field) or 415 as a problem document with the security headers, never 5xx; and
nothing is created: no row in any service's tables, no message on any stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from services.ingress.logic import MAX_JSON_DEPTH
from tests.e2e.conftest import Host
from tests.e2e.test_hostile_input import _counts
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DOCUMENT = json.loads((Path(__file__).parents[2] / "schemas" / "openapi.json").read_text())
SECURITY_HEADERS = (
    "content-security-policy",
    "x-content-type-options",
    "referrer-policy",
    "x-frame-options",
    "cache-control",
)
# Raw JSON fragments a field's value is replaced with; each names the field in its refusal.
POISON = {
    "NUL": b'"ok\\u0000"',
    "NUL alone": b'"\\u0000"',
    "an escaped lone surrogate": b'"x\\ud800"',
    "a low surrogate first": b'"\\udfff\\ud800"',
    "a surrogate's UTF-8 bytes": b'"\xed\xa0\x80"',
    "bytes that are not UTF-8": b'"\xff\xfe"',
    "nesting past the bound": b"[" * (MAX_JSON_DEPTH + 5) + b"]" * (MAX_JSON_DEPTH + 5),
    "nesting two thousand deep": b'{"a":' * 2000 + b"1" + b"}" * 2000,
}


@dataclass
class Hostile:
    """One request and the refusal it must get."""

    method: str
    path: str
    status: int
    names: str  # what the problem's detail must name
    body: bytes | None = None
    content_type: str | None = "application/json"
    params: dict[str, str] | None = None


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    # Each path is relative to the document's one server (`/api/v1`).
    server = DOCUMENT["servers"][0]["url"]
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            yield method.upper(), f"{server}{path}", operation


def _fill(path: str, value: str = "x1") -> str:
    """The path with each `{param}` replaced by `value` (raw: already percent-encoded)."""
    while "{" in path:
        start, end = path.index("{"), path.index("}")
        path = path[:start] + value + path[end + 1 :]
    return path


def _body_ref(operation: dict[str, Any]) -> str:
    """The body's schema reference (an optional body is `oneOf` it and null)."""
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in schema:
        return str(schema["$ref"])
    [ref] = [choice["$ref"] for choice in schema["oneOf"] if "$ref" in choice]
    return str(ref)


def _body_fields(operation: dict[str, Any]) -> list[str]:
    ref = _body_ref(operation)
    schema = DOCUMENT["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return sorted(schema["properties"])


def hostile_requests() -> Iterator[Hostile]:
    """Every route, with each hostile value in each place it can go."""
    for method, path, operation in _operations():
        params = [p for p in operation.get("parameters", []) if p["in"] in ("path", "query")]
        for param in params:
            if param["in"] == "path":
                others = _fill(path.replace(f"{{{param['name']}}}", "a%00b"))
                yield Hostile(method, others, 400, f"`{param['name']}`")
            else:
                yield Hostile(
                    method, _fill(path), 400, f"`{param['name']}`", params={param["name"]: "\x00"}
                )
        if method == "GET":  # an undeclared query parameter is read by nobody, refused even so
            yield Hostile(method, _fill(path), 400, "`note`", params={"note": "a\x00"})
        if "requestBody" not in operation:
            continue
        for field in _body_fields(operation):
            for poison in POISON.values():
                body = b'{"%s": %s}' % (field.encode(), poison)
                yield Hostile(method, _fill(path), 400, f"`$.{field}", body=body)
            # ... and inside an object, its key included.
            nested = b'{"%s": {"k": ["ok", "a\\u0000"]}}' % field.encode()
            yield Hostile(method, _fill(path), 400, f"`$.{field}.k[1]`", body=nested)
            key = b'{"%s": {"a\\u0000": 1}}' % field.encode()
            yield Hostile(method, _fill(path), 400, f"`$.{field} (a key)`", body=key)
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            yield Hostile(
                method,
                _fill(path),
                415,
                "application/json",
                body=b'{"reason": "fine"}',
                content_type=content_type,
            )


async def _streams(host: Host) -> dict[str, int]:
    """Each stream's last sequence, but the audit record's (its sealers write on a clock)."""
    return {
        info.config.name: info.state.last_seq
        for info in await host.js.streams_info()
        if info.config.name and info.config.name != "WRIT_AUDIT"
    }


async def test_hostile_input_on_every_route_is_refused_naming_the_field_and_creates_nothing(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    token = stack.token("acme", "ops@acme.example", roles=["approver", "auditor"])
    cases = list(hostile_requests())
    assert len(cases) > 300
    before, streams = await _counts(db), await _streams(host)
    wrong = []
    with httpx.Client(base_url=stack.api_url.removesuffix("/api/v1"), timeout=40) as client:
        for case in cases:
            headers = {
                "Authorization": f"Bearer {token}",
                "Idempotency-Key": f"hostile-http-{uuid.uuid4().hex[:12]}",
            }
            if case.content_type is not None:
                headers["Content-Type"] = case.content_type
            answer = client.request(
                case.method, case.path, content=case.body, headers=headers, params=case.params
            )
            problem = (
                answer.json() if answer.headers.get("content-type", "").endswith("json") else {}
            )
            missing = [h for h in SECURITY_HEADERS if h not in answer.headers]
            if (
                answer.status_code != case.status
                or case.names not in problem.get("detail", "")
                or answer.headers["content-type"] != "application/problem+json"
                or missing
            ):
                wrong.append((case, answer.status_code, answer.text[:200], missing))
    assert not wrong, f"{len(wrong)} of {len(cases)} answered otherwise, e.g. {wrong[:4]}"
    assert await _counts(db) == before
    assert await _streams(host) == streams
    assert all(stack.procs[name].poll() is None for name in stack.procs)


async def test_a_surrogate_in_a_path_id_arrives_replaced_and_is_not_found(stack: Stack) -> None:
    """The server decodes a path's bytes that are not UTF-8 (a surrogate's included) to U+FFFD
    before any route sees it: an id nobody has, never a 5xx."""
    token = stack.token("acme", "ops@acme.example", roles=["approver", "auditor"])
    with httpx.Client(base_url=stack.api_url, timeout=40) as client:
        for path in ("/runs/a%ED%A0%80b", "/proposals/a%FFb", "/commands/%ED%BF%BF"):
            answer = client.get(path, headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code in (400, 404), (path, answer.text)


async def test_every_response_carries_the_security_headers_and_a_405_its_allow(
    stack: Stack,
) -> None:
    base = stack.api_url.removesuffix("/api/v1")
    with httpx.Client(base_url=base, timeout=40) as client:
        answers = {
            "unknown console page": client.get("/console/no-such-page"),
            "unknown API path": client.get("/api/v1/no-such-thing"),
            "unknown path": client.get("/no-such-thing"),
            "TRACE": client.request("TRACE", "/api/v1/runs"),
            "DELETE": client.delete("/api/v1/runs/x1"),
            "a console page, signed out": client.get("/console/"),
            "a console path id with U+0000": client.get("/console/runs/a%00b"),
            "the document": client.get("/api/v1/openapi.json"),
            "health": client.get("/healthz"),
        }
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {
        "unknown console page": 404,
        "unknown API path": 404,
        "unknown path": 404,
        "TRACE": 405,
        "DELETE": 405,
        "a console page, signed out": 401,
        "a console path id with U+0000": 400,
        "the document": 200,
        "health": 200,
    }
    for name, answer in answers.items():
        missing = [h for h in SECURITY_HEADERS if h not in answer.headers]
        assert not missing, (name, missing)
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert "script-src 'self'" in answers["unknown console page"].headers["content-security-policy"]
    assert answers["unknown API path"].headers["content-security-policy"] == (
        "default-src 'none'; frame-ancestors 'none'"
    )
    assert set(answers["TRACE"].headers["allow"].split(", ")) >= {"POST"}
    assert "GET" in answers["DELETE"].headers["allow"].split(", ")
    assert "`run_id`" in answers["a console path id with U+0000"].text


async def test_the_document_forbids_the_extra_fields_the_server_refuses(stack: Stack) -> None:
    token = stack.token("acme", "ops@acme.example", roles=["approver", "auditor"])
    with httpx.Client(base_url=stack.api_url.removesuffix("/api/v1"), timeout=40) as client:
        served = client.get("/api/v1/openapi.json").json()
        assert served == DOCUMENT
        for method, path, operation in _operations():
            if "requestBody" not in operation:
                continue
            name = _body_ref(operation).rsplit("/", 1)[1]
            assert served["components"]["schemas"][name]["additionalProperties"] is False, name
            assert "415" in operation["responses"], (method, path)
            # ... and the server does refuse one.
            answer = client.request(
                method,
                _fill(path),
                json={"tenant": "globex"},
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "extra-field"},
            )
            assert answer.status_code == 400, (path, answer.text)
            assert "unknown field `tenant`" in answer.json()["detail"], (path, answer.text)
