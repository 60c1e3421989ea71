"""libs/budget.py against governance's real endpoints on a real nats-server and PostgreSQL: the
planner's calls reserve, refuse with the budget that ran out, settle, and fail closed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from libs import budget
from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.journal import DataKeys, Journal
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas import subjects
from schemas.governance import RegisterRun, RunBudget, RunRegistered
from services.governance.budgets import BudgetDefaults, Limits
from services.governance.service import GovernanceService
from services.governance.store import GovernanceStore
from tests.integration.conftest import serve

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"
DEFAULTS = BudgetDefaults(
    default=Limits(provider_calls=5, tokens=1000), agents={"billing": RunBudget(capability_calls=2)}
)


class Env(msgspec.Struct, kw_only=True):
    nc: Client
    registry: CollectorRegistry
    pool: Any
    micro: Any


@pytest.fixture
def nc(private_nc: Client) -> Client:
    """This module's requests go to a nats-server of its own (see conftest.py)."""
    return private_nc


@pytest.fixture
async def env(scratch_db: str, nc: Client, unique: str) -> AsyncIterator[Env]:
    database = scratch_db.rsplit("/", 1)[1]
    passwords = await provision(
        scratch_db, database, {"governance": load_migrations("governance", MIGRATIONS)}
    )
    dsn = with_database(
        scratch_db,
        database,
        user=role_name(database, "governance"),
        password=passwords["governance"],
    )
    pool = await connect_pool(dsn)
    registry = CollectorRegistry()
    rt = Runtime(
        name="governance",
        nc=nc,
        js=nc.jetstream(),
        registry=registry,
        tracer_provider=make_tracer_provider("governance"),
    )
    journal = Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("d1")))
    svc = GovernanceService(
        rt=rt, store=GovernanceStore(pool, journal=journal), budget_defaults=DEFAULTS
    )
    # Only the endpoints: the budget calls need neither the inbox actor nor the sealer.
    micro = await serve(nc, "governance", svc.endpoints(), unique)
    yield Env(nc=nc, registry=registry, pool=pool, micro=micro)
    await micro.stop()
    await pool.close()


async def _register(
    nc: Client, run_id: str, agent: str = "billing", run_budget: RunBudget | None = None
) -> None:
    run = RegisterRun(
        tenant="acme", run_id=run_id, principal="alice@acme", agent=agent, budget=run_budget
    )
    reply = await nc.request(subjects.REGISTER_RUN, msgspec.json.encode(run), timeout=5)
    assert msgspec.json.decode(reply.data, type=RunRegistered).run_id == run_id


def _exhausted(registry: CollectorRegistry, kind: str) -> float:
    return (
        registry.get_sample_value("writ_governance_budget_exhausted_total", {"budget": kind}) or 0.0
    )


async def test_reserve_refuse_and_settle_over_the_bus(env: Env) -> None:
    await _register(env.nc, "run-1")  # no budget given: the agent's defaults over global
    held = [
        await budget.reserve(
            env.nc, tenant="acme", run_id="run-1", step_key=f"c{i}", capability_calls=1
        )
        for i in range(2)
    ]
    assert [h.status for h in held] == ["open", "open"]
    assert held[0].wall_time_left_s > 800
    with pytest.raises(budget.BudgetExhausted) as caught:
        await budget.reserve(
            env.nc, tenant="acme", run_id="run-1", step_key="c2", capability_calls=1
        )
    assert caught.value.kind == "capability_calls" and caught.value.step_key == "c2"
    assert _exhausted(env.registry, "capability_calls") == 1.0
    with pytest.raises(budget.BudgetExhausted) as caught:
        await budget.reserve(
            env.nc, tenant="acme", run_id="run-1", step_key="m0", provider_calls=1, tokens=1001
        )
    assert caught.value.kind == "tokens"

    settled = await budget.settle(
        env.nc,
        tenant="acme",
        run_id="run-1",
        reservation_id=held[0].reservation_id,
        capability_calls=1,
    )
    assert (settled.status, settled.capability_calls) == ("settled", 1)
    released = await budget.release(
        env.nc, tenant="acme", run_id="run-1", reservation_id=held[1].reservation_id
    )
    assert released.status == "released"
    again = await budget.reserve(
        env.nc, tenant="acme", run_id="run-1", step_key="c2", capability_calls=1
    )
    assert again.status == "open"
    # The same step key asked again: the same reservation.
    same = await budget.reserve(
        env.nc, tenant="acme", run_id="run-1", step_key="c2", capability_calls=1
    )
    assert same.reservation_id == again.reservation_id

    with pytest.raises(budget.NoSuchReservation):
        await budget.settle(
            env.nc,
            tenant="acme",
            run_id="run-1",
            reservation_id="00000000-0000-4000-8000-000000000000",
        )
    with pytest.raises(budget.NoBudget) as unknown:
        await budget.reserve(
            env.nc, tenant="acme", run_id="run-404", step_key="s", provider_calls=1
        )
    assert unknown.value.budget == "unknown_run"
    assert not isinstance(unknown.value, budget.BudgetExhausted)


async def test_the_run_sets_its_own_limits(env: Env) -> None:
    await _register(env.nc, "run-2", run_budget=RunBudget(max_concurrent_steps=1))
    await budget.reserve(env.nc, tenant="acme", run_id="run-2", step_key="a", provider_calls=1)
    with pytest.raises(budget.BudgetExhausted) as caught:
        await budget.reserve(env.nc, tenant="acme", run_id="run-2", step_key="b", provider_calls=1)
    assert caught.value.kind == "concurrent_steps"


async def test_governance_that_cannot_read_its_store_reserves_nothing(env: Env) -> None:
    await _register(env.nc, "run-3")
    await env.pool.close()
    with pytest.raises(budget.BudgetUnavailable):
        await budget.reserve(env.nc, tenant="acme", run_id="run-3", step_key="a", provider_calls=1)
    with pytest.raises(budget.BudgetUnavailable):
        await budget.settle(
            env.nc,
            tenant="acme",
            run_id="run-3",
            reservation_id="00000000-0000-4000-8000-000000000000",
        )
    await env.micro.stop()
    with pytest.raises(budget.BudgetUnavailable):  # nobody answers: not an allow either
        await budget.reserve(
            env.nc, tenant="acme", run_id="run-3", step_key="a", provider_calls=1, timeout=0.5
        )
