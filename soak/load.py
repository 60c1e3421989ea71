"""The open-loop load: every path publishes at its fixed rate whether or not earlier work has
finished (a closed loop would slow down with the deployment and hide a backlog).

Paths (`PATHS`): host commands that write a CRM note under their own key, some of them an
earlier key sent again unchanged (a replay) or changed (a conflict); runs of `crm-assistant`
that write a CRM note; refund commands of `refund-assistant` on a payment of their own, which
ask a person, and which the scripted approver approves from the host's results; and inputs
invalid by construction, which ingress must answer and nothing may dead-letter. Chat turns get
a path here once chat sessions exist (a class with `name`, `rate` and `one`, added to `PATHS`).

Every submission goes in the `Ledger`; it counts as accepted once JetStream acknowledged it
(re-published with the same `Nats-Msg-Id` until then, so an outage delays it, never doubles it).
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx
import msgspec
import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas import subjects
from schemas.host import (
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from soak.deploy import admin_connect
from writ.demo import DEMO_INPUT
from writ.stack import Stack

__all__ = ["TENANT", "Ledger", "Load", "Op"]

TENANT: Final = "acme"
PRINCIPAL: Final = "soak@acme.example"
APPROVER: Final = "ops@acme.example"
NOTE_AGENT: Final = "crm-assistant"  # a standing write_delete grant: notes run without a person
REFUND_AGENT: Final = "refund-assistant"  # no grant: every refund asks a person
PUBLISH_GIVE_UP_S: Final = 90.0  # past this a submission is not accepted (and not checked)
MAX_IN_FLIGHT: Final = 2000  # publishes waiting for JetStream; beyond it the load sheds
_RESULT = RunResult | CommandResult | ApprovalResult | DecisionResult | ReviewResult


@dataclass
class Op:
    """One submission: what was sent, under which key, and whether JetStream took it."""

    kind: str  # note | repeat | conflict | refund | run | hostile
    request_id: str
    operation_key: str = ""
    original: str = ""  # a repeat's or a conflict's first submission (its request id)
    arguments: dict[str, Any] = field(default_factory=dict)
    payment_id: str = ""
    sent_at: float = 0.0
    accepted: bool = False
    error: str = ""


class Ledger:
    """Every submission and every result the host received, by request id."""

    def __init__(self) -> None:
        self.ops: dict[str, Op] = {}
        self.results: dict[str, list[Any]] = {}
        self.shed = 0
        self.approvals: dict[str, str] = {}  # proposal id -> the refund's request id

    def add(self, op: Op) -> Op:
        self.ops[op.request_id] = op
        return op

    def accepted(self, kind: str | None = None) -> list[Op]:
        return [op for op in self.ops.values() if op.accepted and kind in (None, op.kind)]

    def final(self, request_id: str) -> Any | None:
        """The last result that ends the request (a command's, or a run's)."""
        for result in reversed(self.results.get(request_id, [])):
            if isinstance(result, CommandResult) and result.status not in (
                    "pending", "dispatching", "awaiting_human"):
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
        return out


def _payment(payment_id: str) -> dict[str, Any]:
    return {"payment_id": payment_id, "customer_id": "ACME-42", "currency": "EUR",
            "status": "captured", "method": {"kind": "card", "last4": "4242", "usable": True},
            "lines": [{"line_id": "L2", "product": "Junior programme", "participant": "Léo",
                       "amount_cents": 12000,
                       "discount": {"discount_id": "D-SIB", "name": "Sibling discount",
                                    "amount_cents": 1500}}]}


class Load:
    """Plays the host and the approver at fixed rates."""

    def __init__(self, stack: Stack, *, rng: random.Random, command_rate: float,
                 run_rate: float, refund_rate: float, repeat_fraction: float,
                 conflict_fraction: float, hostile_every_s: float) -> None:
        self.stack, self.rng = stack, rng
        self.rates = {"command": command_rate, "run": run_rate, "refund": refund_rate,
                      "hostile": 1.0 / hostile_every_s if hostile_every_s > 0 else 0.0}
        self.repeat_fraction, self.conflict_fraction = repeat_fraction, conflict_fraction
        self.ledger = Ledger()
        self._notes: list[Op] = []  # accepted first submissions of a key: what repeats reuse
        self._in_flight = 0
        self._host: nats.aio.client.Client | None = None
        self._admin: nats.aio.client.Client | None = None
        self._payments: httpx.AsyncClient | None = None
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(_RESULT)
        self.stopping = anyio.Event()
        self.nats_errors = 0

    async def open(self) -> None:
        self._host = await self.stack.host_connection(TENANT, reconnect_time_wait=0.5,
                                                      error_cb=self._nats_error)
        self._admin = await admin_connect(self.stack, max_reconnect_attempts=-1,
                                          reconnect_time_wait=0.5, error_cb=self._nats_error)
        self._payments = httpx.AsyncClient(base_url=self.stack.payments_url, timeout=10)

    async def _nats_error(self, exc: Exception) -> None:
        """The nemesis restarts NATS: a connection error is expected, and counted."""
        self.nats_errors += 1

    async def close(self) -> None:
        for client in (self._host, self._admin):
            if client is not None:
                await client.close()
        if self._payments is not None:
            await self._payments.aclose()

    # -- the paths ----------------------------------------------------------------------------

    async def drive(self, duration_s: float) -> None:
        """Every path at its rate for `duration_s` (open loop: a tick never waits for work)."""
        async with anyio.create_task_group() as tg:
            for path, rate in self.rates.items():
                if rate > 0:
                    tg.start_soon(self._ticker, tg, path, rate, time.monotonic() + duration_s)

    async def _ticker(self, tg: anyio.abc.TaskGroup, path: str, rate: float,
                      until: float) -> None:
        step, due = 1.0 / rate, time.monotonic()
        one = {"command": self._command, "run": self._run, "refund": self._refund,
               "hostile": self._hostile}[path]
        while (now := time.monotonic()) < until:
            if due > now:
                await anyio.sleep(due - now)
            due += step
            if self._in_flight >= MAX_IN_FLIGHT:
                self.ledger.shed += 1
                continue
            tg.start_soon(one)

    def _token(self, principal: str = PRINCIPAL, **extra: object) -> str:
        return self.stack.token(TENANT, principal, ttl_s=3600, **extra)

    async def _command(self) -> None:
        draw = self.rng.random()
        earlier = self._notes[self.rng.randrange(len(self._notes))] if self._notes else None
        request_id = f"cmd-{uuid.uuid4().hex}"
        if earlier is not None and draw < self.repeat_fraction:
            op = Op("repeat", request_id, earlier.operation_key, earlier.request_id,
                    earlier.arguments)
        elif draw < self.repeat_fraction + self.conflict_fraction and (
                earlier := self._answered(earlier)) is not None:
            op = Op("conflict", request_id, earlier.operation_key, earlier.request_id,
                    {**earlier.arguments, "body": earlier.arguments["body"] + " (changed)"})
        else:
            key = f"note-{uuid.uuid4().hex}"
            op = Op("note", request_id, key, "",
                    {"customer_id": "ACME-42", "body": f"Soak call note {key}."})
        await self._submit_command(op, NOTE_AGENT)
        if op.kind == "note" and op.accepted:
            self._notes.append(op)

    def _answered(self, earlier: Op | None) -> Op | None:
        """A key whose first submission was answered already (so a conflict on it comes
        second for sure), trying a few at random."""
        for _ in range(5):
            if earlier is not None and self.ledger.results.get(earlier.request_id):
                return earlier
            earlier = self._notes[self.rng.randrange(len(self._notes))] if self._notes else None
        return None

    async def _submit_command(self, op: Op, agent: str) -> None:
        command = SubmitCommand(request_id=op.request_id, token=self._token(), agent=agent,
                                operation_key=op.operation_key,
                                action="payment.refund" if op.kind == "refund"
                                else "crm.note.create", arguments=op.arguments)
        await self._publish(self.ledger.add(op), subjects.command_request(TENANT),
                            self._encoder.encode(command))

    async def _run(self) -> None:
        request_id = f"run-{uuid.uuid4().hex}"
        request = RunRequest(request_id=request_id, token=self._token(), agent=NOTE_AGENT,
                             input=DEMO_INPUT)
        await self._publish(self.ledger.add(Op("run", request_id)), subjects.request(TENANT),
                            self._encoder.encode(request))

    async def _refund(self) -> None:
        assert self._payments is not None
        payment_id = f"pay_{uuid.uuid4().hex[:16]}"
        request_id = f"refund-{uuid.uuid4().hex}"
        op = Op("refund", request_id, f"refund-{payment_id}", "",
                {"payment_id": payment_id, "line_id": "L2"}, payment_id=payment_id)
        try:  # the provider's own record of the payment (its control API ignores fault modes)
            (await self._payments.post("/_control/payments", json=_payment(payment_id))
             ).raise_for_status()
        except httpx.HTTPError as exc:
            op.error = f"seeding the payment: {exc!r}"
            self.ledger.add(op)
            return
        await self._submit_command(op, REFUND_AGENT)

    async def _hostile(self) -> None:
        """A request no host may send: an unknown field, or bytes that are not JSON."""
        request_id = f"hostile-{uuid.uuid4().hex}"
        body = (b"\xff\xfe not json" if self.rng.random() < 0.5 else self._encoder.encode(
            {"type": "RunRequest", "request_id": request_id, "token": "x", "agent": NOTE_AGENT,
             "input": "hello", "unexpected": True}))
        op = Op("hostile", request_id, arguments={"json": body.startswith(b"{")})
        await self._publish(self.ledger.add(op), subjects.request(TENANT), body)

    async def _publish(self, op: Op, subject: str, data: bytes) -> None:
        """Publish until JetStream acknowledges it (same message id: a retry is a duplicate)."""
        assert self._host is not None
        js = self._host.jetstream()
        op.sent_at = time.monotonic()
        self._in_flight += 1
        try:
            while time.monotonic() - op.sent_at < PUBLISH_GIVE_UP_S:
                try:
                    await js.publish(subject, data, headers={"Nats-Msg-Id": op.request_id},
                                     timeout=5)
                except Exception as exc:  # an outage: wait and send the same message again
                    op.error = repr(exc)[:300]
                    await anyio.sleep(1.0)
                    continue
                op.accepted, op.error = True, ""
                return
        finally:
            self._in_flight -= 1

    # -- results and the approver --------------------------------------------------------------

    async def collect(self) -> None:
        """Read every result on the tenant's stream (a durable consumer of the soak's own, so
        nothing published while NATS restarts is missed) and approve what asks a person."""
        while True:
            try:
                await self._collect()
            except Exception as exc:  # NATS restarting: subscribe again
                if self.stopping.is_set():
                    return
                await anyio.sleep(1.0)
                del exc

    async def _collect(self) -> None:
        assert self._admin is not None
        js = self._admin.jetstream()
        sub = await js.pull_subscribe(
            subjects.result(TENANT), durable="soak", stream=subjects.out_stream(TENANT),
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                  deliver_policy=DeliverPolicy.ALL, ack_wait=30))
        while not self.stopping.is_set():
            try:
                msgs = await sub.fetch(256, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                try:
                    result = self._decoder.decode(msg.data)
                except msgspec.DecodeError:
                    result = None
                if result is not None:
                    self._on_result(result)
                await msg.ack()

    def _on_result(self, result: Any) -> None:
        self.ledger.results.setdefault(result.request_id, []).append(result)
        op = self.ledger.ops.get(result.request_id)
        if (isinstance(result, CommandResult) and result.status == "awaiting_human"
                and result.proposal is not None and op is not None and op.kind == "refund"):
            if result.proposal.proposal_id not in self.ledger.approvals:
                self.ledger.approvals[result.proposal.proposal_id] = op.request_id

    async def approve(self) -> None:
        """The scripted approver: approves each refund's proposal once it is shown, and again
        (harmless: one execution) for any whose refund has not ended after a while."""
        asked: dict[str, float] = {}
        while not self.stopping.is_set():
            now = time.monotonic()
            for proposal_id, request_id in list(self.ledger.approvals.items()):
                last = asked.get(proposal_id)
                if last is not None and (now - last < 30 or self.ledger.final(request_id)):
                    continue
                asked[proposal_id] = now
                await self._approve(proposal_id)
            await anyio.sleep(0.5)

    async def _approve(self, proposal_id: str) -> None:
        assert self._host is not None
        request_id = f"approve-{uuid.uuid4().hex}"
        message = ApproveProposal(request_id=request_id, proposal_id=proposal_id,
                                  answer="approve", reason="soak: scripted approver",
                                  token=self._token(APPROVER, roles=["approver"]))
        await self._publish(self.ledger.add(Op("approval", request_id)),
                            subjects.approval(TENANT), self._encoder.encode(message))
