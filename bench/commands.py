"""The command path: host commands fed to admission as ingress hands them on, to their
outcomes.

A host's `SubmitCommand` is verified by ingress and handed to admission as a `ProposeCommand`
under the host's `operation_key` and `request_id` (no run, no planner). The bench publishes that
`ProposeCommand` itself, exactly as ingress does (`services/ingress/service.py`, `_submit`):
Proposal (bench -> JetStream) -> admission (contract, `decide`, admit transaction) -> outbox
relay -> dispatcher (claim, re-check, no-op connector, finish) -> `CommandOutcome` on
`writ.int.outcomes.host.<tenant>`, which admission answers the host with (`CommandResult`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.measure import Awaiting, Measurement, percentile
from schemas import subjects
from schemas.admission import DispatchCommand
from schemas.dispatcher import CommandOutcome
from schemas.planner import ProposeCommand
from services.admission.logic import operation_id_for
from services.ingress.logic import command_run_id

__all__ = ["TENANT", "CommandPath"]

TENANT = "acme"
PRINCIPAL = "bench@acme.example"
AGENT = "crm-assistant"  # has a standing write_delete grant: decide allows on line 5
TIMEOUT_S = 60.0
# Where latency goes: (from, to) marks. Admission publishes `CommandAdmitted` and the relay,
# woken by NOTIFY at commit, publishes `DispatchCommand`: either may come first, so both are
# measured from the proposal being stored.
_SPANS = (
    ("published", "stored"),
    ("stored", "admitted"),
    ("stored", "relayed"),
    ("relayed", "outcome"),
)


class _AdmissionAnswer(msgspec.Struct):
    """`CommandAdmitted` (on `writ.int.admitted.<tenant>`), or a refusal (from a
    `CommandResult`)."""

    type: str
    run_id: str
    verdict: str = ""
    reason: str = ""


class _HostAnswer(msgspec.Struct):
    """A `CommandResult` (on `writ.out.results.<tenant>`): how a host learns its command was
    refused (no outcome follows), or what it became."""

    type: str
    request_id: str = ""
    status: str = ""


class CommandPath:
    """Publishes `writ.noop` proposals and waits for each one's `CommandOutcome`.

    A refused command never gets an outcome: its `CommandResult` ends the wait at once, so a
    deployment that refuses shows up as failures, not as minute-long timeouts.
    """

    def __init__(self, nc: Client) -> None:
        self._nc, self._js = nc, nc.jetstream()
        self._answers: Awaiting[CommandOutcome | _AdmissionAnswer] = Awaiting()
        self._encoder = msgspec.json.Encoder()
        self._outcome_decoder = msgspec.json.Decoder(CommandOutcome)
        self._admission_decoder = msgspec.json.Decoder(_AdmissionAnswer)
        self._host_decoder = msgspec.json.Decoder(_HostAnswer)
        self._relay_decoder = msgspec.json.Decoder(DispatchCommand)
        self._subs: list[Any] = []
        self._relay_sub: Any = None
        # Stage timestamps per run_id, only while tracing (it costs the bench CPU).
        self._stages: dict[str, dict[str, float]] | None = None
        self._run_of_operation: dict[str, str] = {}  # DispatchCommand names only the operation
        self.states: dict[str, int] = {}
        self.problem = ""  # the first reason a command did not succeed

    async def start(self) -> None:
        """Subscribe to outcomes and admission's answers (core subscriptions see JetStream
        publishes too)."""
        self._subs = [
            await self._nc.subscribe(subjects.outcome(TENANT, "host"), cb=self._on_outcome),
            await self._nc.subscribe(subjects.admitted(TENANT), cb=self._on_admission),
            await self._nc.subscribe(subjects.result(TENANT), cb=self._on_host_answer),
        ]

    async def trace_stages(self) -> None:
        """Also timestamp each command's admission and relay, to see where latency goes."""
        self._stages = {}
        self._relay_sub = await self._nc.subscribe(subjects.command(TENANT), cb=self._on_relay)

    async def untrace(self) -> None:
        """Stop timestamping stages."""
        if self._relay_sub is not None:
            await self._relay_sub.unsubscribe()
            self._relay_sub = None
        self._stages = None
        self._run_of_operation.clear()

    async def stop(self) -> None:
        """Unsubscribe from everything."""
        await self.untrace()
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []

    def _mark(self, run_id: str, stage: str) -> None:
        if self._stages is not None and run_id in self._stages:
            self._stages[run_id].setdefault(stage, time.monotonic())

    # Callbacks must not raise: nats-py would only print the error, and this bench must not
    # depend on every message on a subject being one it knows.
    async def _on_outcome(self, msg: Msg) -> None:
        try:
            outcome = self._outcome_decoder.decode(msg.data)
        except msgspec.DecodeError:
            return
        self._mark(outcome.run_id, "outcome")
        self._answers.resolve(outcome.run_id, outcome)

    async def _on_admission(self, msg: Msg) -> None:
        try:
            answer = self._admission_decoder.decode(msg.data)
        except msgspec.DecodeError:
            return
        if answer.type == "CommandAdmitted":
            self._mark(answer.run_id, "admitted")
        else:
            self._answers.resolve(answer.run_id, answer)

    async def _on_host_answer(self, msg: Msg) -> None:
        try:
            answer = self._host_decoder.decode(msg.data)
        except msgspec.DecodeError:
            return
        if answer.type != "CommandResult" or answer.status in (
            "succeeded",
            "pending",
            "dispatching",
        ):
            return  # the outcome itself ends the wait
        # The key is the request id (see `one`): refused, in conflict, or failed.
        self._answers.resolve(
            command_run_id(TENANT, answer.request_id),
            _AdmissionAnswer(
                type="CommandResult", run_id="", verdict=answer.status, reason=answer.status
            ),
        )

    async def _on_relay(self, msg: Msg) -> None:
        try:
            command = self._relay_decoder.decode(msg.data)
        except msgspec.DecodeError:
            return
        run_id = self._run_of_operation.pop(command.operation_id, None)
        if run_id is not None:
            self._mark(run_id, "relayed")

    async def one(self) -> bool:
        """One host command, from publishing its proposal to its recorded outcome."""
        key = str(uuid.uuid4())  # the host's operation key, and its request id
        run_id = command_run_id(TENANT, key)
        proposal = ProposeCommand(
            run_id=run_id,
            step=0,
            tenant=TENANT,
            principal=PRINCIPAL,
            agent=AGENT,
            action="writ.noop",
            arguments={"marker": key},
            operation_key=key,
            request_id=key,
        )
        self._answers.expect(run_id)
        if self._stages is not None:
            self._run_of_operation[operation_id_for(TENANT, run_id, 0, key)] = run_id
            self._stages[run_id] = {"published": time.monotonic()}
        try:
            await self._js.publish(
                subjects.proposal(TENANT),
                self._encoder.encode(proposal),
                headers={"Nats-Msg-Id": f"submitted:{TENANT}:{key}"},
                timeout=TIMEOUT_S,
            )
        except Exception as exc:
            # Not stored, so never admitted: a failed operation, not one to wait for.
            self._answers.discard(run_id)
            self._count("publish_failed", repr(exc))
            return False
        self._mark(run_id, "stored")
        answer = await self._answers.wait(run_id, TIMEOUT_S)
        if answer is None:
            self._count("timeout", f"no outcome within {TIMEOUT_S:.0f} s")
        elif isinstance(answer, _AdmissionAnswer):
            self._count(f"refused:{answer.verdict}", answer.reason)
        else:
            self._count(answer.state, answer.reason or "")
        return isinstance(answer, CommandOutcome) and answer.state == "succeeded"

    def _count(self, state: str, detail: str) -> None:
        self.states[state] = self.states.get(state, 0) + 1
        if state != "succeeded" and not self.problem:
            self.problem = f"{state}: {detail}"

    def stage_report(self, sample: Measurement) -> dict[str, dict[str, float]]:
        """p50/p99 ms of each stage, for commands published inside the sample's window."""
        if self._stages is None:
            return {}
        spans: dict[str, list[float]] = {}
        for marks in self._stages.values():
            if not sample.window_start <= marks["published"] <= sample.window_end:
                continue
            for first, second in _SPANS:
                if first in marks and second in marks:
                    spans.setdefault(f"{first}->{second}", []).append(marks[second] - marks[first])
        return {
            name: {
                "p50_ms": round(percentile(v, 50) * 1000, 2),
                "p99_ms": round(percentile(v, 99) * 1000, 2),
                "n": len(v),
            }
            for name, v in spans.items()
        }
