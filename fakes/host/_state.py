"""The helpdesk's data, the tools it lists, its state and switches, shared by its faces."""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any, Final

from starlette.responses import JSONResponse

from fakes._receipts import KeyFile

__all__ = [
    "DEFAULT_DATA",
    "MAX_BODY_BYTES",
    "MAX_KEY_CHARS",
    "MODES",
    "HostState",
    "Unavailable",
    "fault",
    "problem",
    "tool_definitions",
]

MAX_BODY_BYTES: Final = 64 * 1024
MAX_KEY_CHARS: Final = 255
MODES: Final = frozenset({"normal", "fail", "slow", "lose_response"})

DEFAULT_DATA: Final[dict[str, Any]] = {
    "customers": {
        "CUST-42": {
            "customer_id": "CUST-42",
            "name": "Acme Corporation",
            "email": "ops@acme.example",
            "plan": "enterprise",
        },
        "CUST-7": {
            "customer_id": "CUST-7",
            "name": "Initech",
            "email": "it@initech.example",
            "plan": "starter",
        },
    },
    "tickets": {
        "T-1001": {
            "ticket_id": "T-1001",
            "customer_id": "CUST-42",
            "subject": "Order 7781 shipped late",
            "status": "open",
            "priority": "high",
            "body": "Our order 7781 arrived four days late. What happened?",
        },
        "T-1002": {
            "ticket_id": "T-1002",
            "customer_id": "CUST-7",
            "subject": "Invoice address",
            "status": "pending",
            "priority": "low",
            "body": "Please change the invoice address.",
        },
    },
}

_ID: Final = {"type": "string", "pattern": "^[A-Z]+-[0-9]{1,8}$", "maxLength": 16}
_TICKET_OUT: Final = {
    "type": "object",
    "properties": {
        "ticket_id": {"type": "string"},
        "customer_id": {"type": "string"},
        "subject": {"type": "string"},
        "status": {"type": "string"},
        "priority": {"type": "string"},
        "body": {"type": "string"},
        "revision": {"type": "string"},
        "comments": {"type": "integer"},
    },
    "required": ["ticket_id", "customer_id", "subject", "status", "revision"],
}


def tool_definitions() -> list[dict[str, Any]]:
    """The tools the host lists, as plain data (name, description, schemas, annotations)."""
    return [
        {
            "name": "tickets.search",
            "description": "Search the helpdesk's tickets by words of their subject or body.",
            "input_schema": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 200},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["query"],
            },
            "output_schema": {
                "type": "object",
                "properties": {"tickets": {"type": "array", "items": _TICKET_OUT}},
                "required": ["tickets"],
            },
        },
        {
            "name": "ticket.get",
            "description": "Read one ticket: its subject, status, body, "
            "revision and number of comments.",
            "input_schema": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"ticket_id": _ID},
                "required": ["ticket_id"],
            },
            "output_schema": _TICKET_OUT,
        },
        {
            "name": "customer.get",
            "description": "Read one customer: name, email and plan.",
            "input_schema": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"customer_id": _ID},
                "required": ["customer_id"],
            },
            "output_schema": {
                "type": "object",
                "properties": {
                    "customer_id": {"type": "string"},
                    "name": {"type": "string"},
                    "email": {"type": "string"},
                    "plan": {"type": "string"},
                },
                "required": ["customer_id", "name"],
            },
        },
    ]


class HostState:
    """The helpdesk's records, its switches and its counters; every method holds `lock`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self._seed = data
        # Set: REST writes need an approval receipt these keys verify (fakes/_receipts.py).
        self.receipts: KeyFile | None = None
        self.access_tokens: dict[str, float] = {}  # the authorization server's, kept by reset
        self.token_audiences: dict[str, str] = {}  # each access token's resource ("" for none)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.customers = copy.deepcopy(self._seed["customers"])
            self.tickets = copy.deepcopy(self._seed["tickets"])
            self.revisions = dict.fromkeys(self.tickets, 1)
            self.comments: list[dict[str, Any]] = []
            self.replies: dict[str, tuple[str, dict[str, Any], int, dict[str, Any]]] = {}
            self.tools = tool_definitions()
            self.injected: dict[str, str] = {}
            self.modes: dict[str, dict[str, Any]] = {
                "mcp": {"mode": "normal"},
                "rest": {"mode": "normal"},
            }
            self.tool_calls: dict[str, int] = {}
            self.listings = 0
            self.rest_calls = 0
            self.sse_sessions = 0
            self.tokens_issued = 0
            self.token_refusals = 0
            self.token_resources: list[str] = []  # the `resource` of each token issued
            self.metadata_reads = 0
            self.audience_refusals = 0
            # Where a 401 says the metadata is (None: the well-known location), and whether the
            # well-known locations serve it (`/_control/metadata`).
            self.metadata_named: str | None = None
            self.well_known_metadata = True

    def take_mode(self, face: str) -> dict[str, Any]:
        with self.lock:
            mode = dict(self.modes[face])
            if (count := mode.get("count")) is not None:
                if count <= 1:
                    self.modes[face] = {"mode": "normal"}
                else:
                    self.modes[face]["count"] = count - 1
            return mode

    def ticket(self, ticket_id: str) -> dict[str, Any] | None:
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            return None
        return {
            **ticket,
            "revision": f"r{self.revisions[ticket_id]}",
            "comments": sum(c["ticket_id"] == ticket_id for c in self.comments),
        }

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "customers": copy.deepcopy(self.customers),
                "tickets": {t: self.ticket(t) for t in self.tickets},
                "comments": copy.deepcopy(self.comments),
                "tool_calls": dict(self.tool_calls),
                "listings": self.listings,
                "rest_calls": self.rest_calls,
                "sse_sessions": self.sse_sessions,
                "tokens_issued": self.tokens_issued,
                "token_refusals": self.token_refusals,
                "token_resources": list(self.token_resources),
                "metadata_reads": self.metadata_reads,
                "audience_refusals": self.audience_refusals,
            }


async def fault(state: HostState, face: str) -> dict[str, Any]:
    """Take the face's fault mode: raise `Unavailable` (fail), wait (slow), or return it."""
    mode = state.take_mode(face)
    if mode["mode"] == "fail":
        raise Unavailable
    if mode["mode"] == "slow":
        await asyncio.sleep(float(mode.get("delay_s", 1.0)))
    return mode


class Unavailable(Exception):
    """The face answers 503 (its `fail` mode)."""


def problem(status: int, detail: str, **extra: Any) -> JSONResponse:
    """An RFC 9457 problem answer."""
    return JSONResponse(
        {"title": detail, "status": status, **extra},
        status_code=status,
        media_type="application/problem+json",
    )
