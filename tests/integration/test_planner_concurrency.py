"""One planner handles its runs' deliveries at once, through its real actor loop, on a real
nats-server and PostgreSQL, with governance's real budget endpoints.

A run's delivery spends most of its time waiting (for governance's budget replies, for the
model), holding one pooled connection and its run's row lock meanwhile. So one planner must
handle as many deliveries at once as it takes runs in flight, each on its own connection, or
runs queue behind each other with the machine idle. The model here answers only once
`CONCURRENCY` decisions are being asked for at the same time: if deliveries were handled one at
a time, or waited for a connection the pool does not have, the decisions would never overlap
and no run would end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import nats
import pytest
from prometheus_client import CollectorRegistry

from actions import ACTIONS
from libs.bus import publish
from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.embedded import EmbeddedNats
from libs.journal import DataKeys, Journal
from libs.provision import provision_bus
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.governance import RegisterRun, RunRegistered
from schemas.retrieval import EvidenceGathered
from services.governance.service import GovernanceService
from services.governance.store import GovernanceStore
from services.planner.agents import AgentRegistry, load_manifest
from services.planner.provider import (
    AnswerDirectly,
    CriticInput,
    CriticVerdict,
    ModelDecision,
    ModelInput,
    TextSink,
)
from services.planner.service import CONCURRENCY, PlannerService, pool_size
from services.planner.store import PlannerStore
from tests.integration.conftest import serve

pytestmark = pytest.mark.anyio

SERVICES = Path(__file__).resolve().parents[2] / "services"
ANSWER = AnswerDirectly(answer="Done.")


class Overlapping:
    """A model that answers only once `width` decisions are asked for at the same time."""

    def __init__(self, width: int) -> None:
        self.width, self.in_flight, self.peak = width, 0, 0
        self.overlapped = anyio.Event()

    async def decide(self, model_input: ModelInput) -> ModelDecision:
        return (await self.decide_with_usage(model_input))[0]

    async def decide_with_usage(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, int]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.in_flight >= self.width:
                self.overlapped.set()
            await self.overlapped.wait()
        finally:
            self.in_flight -= 1
        return ANSWER, 0

    async def verify(self, critic_input: CriticInput) -> tuple[CriticVerdict, int]:
        raise AssertionError("no critic here")


@pytest.fixture
async def planner_db(scratch_db: str) -> AsyncIterator[tuple[str, dict[str, str]]]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db,
        database,
        {
            name: load_migrations(name, SERVICES / name / "migrations")
            for name in ("planner", "governance")
        },
    )
    yield scratch_db, passwords


async def test_one_planner_handles_its_runs_deliveries_at_once(
    planner_db: tuple[str, dict[str, str]], private_nats: EmbeddedNats, unique: str
) -> None:
    dsn, passwords = planner_db
    database = dsn.rsplit("/", 1)[1]
    nc = await nats.connect(private_nats.url)
    js = nc.jetstream()
    await provision_bus(js, ["acme"])

    def role_dsn(name: str) -> str:
        return with_database(
            dsn, database, user=role_name(database, name), password=passwords[name]
        )

    # The planner's pool as its composition root sizes it for its concurrency.
    planner_pool = await connect_pool(role_dsn("planner"), max_size=pool_size(CONCURRENCY))
    governance_pool = await connect_pool(role_dsn("governance"))
    governance = GovernanceService(
        rt=Runtime(
            name="governance",
            nc=nc,
            js=js,
            registry=CollectorRegistry(),
            tracer_provider=make_tracer_provider("governance"),
        ),
        store=GovernanceStore(
            governance_pool,
            journal=Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("g1"))),
        ),
    )
    micro = await serve(nc, "governance", governance.endpoints(), unique)
    agents = AgentRegistry(
        [
            load_manifest(
                msgspec.json.encode(
                    {
                        "name": "note-assistant",
                        "version": "1.0.0",
                        "responsibility": "Record calls.",
                        "uses": [{"kind": "action", "name": "crm.note.create"}],
                    }
                )
            )
        ]
    )
    agents.resolve(actions=ACTIONS)
    model = Overlapping(CONCURRENCY)
    rt = Runtime(
        name="planner",
        nc=nc,
        js=js,
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("planner"),
    )
    svc = PlannerService(
        rt=rt, store=PlannerStore(planner_pool), provider=model, agents=agents, reserve_tokens=100
    )
    run_ids = [f"run-{unique}-{i}" for i in range(CONCURRENCY)]
    try:
        for run_id in run_ids:
            reply = await nc.request(
                subjects.REGISTER_RUN,
                msgspec.json.encode(
                    RegisterRun(
                        tenant="acme", run_id=run_id, principal="alice@acme", agent="note-assistant"
                    )
                ),
                timeout=5,
            )
            assert msgspec.json.decode(reply.data, type=RunRegistered).run_id == run_id
        async with anyio.create_task_group() as tg:
            await tg.start(svc.run)
            for run_id in run_ids:
                await publish(
                    js,
                    subjects.evidence("acme"),
                    EvidenceGathered(
                        run_id=run_id,
                        request_id=f"req-{run_id}",
                        tenant="acme",
                        principal="alice@acme",
                        agent="note-assistant",
                        input="Note that I called ACME back",
                        evidence=[],
                    ),
                    msg_id=run_id,
                )
            with anyio.fail_after(60):
                await model.overlapped.wait()
                while await planner_pool.fetchval(
                    "SELECT count(*) FROM planner.runs WHERE run_id = any($1) "
                    "AND status = 'succeeded'",
                    run_ids,
                ) < len(run_ids):
                    await anyio.sleep(0.05)
                # A run's lease is settled once its end is committed and its result is out.
                while await planner_pool.fetchval(
                    "SELECT count(*) FROM planner.reservations WHERE run_id = any($1) "
                    "AND state <> 'closed'",
                    run_ids,
                ):
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        assert model.peak == CONCURRENCY
        # Each run decided once, and every reservation it made is settled.
        assert (
            await planner_pool.fetchval(
                "SELECT count(*) FROM planner.steps WHERE run_id = any($1)", run_ids
            )
            == CONCURRENCY
        )
        assert (
            await governance_pool.fetchval(
                "SELECT count(*) FROM governance.reservations WHERE run_id = any($1) "
                "AND status <> 'settled'",
                run_ids,
            )
            == 0
        )
    finally:
        model.overlapped.set()
        await micro.stop()
        await planner_pool.close()
        await governance_pool.close()
        await nc.drain()
