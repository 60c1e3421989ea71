"""What the load sent and what came back: every submission by request id, the results the host
received, and the chat sessions it opened (the checker's side of the story)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.host import CommandResult, RunResult

__all__ = ["ChatSession", "Ledger", "Op"]


@dataclass
class Op:
    """One submission: what was sent, under which key, and whether JetStream took it (a chat
    message: whether ingress accepted it, `SESSION_BUSY` refusals apart)."""

    kind: str  # note | repeat | conflict | refund | run | hostile | approval | open | chat
    request_id: str
    operation_key: str = ""
    original: str = ""  # a repeat's or a conflict's first submission (its request id)
    arguments: dict[str, Any] = field(default_factory=dict)
    payment_id: str = ""
    sent_at: float = 0.0
    accepted: bool = False
    error: str = ""
    tenant: str = "acme"
    session_id: str = ""  # a chat message's session
    run_id: str = ""  # the turn a chat message started
    busy: bool = False  # a chat message refused with SESSION_BUSY (nothing applied)


@dataclass
class ChatSession:
    """A session the load opened: whose, and whether it writes notes or only talks."""

    session_id: str
    tenant: str
    talk: bool


class Ledger:
    """Every submission and every result the host received, by request id."""

    def __init__(self) -> None:
        self.ops: dict[str, Op] = {}
        self.results: dict[str, list[Any]] = {}
        self.shed = 0
        self.approvals: dict[str, str] = {}  # proposal id -> the refund's request id
        self.sessions: dict[str, ChatSession] = {}
        self.keyed: dict[str, list[Op]] = {}  # a note's key -> the note and its repeats

    def add(self, op: Op) -> Op:
        self.ops[op.request_id] = op
        if op.kind in ("note", "repeat") and op.operation_key:
            self.keyed.setdefault(op.operation_key, []).append(op)
        return op

    def accepted(self, kind: str | None = None) -> list[Op]:
        return [op for op in self.ops.values() if op.accepted and kind in (None, op.kind)]

    def final(self, request_id: str) -> Any | None:
        """The last result that ends the request (a command's, or a run's)."""
        for result in reversed(self.results.get(request_id, [])):
            if isinstance(result, CommandResult) and result.status not in (
                "pending",
                "dispatching",
                "awaiting_human",
            ):
                return result
            if isinstance(result, RunResult) and result.status != "awaiting_human":
                return result
        return None

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for op in self.ops.values():
            row = out.setdefault(op.kind, {"sent": 0, "accepted": 0})
            row["sent"] += 1
            row["accepted"] += op.accepted
            if op.busy:
                row["busy"] = row.get("busy", 0) + 1
        return out

    def by_tenant(self) -> dict[str, dict[str, int]]:
        """Accepted submissions per tenant and kind."""
        out: dict[str, dict[str, int]] = {}
        for op in self.ops.values():
            if op.accepted:
                row = out.setdefault(op.tenant, {})
                row[op.kind] = row.get(op.kind, 0) + 1
        return out
