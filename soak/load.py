"""The open-loop load: every path publishes at its fixed rate whether or not earlier work has
finished (a closed loop would slow down with the deployment and hide a backlog).

Paths (`PATHS`): host commands that write a CRM note under their own key, some of them an
earlier key sent again unchanged (a replay) or changed (a conflict); runs of `crm-assistant`
that write a CRM note; refund commands of `refund-assistant` on a payment of their own, which
ask a person, and which the scripted approver approves from the host's results; inputs
invalid by construction, which ingress must answer and nothing may dead-letter; and chat
messages over the HTTP API (`soak/chat.py`). Each submission goes to one of the two demo
tenants at random, under that tenant's host credentials.

Every submission goes in the `Ledger`; it counts as accepted once JetStream acknowledged it
(re-published with the same `Nats-Msg-Id` until then, so an outage delays it, never doubles it).
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any, Final

import anyio
import httpx
import msgspec
import nats
import nats.aio.client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from libs.bus import until_answered
from libs.pull import Puller
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
from soak.chat import Chat
from soak.deploy import TENANTS, admin_connect, approver, principal
from soak.ledger import Ledger, Op
from writ.demo import DEMO_INPUT
from writ.stack import Stack

__all__ = ["TENANTS", "Ledger", "Load", "Op", "approver", "principal"]

NOTE_AGENT: Final = "crm-assistant"  # a standing write_delete grant: notes run without a person
REFUND_AGENT: Final = "refund-assistant"  # no grant: every refund asks a person
PUBLISH_GIVE_UP_S: Final = 90.0  # past this a submission is not accepted (and not checked)
MAX_IN_FLIGHT: Final = 2000  # publishes waiting for JetStream; beyond it the load sheds
_RESULT = RunResult | CommandResult | ApprovalResult | DecisionResult | ReviewResult


def _payment(payment_id: str) -> dict[str, Any]:
    return {
        "payment_id": payment_id,
        "customer_id": "ACME-42",
        "currency": "EUR",
        "status": "captured",
        "method": {"kind": "card", "last4": "4242", "usable": True},
        "lines": [
            {
                "line_id": "L2",
                "product": "Junior programme",
                "participant": "Léo",
                "amount_cents": 12000,
                "discount": {
                    "discount_id": "D-SIB",
                    "name": "Sibling discount",
                    "amount_cents": 1500,
                },
            }
        ],
    }


class Load:
    """Plays the host and the approver at fixed rates."""

    def __init__(
        self,
        stack: Stack,
        *,
        rng: random.Random,
        command_rate: float,
        run_rate: float,
        refund_rate: float,
        repeat_fraction: float,
        conflict_fraction: float,
        hostile_every_s: float,
        chat_rate: float = 0.0,
    ) -> None:
        self.stack, self.rng = stack, rng
        self.rates = {
            "command": command_rate,
            "run": run_rate,
            "refund": refund_rate,
            "hostile": 1.0 / hostile_every_s if hostile_every_s > 0 else 0.0,
            "chat": chat_rate,
        }
        self.repeat_fraction, self.conflict_fraction = repeat_fraction, conflict_fraction
        self.ledger = Ledger()
        self.chat = Chat(stack, self.ledger, rng)
        self._notes: list[Op] = []  # accepted first submissions of a key: what repeats reuse
        self._in_flight = 0
        self._hosts: dict[str, nats.aio.client.Client] = {}
        self._admin: nats.aio.client.Client | None = None
        self._payments: httpx.AsyncClient | None = None
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(_RESULT)
        self.stopping = anyio.Event()
        self.nats_errors = 0

    async def open(self) -> None:
        for tenant in TENANTS:
            self._hosts[tenant] = await self.stack.host_connection(
                tenant, reconnect_time_wait=0.5, error_cb=self._nats_error
            )
        await self.chat.open()
        self._admin = await admin_connect(
            self.stack,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=self._nats_error,
        )
        self._payments = httpx.AsyncClient(base_url=self.stack.payments_url, timeout=10)

    async def _nats_error(self, exc: Exception) -> None:
        """The nemesis restarts NATS: a connection error is expected, and counted."""
        self.nats_errors += 1

    async def close(self) -> None:
        for client in (*self._hosts.values(), self._admin):
            if client is not None:
                await client.close()
        await self.chat.close()
        if self._payments is not None:
            await self._payments.aclose()

    # -- the paths ----------------------------------------------------------------------------

    async def drive(self, duration_s: float) -> None:
        """Every path at its rate for `duration_s` (open loop: a tick never waits for work)."""
        async with anyio.create_task_group() as tg:
            for path, rate in self.rates.items():
                if rate > 0:
                    tg.start_soon(self._ticker, tg, path, rate, time.monotonic() + duration_s)

    async def _ticker(self, tg: anyio.abc.TaskGroup, path: str, rate: float, until: float) -> None:
        step, due = 1.0 / rate, time.monotonic()
        one = {
            "command": self._command,
            "run": self._run,
            "refund": self._refund,
            "hostile": self._hostile,
            "chat": self.chat.one,
        }[path]
        while (now := time.monotonic()) < until:
            if due > now:
                await anyio.sleep(due - now)
            due += step
            if self._in_flight >= MAX_IN_FLIGHT:
                self.ledger.shed += 1
                continue
            tg.start_soon(one)

    def _token(self, tenant: str, who: str = "", **extra: object) -> str:
        return self.stack.token(tenant, who or principal(tenant), ttl_s=3600, **extra)

    def _tenant(self) -> str:
        return self.rng.choice(TENANTS)

    async def _command(self) -> None:
        draw = self.rng.random()
        earlier = self._notes[self.rng.randrange(len(self._notes))] if self._notes else None
        request_id = f"cmd-{uuid.uuid4().hex}"
        if earlier is not None and draw < self.repeat_fraction:
            op = Op(
                "repeat",
                request_id,
                earlier.operation_key,
                earlier.request_id,
                earlier.arguments,
                tenant=earlier.tenant,
            )
        elif (
            draw < self.repeat_fraction + self.conflict_fraction
            and (earlier := self._answered(earlier)) is not None
        ):
            op = Op(
                "conflict",
                request_id,
                earlier.operation_key,
                earlier.request_id,
                {**earlier.arguments, "body": earlier.arguments["body"] + " (changed)"},
                tenant=earlier.tenant,
            )
        else:
            key = f"note-{uuid.uuid4().hex}"
            op = Op(
                "note",
                request_id,
                key,
                "",
                {"customer_id": "ACME-42", "body": f"Soak call note {key}."},
                tenant=self._tenant(),
            )
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
        command = SubmitCommand(
            request_id=op.request_id,
            token=self._token(op.tenant),
            agent=agent,
            operation_key=op.operation_key,
            action="payment.refund" if op.kind == "refund" else "crm.note.create",
            arguments=op.arguments,
        )
        await self._publish(
            self.ledger.add(op), subjects.command_request(op.tenant), self._encoder.encode(command)
        )

    async def _run(self) -> None:
        tenant = self._tenant()
        request_id = f"run-{uuid.uuid4().hex}"
        # Its own input (the request id in it): the model's request log names the run.
        request = RunRequest(
            request_id=request_id,
            token=self._token(tenant),
            agent=NOTE_AGENT,
            input=f"{DEMO_INPUT} (soak {request_id})",
        )
        await self._publish(
            self.ledger.add(Op("run", request_id, tenant=tenant)),
            subjects.request(tenant),
            self._encoder.encode(request),
        )

    async def _refund(self) -> None:
        assert self._payments is not None
        payment_id = f"pay_{uuid.uuid4().hex[:16]}"
        request_id = f"refund-{uuid.uuid4().hex}"
        op = Op(
            "refund",
            request_id,
            f"refund-{payment_id}",
            "",
            {"payment_id": payment_id, "line_id": "L2"},
            payment_id=payment_id,
            tenant=self._tenant(),
        )
        try:  # the provider's own record of the payment (its control API ignores fault modes)
            (
                await self._payments.post("/_control/payments", json=_payment(payment_id))
            ).raise_for_status()
        except httpx.HTTPError as exc:
            op.error = f"seeding the payment: {exc!r}"
            self.ledger.add(op)
            return
        await self._submit_command(op, REFUND_AGENT)

    async def _hostile(self) -> None:
        """A request no host may send: an unknown field, or bytes that are not JSON."""
        request_id = f"hostile-{uuid.uuid4().hex}"
        body = (
            b"\xff\xfe not json"
            if self.rng.random() < 0.5
            else self._encoder.encode(
                {
                    "type": "RunRequest",
                    "request_id": request_id,
                    "token": "x",
                    "agent": NOTE_AGENT,
                    "input": "hello",
                    "unexpected": True,
                }
            )
        )
        op = Op(
            "hostile", request_id, arguments={"json": body.startswith(b"{")}, tenant=self._tenant()
        )
        await self._publish(self.ledger.add(op), subjects.request(op.tenant), body)

    async def _publish(self, op: Op, subject: str, data: bytes) -> None:
        """Publish until JetStream acknowledges it (same message id: a retry is a duplicate)."""
        js = self._hosts[op.tenant].jetstream()
        op.sent_at = time.monotonic()
        self._in_flight += 1
        try:
            while time.monotonic() - op.sent_at < PUBLISH_GIVE_UP_S:
                try:
                    await js.publish(
                        subject, data, headers={"Nats-Msg-Id": op.request_id}, timeout=5
                    )
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
        """Read every result on each tenant's stream (a durable consumer of the soak's own, so
        nothing published while NATS restarts is missed) and approve what asks a person."""
        async with anyio.create_task_group() as tg:
            for tenant in TENANTS:
                tg.start_soon(self._collect_tenant, tenant)

    async def _collect_tenant(self, tenant: str) -> None:
        while True:
            try:
                await self._collect(tenant)
            except Exception as exc:  # NATS restarting: subscribe again
                if self.stopping.is_set():
                    return
                await anyio.sleep(1.0)
                del exc

    async def _collect(self, tenant: str) -> None:
        assert self._admin is not None
        js = self._admin.jetstream()
        stream = subjects.out_stream(tenant)
        config = ConsumerConfig(
            durable_name="soak",
            filter_subject=subjects.result(tenant),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=30,
        )
        await until_answered(lambda: js.add_consumer(stream, config), what="the soak's consumer")
        # Writ's own puller (libs/pull.py): nats-py's `fetch` can go on timing out after its
        # consumer's leader moved, and the soak would count results as missing that arrived.
        sub = Puller(self._admin, stream, "soak")
        await sub.start()
        try:
            unanswered = 0
            while not self.stopping.is_set():
                try:
                    msgs = await sub.fetch(256, timeout=1)
                except nats.errors.TimeoutError:
                    unanswered += 1
                    if unanswered >= 5:  # the requests go nowhere: subscribe again
                        raise
                    continue
                unanswered = 0
                for msg in msgs:
                    try:
                        result = self._decoder.decode(msg.data)
                    except msgspec.DecodeError:
                        result = None
                    if result is not None:
                        self._on_result(result)
                    await msg.ack()
        finally:
            with anyio.CancelScope(shield=True):
                await sub.stop()

    def _on_result(self, result: Any) -> None:
        self.ledger.results.setdefault(result.request_id, []).append(result)
        op = self.ledger.ops.get(result.request_id)
        if (
            isinstance(result, CommandResult)
            and result.status == "awaiting_human"
            and result.proposal is not None
            and op is not None
            and op.kind == "refund"
        ):
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
                await self._approve(proposal_id, self.ledger.ops[request_id].tenant)
            await anyio.sleep(0.5)

    async def _approve(self, proposal_id: str, tenant: str) -> None:
        request_id = f"approve-{uuid.uuid4().hex}"
        message = ApproveProposal(
            request_id=request_id,
            proposal_id=proposal_id,
            answer="approve",
            reason="soak: scripted approver",
            token=self._token(tenant, approver(tenant), roles=["approver"]),
        )
        await self._publish(
            self.ledger.add(Op("approval", request_id, tenant=tenant)),
            subjects.approval(tenant),
            self._encoder.encode(message),
        )
