"""The Litestar application of `/api/v1`: routes, problem documents, OpenAPI 3.1."""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
from litestar import Litestar, Request, Response, Router, get
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from schemas import subjects
from services.ingress.http._api import Api
from services.ingress.http._guard import check_body, check_parameters, secure_headers
from services.ingress.http._ops import ops_handlers
from services.ingress.http._people import people_handlers
from services.ingress.http._problems import EXCEPTION_HANDLERS
from services.ingress.http._receipts import receipt_key_handlers
from services.ingress.http._runs import run_handlers
from services.ingress.http._sessions import session_handlers

__all__ = ["PREFIX", "build_app", "openapi_document"]

PREFIX: Final = "/api/v1"
# Each operation's id, as generated clients name their functions (`create_run`, `wait_run`).
OPERATION_IDS: Final = {
    ("post", "/runs"): "createRun",
    ("get", "/runs/{run_id}"): "getRun",
    ("get", "/runs/{run_id}/wait"): "waitRun",
    ("get", "/runs/{run_id}/events"): "streamRunEvents",
    ("post", "/runs/{run_id}/cancel"): "cancelRun",
    ("post", "/commands"): "submitCommand",
    ("get", "/commands/{operation_key}"): "getCommand",
    ("get", "/pending-decisions"): "listPendingDecisions",
    ("post", "/pending-decisions/decide"): "decidePending",
    ("get", "/spend"): "listSpend",
    ("get", "/proposals"): "listProposals",
    ("get", "/proposals/{proposal_id}"): "getProposal",
    ("post", "/proposals/{proposal_id}/approve"): "approveProposal",
    ("post", "/proposals/{proposal_id}/reject"): "rejectProposal",
    ("post", "/proposals/{proposal_id}/revise"): "askProposalRevision",
    ("get", "/proposals/{proposal_id}/trail"): "getProposalTrail",
    ("get", "/reviews"): "listReviews",
    ("post", "/reviews/{pending_id}"): "answerReview",
    ("get", "/reconciliation"): "listUnknownCommands",
    ("post", "/reconciliation/{operation_id}/resolve"): "resolveCommand",
    ("post", "/audit/replay/{run_id}"): "replayRun",
    ("get", "/audit/verify"): "verifyAudit",
    ("get", "/receipts/keys"): "getReceiptKeys",
    ("get", "/sessions"): "listSessions",
    ("post", "/sessions"): "openSession",
    ("get", "/sessions/{session_id}"): "getSession",
    ("get", "/sessions/{session_id}/events"): "streamSessionEvents",
    ("post", "/sessions/{session_id}/messages"): "sendMessage",
    ("post", "/sessions/{session_id}/inject"): "injectIntoSession",
    ("post", "/sessions/{session_id}/fork"): "forkSession",
    ("post", "/sessions/{session_id}/pause"): "pauseSession",
    ("post", "/sessions/{session_id}/resume"): "resumeSession",
    ("post", "/sessions/{session_id}/close"): "closeSession",
    ("post", "/plans/{plan_id}/approve"): "approvePlan",
    ("post", "/plans/{plan_id}/reject"): "rejectPlan",
}


def build_app(
    api: Api,
    *,
    max_body_bytes: int = 64 * 1024,
    answer_timeout_s: float = 30.0,
    console: Router | None = None,
    receipt_keys_file: str = "",
) -> Litestar:
    """The HTTP door over `api` (building it touches nothing: `make schemas` builds one), and
    the approval console (`/console`, outside the API's contract) when one is given."""

    @get("/openapi.json", include_in_schema=False, media_type="application/json")
    async def openapi(request: Request[Any, Any, Any]) -> Response[bytes]:
        return Response(
            json.dumps(_closed(request.app.openapi_schema.to_schema())).encode(),
            media_type="application/json",
        )

    @get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        """Serving (the bus connection is the process's own readiness, `/readyz`)."""
        return {"status": "ok"}

    router = Router(
        PREFIX,
        before_request=check_body,
        route_handlers=[
            openapi,
            *run_handlers(api, answer_timeout_s=answer_timeout_s),
            *people_handlers(api, answer_timeout_s=answer_timeout_s),
            *ops_handlers(api),
            *session_handlers(api),
            *receipt_key_handlers(receipt_keys_file),
        ],
    )
    config = OpenAPIConfig(
        title="Writ host API",
        version=subjects.HOST_API_VERSION,
        path=f"{PREFIX}/docs",
        description="The front door of Writ over HTTP: the same tokens, bounds and code path "
        "as the NATS subjects `writ.in.*`. Errors are RFC 9457 problem documents "
        "with a stable `code`.",
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(
                    type="http",
                    scheme="bearer",
                    bearer_format="JWT",
                    description="The tenant issuer's EdDSA token",
                )
            }
        ),
        security=[{"bearer": []}],
        render_plugins=[],
        use_handler_docstrings=True,
    )
    pages = [] if console is None else [console]
    return Litestar(
        route_handlers=[router, healthz, *pages],
        exception_handlers=EXCEPTION_HANDLERS,
        openapi_config=config,
        request_max_body_size=max_body_bytes,
        # The API's and the console's routers refuse more, each in its own words.
        before_request=check_parameters,
        before_send=[secure_headers],
        debug=False,
    )


def openapi_document() -> str:
    """The OpenAPI document as committed (`schemas/openapi.json`)."""
    app = build_app(Api.__new__(Api))
    return json.dumps(_closed(app.openapi_schema.to_schema()), indent=2, sort_keys=True) + "\n"


def _structs(cls: type[msgspec.Struct]) -> dict[str, set[bool]]:
    """Each Struct class name under `cls`, with whether its classes forbid unknown fields."""
    found: dict[str, set[bool]] = {}
    for sub in cls.__subclasses__():
        found.setdefault(sub.__name__, set()).add(bool(sub.__struct_config__.forbid_unknown_fields))
        for name, flags in _structs(sub).items():
            found.setdefault(name, set()).update(flags)
    return found


def _closed(document: dict[str, Any]) -> dict[str, Any]:
    """The document with `additionalProperties: false` on each object schema whose Struct
    forbids unknown fields: what the server refuses, the document says it refuses."""
    # Paths relative to the one server, `/api/v1`: a client's base URL is the API's (what
    # `writ run` prints), and each operation has its own id (`OPERATION_IDS`).
    document["servers"] = [
        {"url": PREFIX, "description": "The API on the server that serves this document"}
    ]
    paths = {}
    for path, operations in document.get("paths", {}).items():
        relative = path.removeprefix(PREFIX)
        for method, operation in operations.items():
            if isinstance(operation, dict) and "responses" in operation:
                operation["operationId"] = OPERATION_IDS[(method, relative)]
        paths[relative] = operations
    document["paths"] = paths
    closed = {name for name, flags in _structs(msgspec.Struct).items() if flags == {True}}
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        if name in closed and schema.get("type") == "object":
            schema["additionalProperties"] = False
    # Every route that takes a body refuses one that is not JSON before reading it.
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {}) if isinstance(operation, dict) else {}
            if "requestBody" in operation and "400" in responses:
                responses["415"] = {
                    **responses["400"],
                    "description": "UNSUPPORTED_MEDIA_TYPE: the body is not application/json",
                }
    return document
