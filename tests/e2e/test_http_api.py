"""The HTTP door (`/api/v1`, served by ingress) through the six real processes: a run started
over HTTP reaches the same state and effects as one over NATS; Idempotency-Key gives one run per
key and `409` for another body under it; each bad input of the NATS path gets its code as a
problem document and changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import asyncpg
import httpx
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.e2e.conftest import Host, notes_for, run_input
from writ.stack import Stack, mint_token

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

BODY = {"agent": "crm-assistant", "input": "Note the delayed shipment call"}


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=40) as client:
        yield client


def auth(
    stack: Stack, tenant: str = "acme", principal: str = "alice@acme.example", **claims: object
) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.token(tenant, principal, **claims)}"}


def key() -> dict[str, str]:
    return {"Idempotency-Key": f"http-{uuid.uuid4().hex[:12]}"}


async def runs_of(db: asyncpg.Connection, request_id: str) -> int:
    return await db.fetchval("SELECT count(*) FROM planner.runs WHERE request_id = $1", request_id)


async def test_a_run_over_http_reaches_the_same_state_and_effects_as_over_nats(
    stack: Stack, api: httpx.Client, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    headers = {**auth(stack), **key()}
    started = api.post("/runs", json=BODY, headers=headers)
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    assert started.json()["links"]["wait"] == f"/api/v1/runs/{run_id}/wait"

    waited = api.get(f"/runs/{run_id}/wait", params={"timeout_s": 30}, headers=auth(stack))
    assert waited.status_code == 200, waited.text
    result = waited.json()
    assert (result["status"], result["run_id"]) == ("succeeded", run_id)
    [action] = result["actions"]
    assert (action["action"], action["state"]) == ("crm.note.create", "succeeded")
    assert len(notes_for(crm, f"acme:{action['operation_id']}")) == 1

    # The same run over NATS: the same steps, one command, one note.
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    over_nats = await host.wait_result(request.request_id)
    assert over_nats.status == "succeeded"
    steps = "SELECT kind, payload->>'decision' FROM planner.steps WHERE run_id = $1 ORDER BY seq"
    assert [tuple(r) for r in await db.fetch(steps, run_id)] == [
        tuple(r) for r in await db.fetch(steps, over_nats.run_id)
    ]
    for rid in (run_id, over_nats.run_id):
        assert (
            await db.fetchval(
                "SELECT count(*) FROM admission.commands WHERE run_id = $1 AND state = 'succeeded'",
                rid,
            )
            == 1
        )

    view = api.get(f"/runs/{run_id}", headers=auth(stack)).json()
    assert (view["status"], view["answer"]) == ("succeeded", result["answer"])
    # Another tenant's principal does not see it, not even that it exists.
    other = api.get(f"/runs/{run_id}", headers=auth(stack, "globex", "bob@globex.example"))
    assert (other.status_code, other.json()["code"]) == (404, "NOT_FOUND")
    assert other.headers["content-type"] == "application/problem+json"


async def test_the_same_key_twice_is_one_run_and_another_body_under_it_is_409(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection
) -> None:
    headers = {**auth(stack), **key()}
    first = api.post("/runs", json=BODY, headers=headers)
    # A retry after a lost response, with a fresh token and its keys in another order.
    again = api.post(
        "/runs",
        json={"input": BODY["input"], "agent": BODY["agent"]},
        headers={**headers, **auth(stack)},
    )
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json() == first.json()
    assert again.headers.get("idempotent-replayed") == "true"
    conflict = api.post("/runs", json={**BODY, "input": "something else"}, headers=headers)
    assert (conflict.status_code, conflict.json()["code"]) == (409, "CONFLICT")
    run_id = first.json()["run_id"]
    assert api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()["status"] == "succeeded"
    assert await runs_of(db, headers["Idempotency-Key"]) == 1
    # Another principal of the tenant under the same key and body: a conflict that says
    # nothing of the first run, and no second run.
    bob = {
        **auth(stack, principal="bob@acme.example"),
        "Idempotency-Key": headers["Idempotency-Key"],
    }
    foreign = api.post("/runs", json=BODY, headers=bob)
    assert (foreign.status_code, foreign.json()["code"]) == (409, "CONFLICT"), foreign.text
    assert run_id not in foreign.text and "idempotent-replayed" not in foreign.headers
    assert await runs_of(db, headers["Idempotency-Key"]) == 1
    assert await run_input(db, stack, run_id) == BODY["input"]


def _foreign_token(tenant: str = "acme") -> str:
    key = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return mint_token(
        key,
        issuer=f"https://{tenant}.example/host",
        tenant=tenant,
        principal="mallory@acme.example",
    )


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("no token", 401, "UNAUTHENTICATED"),
        ("bad signature", 401, "BAD_SIGNATURE"),
        ("expired token", 401, "TOKEN_EXPIRED"),
        ("unknown tenant", 401, "UNKNOWN_TENANT"),
        ("unknown field", 400, "INVALID_REQUEST"),
        ("too long input", 400, "INVALID_REQUEST"),
        ("oversized body", 413, "TOO_LARGE"),
        ("no idempotency key", 400, "INVALID_REQUEST"),
        ("malformed key", 400, "INVALID_REQUEST"),
    ],
)
async def test_each_bad_input_gets_its_code_and_changes_nothing(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection, case: str, status: int, code: str
) -> None:
    request_id = f"bad-{uuid.uuid4().hex[:12]}"
    headers = {**auth(stack), "Idempotency-Key": request_id}
    body: dict[str, object] = dict(BODY)
    if case == "no token":
        del headers["Authorization"]
    elif case == "bad signature":
        headers["Authorization"] = f"Bearer {_foreign_token()}"
    elif case == "expired token":
        headers.update(auth(stack, ttl_s=-60))
    elif case == "unknown tenant":
        headers["Authorization"] = f"Bearer {_foreign_token('initech')}"
    elif case == "unknown field":
        body["tenant"] = "globex"
    elif case == "too long input":
        body["input"] = "x" * 9000
    elif case == "oversized body":
        body["input"] = "x" * (200 * 1024)
    elif case == "no idempotency key":
        del headers["Idempotency-Key"]
    elif case == "malformed key":
        headers["Idempotency-Key"] = request_id = "bad key with spaces"
    response = api.post("/runs", json=body, headers=headers)
    assert (response.status_code, response.json()["code"]) == (status, code), response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["status"] == status
    assert await runs_of(db, request_id) == 0


async def test_answers_need_the_approver_role_and_reads_the_auditor_role(
    stack: Stack, api: httpx.Client
) -> None:
    for method, path, body in (
        ("GET", "/pending-decisions", None),
        ("POST", "/pending-decisions/decide", {"pending_id": "p-1", "answer": "once"}),
        ("POST", f"/proposals/{uuid.uuid4()}/approve", {}),
        ("POST", f"/proposals/{uuid.uuid4()}/reject", {"reason": "no"}),
        ("POST", "/reviews/review-x-1", {"answer": "approve"}),
        ("POST", f"/audit/replay/{uuid.uuid4()}", None),
    ):
        response = api.request(method, path, json=body, headers={**auth(stack), **key()})
        assert (response.status_code, response.json()["code"]) == (403, "FORBIDDEN"), path
    listed = api.get("/pending-decisions", headers=auth(stack, roles=["approver"]))
    assert listed.status_code == 200, listed.text
    assert isinstance(listed.json()["decisions"], list)


def test_openapi_and_healthz(stack: Stack, api: httpx.Client) -> None:
    document = api.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert "/runs" in document["paths"] and document["servers"][0]["url"] == "/api/v1"
    base = stack.api_url.removesuffix("/api/v1")
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}


async def test_a_body_without_a_length_is_cut_off_at_the_limit(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection
) -> None:
    """Chunked, so nothing announces its size: the server stops reading past the limit."""
    request_id = f"chunked-{uuid.uuid4().hex[:12]}"

    def chunks() -> Iterator[bytes]:
        yield b'{"agent": "crm-assistant", "input": "'
        for _ in range(4096):  # 4 MiB offered, 64 KiB allowed
            yield b"x" * 1024
        yield b'"}'

    try:
        response = api.post(
            "/runs",
            content=chunks(),
            headers={
                **auth(stack),
                "Idempotency-Key": request_id,
                "Content-Type": "application/json",
            },
        )
    except httpx.WriteError:
        pass  # the server answered and closed before the client finished sending
    else:
        assert (response.status_code, response.json()["code"]) == (413, "TOO_LARGE")
    assert await runs_of(db, request_id) == 0


@pytest.mark.parametrize(
    ("case", "code", "said"),
    [
        ("nested unknown field", "INVALID_REQUEST", "unknown field `max_steps` - at `$.budget`"),
        ("too long input", "INVALID_REQUEST", "length <= 8192 - at `$.input`"),
        ("malformed token", "INVALID_TOKEN", "invalid token: "),
        ("wrong audience", "INVALID_TOKEN", "the token's `aud` must be 'writ'"),
        ("unknown agent", "UNKNOWN_AGENT", "'ghost-assistant'"),
    ],
)
async def test_the_same_mistake_gets_the_same_answer_on_both_doors(
    stack: Stack, api: httpx.Client, host: Host, case: str, code: str, said: str
) -> None:
    token = stack.token("acme", "alice@acme.example")
    body: dict[str, object] = dict(BODY)
    if case == "nested unknown field":
        body["budget"] = {"max_steps": 3}
    elif case == "too long input":
        body["input"] = "x" * 9000
    elif case == "malformed token":
        token = "not-a-token"
    elif case == "wrong audience":
        token = stack.token("acme", "alice@acme.example", audience="writ/console-sign-in")
    elif case == "unknown agent":
        body["agent"] = "ghost-assistant"
    request_id = f"same-{uuid.uuid4().hex[:12]}"
    over_http = api.post(
        "/runs",
        json=body,
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": request_id},
    )
    assert over_http.json()["code"] == code, over_http.text
    assert said in over_http.json()["detail"], over_http.text

    message = {"type": "RunRequest", "request_id": request_id, "token": token, **body}
    await host.publish(msgspec.json.encode(message), msg_id=request_id)
    over_nats = await host.wait_result(request_id)
    assert over_nats.status == "rejected" and over_nats.error is not None
    assert (over_nats.error.code, over_nats.error.message) == (code, over_http.json()["detail"])


async def test_a_bad_idempotency_key_is_refused_against_its_header(
    stack: Stack, api: httpx.Client
) -> None:
    for bad in ("bad key with spaces", "k" * 129):
        refused = api.post("/runs", json=BODY, headers={**auth(stack), "Idempotency-Key": bad})
        assert (refused.status_code, refused.json()["code"]) == (400, "INVALID_REQUEST")
        assert refused.json()["detail"].startswith("header `Idempotency-Key`: "), refused.text
        assert "request_id" not in refused.json()["detail"]
    missing = api.post("/runs", json=BODY, headers=auth(stack))
    assert (missing.status_code, missing.json()["code"]) == (400, "INVALID_REQUEST")
    assert "header parameter 'Idempotency-Key'" in missing.json()["detail"]
