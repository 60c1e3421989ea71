"""One Writ deployment for the end-to-end tests: the six services as real processes."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import asyncpg
import httpx
import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from libs.natsauth import JOURNALED, SERVICE_SUBJECTS, seal_user
from schemas import subjects
from schemas.governance import Answer, RunBudget
from schemas.host import (
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    HumanDecision,
    ProposalVerdict,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from schemas.planner import ReplayReport, ReplayRun
from writ.stack import Stack

T = TypeVar("T")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def stack(admin_dsn: str) -> Iterator[Stack]:
    """The session's deployment; a module that needs its own (to break it) overrides this.

    It runs its own nats-server (unless `WRIT_TEST_NATS_URL` names one), with the
    deployment's users and permissions: every service connects as itself and every `Host`
    as its tenant's host, so the suite proves those permissions are enough.
    """
    with tempfile.TemporaryDirectory(prefix="writ-e2e-") as home:
        deployment = Stack(
            Path(home),
            nats_url=os.environ.get("WRIT_TEST_NATS_URL") or None,
            admin_dsn=admin_dsn,
            database=f"e2e_{uuid.uuid4().hex[:8]}",
        )
        try:
            deployment.start_all()
            yield deployment
            # Every service ran as itself all along: the server refused it nothing it needed.
            assert service_violations(deployment) == [], service_violations(deployment)
        finally:
            deployment.stop()


# The tenant test_bus_permissions.py's deliberate violations name: not a real tenant.
PROBE = "permission-probe"


def service_violations(stack: Stack, *, probes: bool = False) -> list[str]:
    """The permission violations the deployment's NATS server logged for Writ's services and
    their sealers (only the deliberate probes' if `probes`, none of them otherwise)."""
    log = stack.home / "nats" / "nats.log"
    if stack.embedded_nats is None or not log.exists():
        return []
    found = []
    users = (*SERVICE_SUBJECTS, *(seal_user(s) for s in JOURNALED))
    for line in log.read_text(errors="replace").splitlines():
        if "Violation" in line and any(f'/user:{name}"' in line for name in users):
            if (PROBE in line) == probes:
                found.append(line)
    return found


@pytest.fixture
async def db(stack: Stack) -> AsyncIterator[asyncpg.Connection]:
    """An administrator's connection to the deployment's database, to inspect state."""
    conn = await asyncpg.connect(stack.database_dsn)
    yield conn
    await conn.close()


@pytest.fixture
def payments(stack: Stack) -> Iterator[httpx.Client]:
    """The simulated payment provider's control API. The demo's payments (the scripted refund
    agent's `pay_7781`) are as new before each test, and the mode back to normal after."""
    with httpx.Client(base_url=stack.payments_url, timeout=5) as client:
        stack.seed_payments(client, reset=True)
        yield client
        client.post("/_control/mode", json={"mode": "normal"})


@pytest.fixture
def crm(stack: Stack) -> Iterator[httpx.Client]:
    """The simulated CRM's control API, back to normal mode after each test."""
    with httpx.Client(base_url=stack.crm_url, timeout=5) as client:
        yield client
        client.post("/_control/mode", json={"mode": "normal"})


class Host:
    """Plays a host system: signs, publishes requests, reads results from the stream.

    It publishes and reads as each tenant's host (`tenant_nc`), with that host's NATS
    permissions; `nc` (and `js`) is the administrator's connection, for what no host may do.
    """

    def __init__(self, stack: Stack, nc: Client) -> None:
        self.stack, self.nc, self.js = stack, nc, nc.jetstream()
        self._tenants: dict[str, Client] = {}
        self._opening = anyio.Lock()  # concurrent publishes open one connection, not several

    async def tenant_nc(self, tenant: str) -> Client:
        """The connection of `tenant`'s host (opened once)."""
        async with self._opening:
            if tenant not in self._tenants:
                self._tenants[tenant] = await self.stack.host_connection(tenant)
        return self._tenants[tenant]

    async def tenant_js(self, tenant: str) -> JetStreamContext:
        return (await self.tenant_nc(tenant)).jetstream()

    async def close(self) -> None:
        for client in self._tenants.values():
            await client.close()
        await self.nc.close()

    def request(
        self,
        *,
        tenant: str = "acme",
        principal: str = "alice@acme.example",
        agent: str = "crm-assistant",
        text: str = "Note the delayed shipment call",
        request_id: str | None = None,
        token: str | None = None,
        attended: bool = False,
        budget: RunBudget | None = None,
    ) -> RunRequest:
        return RunRequest(
            request_id=request_id or f"req-{uuid.uuid4().hex[:12]}",
            token=token or self.stack.token(tenant, principal),
            agent=agent,
            input=text,
            attended=attended,
            budget=budget,
        )

    async def publish(
        self, body: bytes | RunRequest, *, tenant: str = "acme", msg_id: str | None = None
    ) -> None:
        data = body if isinstance(body, bytes) else msgspec.json.encode(body)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        js = await self.tenant_js(tenant)
        await js.publish(subjects.request(tenant), data, headers=headers)

    def command(
        self,
        *,
        operation_key: str | None = None,
        action: str = "crm.note.create",
        arguments: dict[str, Any] | None = None,
        tenant: str = "acme",
        principal: str = "alice@acme.example",
        agent: str = "crm-assistant",
        expected_revision: str | None = None,
        request_id: str | None = None,
    ) -> SubmitCommand:
        return SubmitCommand(
            request_id=request_id or f"cmd-{uuid.uuid4().hex[:12]}",
            token=self.stack.token(tenant, principal),
            agent=agent,
            operation_key=operation_key or f"op-{uuid.uuid4().hex[:12]}",
            action=action,
            arguments=arguments
            if arguments is not None
            else {"customer_id": "ACME-42", "body": "Called back about order 7781."},
            expected_revision=expected_revision,
        )

    async def submit(self, command: SubmitCommand, *, tenant: str = "acme") -> None:
        js = await self.tenant_js(tenant)
        await js.publish(
            subjects.command_request(tenant),
            msgspec.json.encode(command),
            headers={"Nats-Msg-Id": command.request_id},
        )

    async def wait_command(
        self, request_id: str, *, tenant: str = "acme", final: bool = True, timeout: float = 30
    ) -> CommandResult:
        """The first result for this submission (the first terminal one if `final`)."""
        with anyio.fail_after(timeout):
            while True:
                for result in await self.results(request_id, tenant=tenant):
                    if isinstance(result, CommandResult) and (
                        not final or result.status not in ("pending", "dispatching")
                    ):
                        return result
                await anyio.sleep(0.1)

    async def results(self, request_id: str, *, tenant: str = "acme") -> list[Any]:
        """Every result on the host's stream for this request, read from the start (as the
        administrator: a host may not create consumers, whose configuration names where
        they deliver; it reads its results as they come, or its stream by sequence)."""
        found = []
        sub = await self.js.subscribe(
            subjects.result(tenant),
            stream=subjects.out_stream(tenant),
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    break  # nothing (more) for this tenant
                result = msgspec.json.decode(
                    msg.data,
                    type=RunResult | CommandResult | DecisionResult | ApprovalResult | ReviewResult,
                )
                if result.request_id == request_id:
                    found.append(result)
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return found

    async def approve(
        self,
        proposal_id: str,
        *,
        answer: ProposalVerdict = "approve",
        tenant: str = "acme",
        principal: str = "ops@acme.example",
        reason: str = "",
        token: str | None = None,
        request_id: str | None = None,
        grant: Literal["once", "always"] = "once",
    ) -> str:
        """Publish an `ApproveProposal` as an approver; returns its request id."""
        request_id = request_id or f"approve-{uuid.uuid4().hex[:12]}"
        message = ApproveProposal(
            request_id=request_id,
            proposal_id=proposal_id,
            answer=answer,
            reason=reason,
            token=token or self.stack.token(tenant, principal, roles=["approver"]),
            grant=grant,
        )
        js = await self.tenant_js(tenant)
        await js.publish(
            subjects.approval(tenant),
            msgspec.json.encode(message),
            headers={"Nats-Msg-Id": request_id},
        )
        return request_id

    async def first(
        self, request_id: str, kind: type[T], *, tenant: str = "acme", timeout: float = 30
    ) -> T:
        """The first result of type `kind` for this request."""
        with anyio.fail_after(timeout):
            while True:
                for result in await self.results(request_id, tenant=tenant):
                    if isinstance(result, kind):
                        return result
                await anyio.sleep(0.1)

    async def wait_approval(
        self, request_id: str, *, tenant: str = "acme", timeout: float = 30
    ) -> ApprovalResult:
        return await self.first(request_id, ApprovalResult, tenant=tenant, timeout=timeout)

    async def wait_result(
        self,
        request_id: str,
        *,
        tenant: str = "acme",
        timeout: float = 30,
        status: str | None = None,
    ) -> RunResult:
        """The run's first result (its first with `status`, if given)."""
        with anyio.fail_after(timeout):
            while True:
                found = [
                    r
                    for r in await self.results(request_id, tenant=tenant)
                    if isinstance(r, RunResult) and status in (None, r.status)
                ]
                if found:
                    return found[0]
                await anyio.sleep(0.1)

    async def decide(
        self,
        pending_id: str,
        answer: Answer = "once",
        *,
        tenant: str = "acme",
        principal: str = "ops@acme.example",
        reason: str = "",
        token: str | None = None,
        proposal_id: str | None = None,
    ) -> DecisionResult:
        """Answer a pending decision (`HumanDecision`; an approver of the tenant unless `token`
        says otherwise; one about a proposal names it) and wait for its `DecisionResult`."""
        request_id = f"decide-{uuid.uuid4().hex[:12]}"
        message = HumanDecision(
            request_id=request_id,
            pending_id=pending_id,
            answer=answer,
            reason=reason,
            token=token or self.stack.token(tenant, principal, roles=["approver"]),
            proposal_id=proposal_id,
        )
        js = await self.tenant_js(tenant)
        await js.publish(
            subjects.human_decision(tenant),
            msgspec.json.encode(message),
            headers={"Nats-Msg-Id": request_id},
        )
        return await self.first(request_id, DecisionResult, tenant=tenant)


@pytest.fixture
async def host(stack: Stack) -> AsyncIterator[Host]:
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=-1)
    host = Host(stack, nc)
    yield host
    await host.close()


@pytest.fixture
async def record(stack: Stack) -> AsyncIterator[JetStreamContext]:
    """The audit record's account, as its administrator (the record is not in Writ's)."""
    nc = await nats.connect(stack.record_nats_url, max_reconnect_attempts=-1)
    yield nc.jetstream()
    await nc.close()


async def sealed(db: asyncpg.Connection, run_id: str, timeout: float = 20) -> None:
    """Wait until the planner's sealer has chained every journal row of the run (a poll or
    two)."""
    with anyio.fail_after(timeout):
        while await db.fetchval(
            "SELECT count(*) FROM planner.journal j WHERE run_id = $1 AND NOT EXISTS "
            "(SELECT 1 FROM planner.journal_seals s WHERE s.entry_id = j.id)",
            run_id,
        ):
            await anyio.sleep(0.1)


async def replayed(
    host: Host, db: asyncpg.Connection, run_id: str, tenant: str = "acme"
) -> ReplayReport:
    """The planner's offline replay of the run (`writ.int.planner.replay`), once sealed."""
    await sealed(db, run_id)
    reply = await host.nc.request(
        subjects.REPLAY, msgspec.json.encode(ReplayRun(tenant=tenant, run_id=run_id)), timeout=10
    )
    return msgspec.json.decode(reply.data, type=ReplayReport)


def notes_for(crm: httpx.Client, key_prefix: str = "") -> list[dict[str, Any]]:
    notes = crm.get("/_control/notes").json()
    return [n for n in notes if n["idempotency_key"].startswith(key_prefix)]


def recorded_spans(stack: Stack) -> list[dict[str, Any]]:
    """Every span the deployment's processes exported to their JSON-lines files so far
    (`WRIT_OTEL_SPANS_FILE`)."""
    return [
        json.loads(line)
        for path in stack.home.glob("spans.*")
        for line in path.read_text().splitlines()
    ]


def _window_keys(stack: Stack, service: str) -> Any:
    from libs.journal import DataKeys, WindowKeys

    path = stack.home / "secrets" / f"journal-{service}-data.json"
    return WindowKeys(DataKeys.from_json(path.read_text()), schema=service)


async def run_input(db: asyncpg.Connection, stack: Stack, run_id: str) -> str | None:
    """A run's input as an administrator holding the planner's key file reads it: the row
    holds it sealed under the run's window key."""
    from libs.journal import Expired, refresh, unseal
    from services.planner.store._sql import SEALED_RUN, run_aad

    row = await db.fetchrow("SELECT input, sealed FROM planner.runs WHERE run_id = $1", run_id)
    if row is None:
        return None
    if row["sealed"] is None:
        return str(row["input"])
    keys = _window_keys(stack, "planner")
    await refresh(db, keys, [row["sealed"]])
    opened = unseal(keys, row["sealed"], run_aad(run_id))
    assert not isinstance(opened, Expired)
    return SEALED_RUN.decode(opened).input


async def proposals_of(db: asyncpg.Connection, stack: Stack, run_id: str) -> list[dict[str, Any]]:
    """A run's proposals (state, action, arguments, preview), oldest first, their sealed
    payloads opened with admission's key file."""
    from services.admission._sealed import open_payload

    rows = [
        dict(r)
        for r in await db.fetch(
            "SELECT tenant, proposal_id::text AS proposal_id, state, action, arguments, "
            "coalesce(preview, '{}'::jsonb) AS preview, facts, sealed FROM admission.proposals "
            "WHERE run_id = $1 ORDER BY created_at",
            run_id,
        )
    ]
    await open_payload(db, _window_keys(stack, "admission"), rows)
    for r in rows:
        r["arguments"], r["preview"] = json.loads(r["arguments"]), json.loads(r["preview"])
    return rows


async def run_evidence(db: asyncpg.Connection, stack: Stack, run_id: str) -> list[Any]:
    """A run's evidence as an administrator holding the planner's key file reads it."""
    from libs.journal import Expired, refresh, unseal
    from services.planner.store._sql import SEALED_RUN, run_aad

    row = await db.fetchrow("SELECT evidence, sealed FROM planner.runs WHERE run_id = $1", run_id)
    assert row is not None
    if row["sealed"] is None:
        return list(json.loads(row["evidence"]))
    keys = _window_keys(stack, "planner")
    await refresh(db, keys, [row["sealed"]])
    opened = unseal(keys, row["sealed"], run_aad(run_id))
    assert not isinstance(opened, Expired)
    return SEALED_RUN.decode(opened).evidence
