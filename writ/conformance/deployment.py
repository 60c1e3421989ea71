"""The deployment the crash matrix runs on: Writ's six services, the fake CRM and the fake
payment provider, started locally with crash points armable from a file (libs/faults.py) and
short leases, so that a dispatcher killed at a boundary is taken over within seconds.

The dispatcher is killed from outside: armed with `hold:<point>`, it stops each command that
reaches the point there and names it in the faults file's `.reached` file; the kit waits until
the commands it sent are held (or no more come), then sends the process SIGKILL."""

from __future__ import annotations

import os
import signal
import time
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

from schemas import subjects
from schemas.host import ApprovalResult, ApproveProposal, CommandResult, SubmitCommand
from writ.conformance.target import Target
from writ.stack import Stack
from writ_client.credentials import HostCredentials

__all__ = ["LEASE_S", "TERMINAL", "Deployment", "NotReached", "kit_settings"]

LEASE_S: Final = 5.0  # longer than a hold gathers commands: none is taken over while held
HOLD_IDLE_S: Final = 1.0  # held commands are gathered until none came for this long
HOLD_MAX_S: Final = 2.5  # or for this long after the first, well within the lease
TERMINAL: Final = frozenset(
    {"succeeded", "failed", "unknown", "denied", "expired", "revision_required"}
)
TENANT: Final = "acme"
DISPATCHER: Final = "dispatcher"
_READ_LIMIT: Final = 100_000  # results read from the host's stream at most


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # dead, not yet reaped by its supervisor
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def _gone(pid: int, timeout: float) -> None:
    with anyio.fail_after(timeout):
        while True:
            if _dead(pid):
                return
            await anyio.sleep(0.05)


class NotReached(Exception):
    """The armed crash point was not reached in time (the matrix reports it, never hides it)."""


def kit_settings(faults: Path) -> dict[str, dict[str, str]]:
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
    """A local deployment under `home`, started by `start` and stopped by `stop`; or, given a
    `target`, a running one that `start` and `stop` only connect to and leave."""

    def __init__(self, home: Path, target: Target | None = None) -> None:
        self.target = target
        self.stack: Stack | None = None
        self.tenant = TENANT if target is None else target.tenant
        if target is None:
            self.faults = home / "faults"
            self.faults.write_text("")
            self.stack = Stack(
                home, database="conformance", durable_pg=False, extra_env=kit_settings(self.faults)
            )
        else:
            self.faults = target.faults_file
            self._host = HostCredentials.from_dir(target.host_credentials)
        self.nats_url = "" if target is None else target.nats_url
        self.crm_url = "" if target is None else target.crm_url
        self.payments_url = "" if target is None else target.payments_url
        self.nc: Client | None = None
        self.host: Client | None = None
        self.db: asyncpg.Connection | None = None
        self._results: dict[str, list[Any]] = {}

    @property
    def supervised(self) -> bool:
        """A running deployment's own supervisor restarts its dispatcher, not the kit."""
        return self.target is not None

    # -- life --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.stack is not None:
            await anyio.to_thread.run_sync(self.stack.start_all)
            self.nats_url = self.stack.nats_url
            self.crm_url, self.payments_url = self.stack.crm_url, self.stack.payments_url
            self.host = await self.stack.host_connection(self.tenant)
            self.db = await asyncpg.connect(self.stack.database_dsn)
        else:
            assert self.target is not None and self._host.nats is not None
            login = self._host.nats
            self.host = await nats.connect(
                login.url,
                max_reconnect_attempts=-1,
                user=login.user,
                password=login.password,
                user_credentials=str(login.creds) if login.creds else None,
                inbox_prefix=login.inbox_prefix or "_INBOX",
            )
            self.db = await asyncpg.connect(self.target.database_url)
        self.nc = await nats.connect(self.nats_url, max_reconnect_attempts=-1)
        sub = await self.nc.jetstream().subscribe(
            subjects.result(self.tenant),
            stream=subjects.out_stream(self.tenant),
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
        if self.stack is not None:
            await anyio.to_thread.run_sync(self.stack.stop)

    def token(self, principal: str, roles: tuple[str, ...] = ()) -> str:
        """A token as the tenant's host mints it."""
        if self.stack is None:
            return self._host.issuer.token(principal, roles=roles)
        return self.stack.token(self.tenant, principal, **({"roles": list(roles)} if roles else {}))

    # -- the providers' switches and ledgers --------------------------------------------------

    def crm(self) -> httpx.Client:
        return httpx.Client(base_url=self.crm_url, timeout=10)

    def payments(self) -> httpx.Client:
        return httpx.Client(base_url=self.payments_url, timeout=10)

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

    def calls(self, provider: str) -> list[dict[str, Any]]:
        """The provider's call log: each write and lookup under a key, and whether the write's
        answer left."""
        with self.crm() if provider == "crm" else self.payments() as client:
            log: list[dict[str, Any]] = client.get("/_control/log").raise_for_status().json()["log"]
            return log

    def control(self, provider: str, path: str, body: dict[str, Any]) -> None:
        with self.crm() if provider == "crm" else self.payments() as client:
            client.post(path, json=body).raise_for_status()

    # -- the dispatcher ----------------------------------------------------------------------

    @property
    def reached(self) -> Path:
        return self.faults.with_name(self.faults.name + ".reached")

    def arm(self, points: Iterable[str]) -> None:
        """Hold every command that reaches these points (libs/faults.py)."""
        self.reached.write_text("")
        self.faults.write_text("\n".join(f"hold:{p}" for p in points))

    def disarm(self) -> None:
        self.faults.write_text("")

    def _held(self, point: str) -> dict[str, int]:
        """Operation id -> the pid of the process holding it at `point`."""
        held = {}
        for line in self.reached.read_text().splitlines():
            pid, at, op = line.split()
            if at == point:
                held[op] = int(pid)
        return held

    async def kill_held(self, point: str, wanted: set[str], timeout: float) -> set[str]:
        """Wait until the dispatcher holds `wanted` at `point` (or no more come), then SIGKILL
        it from outside; the operations it held."""
        first = last = 0.0
        count = 0
        deadline = time.monotonic() + timeout
        while True:
            held = self._held(point)
            now = time.monotonic()
            if len(held) > count:
                count, last = len(held), now
                first = first or now
            if first and (
                wanted <= held.keys() or now - last >= HOLD_IDLE_S or now - first >= HOLD_MAX_S
            ):
                break
            if now > deadline:
                raise NotReached(f"no command reached {point} within {timeout:.0f} s")
            await anyio.sleep(0.05)
        [pid] = set(held.values()) if len(set(held.values())) == 1 else [0]
        if self.stack is None:  # a supervisor's child: gone once it no longer answers signal 0
            if not pid:
                raise RuntimeError(f"held by several processes: {sorted(set(held.values()))}")
            os.kill(pid, signal.SIGKILL)
            await _gone(pid, 30)
            return set(held)
        proc = self.stack.procs[DISPATCHER]
        if pid != proc.pid:
            raise RuntimeError(f"held by {sorted(set(held.values()))}, not by {proc.pid}")
        os.kill(proc.pid, signal.SIGKILL)
        status = await anyio.to_thread.run_sync(lambda: proc.wait(30))
        if status != -signal.SIGKILL:
            raise RuntimeError(f"the dispatcher exited {status}, not killed")
        del self.stack.procs[DISPATCHER]
        return set(held)

    def running(self) -> bool:
        """Whether the kit's own dispatcher runs (a supervised one is always taken to)."""
        return self.stack is None or self.stack.procs.get(DISPATCHER) is not None

    async def set_dispatcher_env(self, name: str, value: str | None) -> None:
        assert self.stack is not None
        env = self.stack.extra_env.setdefault(DISPATCHER, {})
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value

    async def stop_dispatcher(self) -> None:
        stack = self.stack
        assert stack is not None
        await anyio.to_thread.run_sync(lambda: stack.stop_process(DISPATCHER))

    async def start_dispatcher(self) -> None:
        """Start it and wait for its readiness."""
        stack = self.stack
        assert stack is not None
        await anyio.to_thread.run_sync(lambda: stack.start_instance(DISPATCHER, DISPATCHER))
        await stack.wait_ready((DISPATCHER,))

    # -- the host's side ---------------------------------------------------------------------

    def command(self, action: str, arguments: dict[str, Any]) -> SubmitCommand:
        return SubmitCommand(
            request_id=f"conf-{uuid.uuid4().hex[:16]}",
            token=self.token(f"alice@{self.tenant}.example"),
            agent="crm-assistant",
            operation_key=f"conf-{uuid.uuid4().hex[:16]}",
            action=action,
            arguments=arguments,
        )

    async def submit(self, command: SubmitCommand) -> None:
        assert self.host is not None
        await self.host.jetstream().publish(
            subjects.command_request(self.tenant),
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
            token=self.token(f"ops@{self.tenant}.example", ("approver",)),
            grant="once",
        )
        assert self.host is not None
        await self.host.jetstream().publish(
            subjects.approval(self.tenant),
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
                self.tenant,
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

    async def journaled(self, operation_ids: list[str]) -> dict[str, list[str]]:
        """The kinds of the dispatcher's journal entries about each command, in order (kind and
        subject are the clear columns of an entry: no data key is needed to read them)."""
        assert self.db is not None
        found: dict[str, list[str]] = {}
        for r in await self.db.fetch(
            "SELECT subject, kind FROM dispatcher.journal "
            "WHERE tenant = $1 AND subject = ANY($2::text[]) ORDER BY id",
            self.tenant,
            operation_ids,
        ):
            found.setdefault(r["subject"], []).append(r["kind"])
        return found

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
