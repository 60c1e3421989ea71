"""The HTTP door's contract: the committed OpenAPI document matches the code, its bodies are
the Structs of `schemas/`, and the pieces the routes share behave as the README says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from schemas.api import CommandBody, StartRun
from services.ingress.http._idempotency import fingerprint
from services.ingress.http._problems import STATUS, ApiError, problem
from writ.contracts import check_contracts, write_contracts


def test_the_committed_contracts_match_the_code() -> None:
    assert check_contracts() == []


def test_a_changed_contract_is_drift(tmp_path: Path) -> None:
    write_contracts(tmp_path)
    assert check_contracts(tmp_path) == []
    path = tmp_path / "openapi.json"
    path.write_text(path.read_text().replace("Start a run", "Begin a run"))
    assert check_contracts(tmp_path) == [f"{path} differs from the code: run `make schemas`"]


def test_the_document_is_openapi_3_1_with_the_routes_of_the_issue() -> None:
    document = json.loads((Path(__file__).parents[2] / "schemas" / "openapi.json").read_text())
    assert document["openapi"] == "3.1.0"
    assert {
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/wait",
        "/commands",
        "/pending-decisions",
        "/pending-decisions/decide",
        "/proposals/{proposal_id}/approve",
        "/proposals/{proposal_id}/reject",
        "/reviews/{pending_id}",
        "/audit/replay/{run_id}",
    } <= set(document["paths"])
    # One server, the API's own: a client whose base URL is `.../api/v1` calls `/runs`.
    assert document["servers"] == [
        {"url": "/api/v1", "description": "The API on the server that serves this document"}
    ]
    post = document["paths"]["/runs"]["post"]
    assert [p["name"] for p in post["parameters"]] == ["Idempotency-Key"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/StartRun"
    }
    assert "application/problem+json" in post["responses"]["409"]["content"]
    assert document["security"] == [{"bearer": []}]


def test_operations_have_the_ids_clients_are_generated_with() -> None:
    document = json.loads((Path(__file__).parents[2] / "schemas" / "openapi.json").read_text())
    ids = {
        (method, path): operation["operationId"]
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }
    assert len(set(ids.values())) == len(ids)
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", i) for i in ids.values()), ids
    assert {
        ("post", "/runs"): "createRun",
        ("get", "/runs/{run_id}"): "getRun",
        ("get", "/runs/{run_id}/wait"): "waitRun",
        ("post", "/runs/{run_id}/cancel"): "cancelRun",
        ("get", "/runs/{run_id}/events"): "streamRunEvents",
    }.items() <= ids.items()
    # A header is text: `Last-Event-ID` is a string of digits, never an integer.
    [last] = [
        p
        for p in document["paths"]["/runs/{run_id}/events"]["get"]["parameters"]
        if p["name"] == "Last-Event-ID"
    ]
    assert {"type": "integer"} not in last["schema"].get("oneOf", [last["schema"]])
    assert {"type": "string"} in last["schema"]["oneOf"]


def test_bodies_refuse_unknown_fields() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `tenant`"):
        msgspec.json.decode(b'{"agent":"a","input":"x","tenant":"globex"}', type=StartRun)


def test_the_fingerprint_ignores_key_order_and_spacing_but_not_values() -> None:
    one = msgspec.json.decode(
        b'{"agent":"a","operation_key":"k","action":"x","arguments":{"b":1,"a":2}}',
        type=CommandBody,
    )
    two = msgspec.json.decode(
        b'{ "arguments": {"a": 2, "b": 1}, "action": "x", "operation_key": "k", "agent": "a" }',
        type=CommandBody,
    )
    other = msgspec.structs.replace(one, arguments={"a": 2, "b": 3})
    alice, bob = "alice@acme.example", "bob@acme.example"
    assert fingerprint(alice, "POST /commands", one) == fingerprint(alice, "POST /commands", two)
    assert fingerprint(alice, "POST /commands", one) != fingerprint(alice, "POST /commands", other)
    assert fingerprint(alice, "POST /commands", one) != fingerprint(alice, "POST /runs", one)
    # The same request from another principal of the tenant is another request.
    assert fingerprint(alice, "POST /commands", one) != fingerprint(bob, "POST /commands", one)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("TOO_LARGE", 413),
        ("INVALID_REQUEST", 400),
        ("BAD_SIGNATURE", 401),
        ("TOKEN_EXPIRED", 401),
        ("WRONG_TENANT", 403),
        ("FORBIDDEN", 403),
        ("CONFLICT", 409),
        ("NOT_FOUND", 404),
        ("UNAVAILABLE", 503),
    ],
)
def test_each_code_has_its_status_and_a_problem_document(code: str, status: int) -> None:
    assert ApiError(code).status == STATUS[code] == status
    response = problem(code, "why", instance="/api/v1/runs")
    assert response.status_code == status
    assert response.media_type == "application/problem+json"
    assert msgspec.json.decode(response.content) == {
        "type": "about:blank",
        "title": code.replace("_", " ").lower(),
        "status": status,
        "code": code,
        "detail": "why",
        "instance": "/api/v1/runs",
    }


def test_the_asyncapi_document_is_valid_by_the_official_asyncapi_3_0_schema() -> None:
    """Validated by the AsyncAPI Initiative's JSON Schema for 3.0.0 (`@asyncapi/specs` 6.11.1,
    `schemas/3.0.0-without-$id.json`, Apache-2.0, committed as tests/data/)."""
    import jsonschema

    root = Path(__file__).parents[1]
    schema = json.loads((root / "data" / "asyncapi-3.0.0.schema.json").read_text())
    document = json.loads((root.parent / "schemas" / "asyncapi.json").read_text())
    jsonschema.Draft7Validator(schema).validate(document)
    assert document["channels"]["requests"]["address"] == "writ.in.requests.{tenant}"
    assert set(document["channels"]["results"]["messages"]) == {
        "RunResult",
        "CommandResult",
        "DecisionResult",
        "ApprovalResult",
        "ReviewResult",
    }
    # What a host is told matches what ingress does (tests/e2e: a message without the header
    # runs; one whose header is not its request_id is refused unanswered).
    headers = document["components"]["messages"]["RunRequest"]["headers"]
    assert (
        "required" not in headers
        and "Optional" in headers["properties"]["Nats-Msg-Id"]["description"]
    )
    [server] = document["servers"].values()
    assert server["host"] == "{host}:{port}" and set(server["variables"]) == {"host", "port"}
    assert server["security"] == [{"$ref": "#/components/securitySchemes/hostUser"}]
    assert document["components"]["securitySchemes"]["hostUser"]["type"] == "userPassword"
    assert "_INBOX.host-{tenant}" in server["description"]
    assert "`WRIT_OUT_{tenant}`" in document["channels"]["results"]["description"]
    # A host subscribes to no chat subject: no operation of its own says it does.
    assert all(op["channel"]["$ref"] != "#/channels/chat" for op in document["operations"].values())
    assert "RunResult" in document["channels"]["readReplies"]["messages"]  # the `wait` read


def test_a_broken_asyncapi_document_is_refused_by_that_schema() -> None:
    import jsonschema

    root = Path(__file__).parents[1]
    schema = json.loads((root / "data" / "asyncapi-3.0.0.schema.json").read_text())
    document = json.loads((root.parent / "schemas" / "asyncapi.json").read_text())
    document["operations"]["startRun"]["action"] = "publish"  # AsyncAPI 2's word
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(document)
