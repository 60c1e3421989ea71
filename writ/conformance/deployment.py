"""The deployment the crash matrix runs on: Writ's six services, the fake CRM and the fake
payment provider, started locally with crash points armable from a file (libs/faults.py) and
short leases, so that a dispatcher killed at a boundary is taken over within seconds."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import anyio
import asyncpg
import httpx
import msgspec
import nats
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from libs.faults import CRASH_STATUS
from schemas import subjects
from schemas.host import ApprovalResult, ApproveProposal, CommandResult, SubmitCommand
from writ.stack import Stack

__all__ = ["LEASE_S", "TERMINAL", "Deployment", "NotReached"]

LEASE_S: Final = 3.0
TERMINAL: Final = frozenset(
    {"succeeded", "failed", "unknown", "denied", "expired", "revision_required"}
)
TENANT: Final = "acme"
DISPATCHER: Final = "dispatcher"
_READ_LIMIT: Final = 100_000  # results read from the host's stream at most


class NotReached(Exception):
    """The armed crash point was not reached in time (the matrix reports it, never hides it)."""


def _settings(faults: Path) -> dict[str, dict[str, str]]:
    return {
        "*": {"WRIT_FAULTS_FILE": str(faults), "WRIT_DRAIN_TIMEOUT_S": "2"},
        DISPATCHER: {
            "WRIT_LEASE_S": str(LEASE_S),
            "WRIT_SWEEP_EVERY_S": "1",
            "WRIT_PENDING_GRACE_S": "5",
            "WRIT_CALL_TIMEOUT_S": "1.5",
        },
    }


class Deployment:
    """A local deployment under `home`, started by `start` and stopped by `stop`."""

    def __init__(self, home: Path) -> None:
        self.faults = home / "faults"
        self.faults.write_text("")
        self.stack = Stack(
            home, database="conformance", durable_pg=False, extra_env=_settings(self.faults)
        )
        self.nc: Client | None = None
        self.host: Client | None = None
        self.db: asyncpg.Connection | None = None
        self._results: dict[str, list[Any]] = {}

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.stack.start_all)
        self.nc = await nats.connect(self.stack.nats_url, max_reconnect_attempts=-1)
        self.host = await self.stack.host_connection(TENANT)
        self.db = await asyncpg.connect(self.stack.database_dsn)
        sub = await self.nc.jetstream().subscribe(
            subjects.result(TENANT),
            stream=subjects.out_stream(TENANT),
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            cb=self._heard,
        )
        self._sub = sub

    async def _heard(self, msg: Any) -> None:
        try:
            result = msgspec.json.decode(msg.data, type=CommandResult | ApprovalResult)
        except msgspec.ValidationError:
            return  # another kind of result: not the kit's
        if len(self._results) < _READ_LIMIT:
            self._results.setdefault(result.request_id, []).append(result)

    async def stop(self) -> None:
        for closing in (self.db, self.host, self.nc):
            if closing is not None:
                await closing.close()
        await anyio.to_thread.run_sync(self.stack.stop)

    # -- the providers' switches and ledgers --------------------------------------------------

    def crm(self) -> httpx.Client:
        return httpx.Client(base_url=self.stack.crm_url, timeout=10)

    def payments(self) -> httpx.Client:
        return httpx.Client(base_url=self.stack.payments_url, timeout=10)

    def ledger(self, provider: str) -> dict[str, list[str]]:
        """The provider's own record: idempotency key -> the ids of the effects under it."""
        found: dict[str, list[str]] = {}
        if provider == "crm":
            with self.crm() as client:
                for note in client.get("/_control/notes").raise_for_status().json():
                    found.setdefault(note["idempotency_key"], []).append(note["note_id"])
        else:
            with self.payments() as client:
                for charge in client.get("/_control/charges").raise_for_status().json():
                    found.setdefault(charge["reference"], []).append(charge["charge_id"])
        return found

    def control(self, provider: str, path: str, body: dict[str, Any]) -> None:
        with self.crm() if provider == "crm" else self.payments() as client:
            client.post(path, json=body).raise_for_status()

    # -- the dispatcher ----------------------------------------------------------------------

    def arm(self, points: Iterable[str]) -> None:
        self.faults.write_text("\n".join(points))

    def disarm(self) -> None:
        self.faults.write_text("")

    async def set_dispatcher_env(self, name: str, value: str | None) -> None:
        env = self.stack.extra_env.setdefault(DISPATCHER, {})
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value

    async def stop_dispatcher(self) -> None:
        await anyio.to_thread.run_sync(lambda: self.stack.stop_process(DISPATCHER))

    async def start_dispatcher(self, *, ready: bool = True) -> None:
        """Start it; wait for its readiness unless it is expected to die first."""
        await anyio.to_thread.run_sync(lambda: self.stack.start_instance(DISPATCHER, DISPATCHER))
        if ready:
            await self.stack.wait_ready((DISPATCHER,))

    async def crashed(self, timeout: float) -> None:
        """Wait for the dispatcher to die at an armed point (status 137, the point taken)."""
        proc = self.stack.procs[DISPATCHER]
        for _ in range(int(timeout / 0.05)):
            if proc.poll() is not None:
                break
            await anyio.sleep(0.05)
        if proc.poll() is None:
            raise NotReached("the dispatcher did not reach the armed point")
        if proc.returncode != CRASH_STATUS:
            raise RuntimeError(f"the dispatcher exited {proc.returncode}, not at a crash point")
        del self.stack.procs[DISPATCHER]

    # -- the host's side ---------------------------------------------------------------------

    def command(self, action: str, arguments: dict[str, Any]) -> SubmitCommand:
        return SubmitCommand(
            request_id=f"conf-{uuid.uuid4().hex[:16]}",
            token=self.stack.token(TENANT, "alice@acme.example"),
            agent="crm-assistant",
            operation_key=f"conf-{uuid.uuid4().hex[:16]}",
            action=action,
            arguments=arguments,
        )

    async def submit(self, command: SubmitCommand) -> None:
        assert self.host is not None
        await self.host.jetstream().publish(
            subjects.command_request(TENANT),
            msgspec.json.encode(command),
            headers={"Nats-Msg-Id": command.request_id},
        )

    async def first(self, request_id: str, kind: type, timeout: float = 60) -> Any:
        with anyio.fail_after(timeout):
            while True:
                for result in self._results.get(request_id, []):
                    if isinstance(result, kind) and getattr(result, "status", "") not in (
                        "pending",
                        "dispatching",
                    ):
                        return result
                await anyio.sleep(0.05)

    async def approve(self, command: SubmitCommand) -> None:
        """A person (not the requester) approves what the command's proposal shows."""
        waiting = await self.first(command.request_id, CommandResult)
        if waiting.status != "awaiting_human" or waiting.proposal is None:
            raise RuntimeError(f"expected the charge to wait for a person: {waiting.status}")
        request_id = f"conf-approve-{uuid.uuid4().hex[:12]}"
        message = ApproveProposal(
            request_id=request_id,
            proposal_id=waiting.proposal.proposal_id,
            answer="approve",
            reason="conformance trial",
            token=self.stack.token(TENANT, "ops@acme.example", roles=["approver"]),
            grant="once",
        )
        assert self.host is not None
        await self.host.jetstream().publish(
            subjects.approval(TENANT),
            msgspec.json.encode(message),
            headers={"Nats-Msg-Id": request_id},
        )
        answered = await self.first(request_id, ApprovalResult)
        if answered.status != "claimed":
            raise RuntimeError(f"the approval was not claimed: {answered.status}")

    # -- Writ's journal ----------------------------------------------------------------------

    async def rows(self, operation_keys: list[str]) -> list[asyncpg.Record]:
        assert self.db is not None
        return list(
            await self.db.fetch(
                "SELECT operation_key, operation_id::text AS operation_id, state, receipt, reason "
                "FROM admission.commands WHERE tenant = $1 AND operation_key = ANY($2::text[])",
                TENANT,
                operation_keys,
            )
        )

    async def published(self, operation_keys: list[str], timeout: float = 120) -> None:
        """Wait until every command is admitted and its outbox row relayed to the stream."""
        assert self.db is not None
        with anyio.fail_after(timeout):
            while True:
                rows = await self.rows(operation_keys)
                if len(rows) == len(operation_keys) and not await self.db.fetchval(
                    "SELECT count(*) FROM admission.outbox WHERE operation_id = ANY($1::uuid[])",
                    [r["operation_id"] for r in rows],
                ):
                    return
                await anyio.sleep(0.1)

    async def settled(self, operation_keys: list[str], timeout: float) -> list[asyncpg.Record]:
        """The commands' rows once all are terminal, or as they are when `timeout` is up."""
        rows: list[asyncpg.Record] = []
        with anyio.move_on_after(timeout):
            while True:
                rows = await self.rows(operation_keys)
                if len(rows) == len(operation_keys) and all(r["state"] in TERMINAL for r in rows):
                    break
                await anyio.sleep(0.2)
        return rows

    async def attempts(self, operation_ids: list[str]) -> dict[str, list[tuple[int, str | None]]]:
        assert self.db is not None
        found: dict[str, list[tuple[int, str | None]]] = {}
        for r in await self.db.fetch(
            "SELECT operation_id::text AS operation_id, lease_epoch, result "
            "FROM dispatcher.attempts WHERE operation_id = ANY($1::uuid[]) ORDER BY attempt_id",
            operation_ids,
        ):
            found.setdefault(r["operation_id"], []).append((r["lease_epoch"], r["result"]))
        return found
