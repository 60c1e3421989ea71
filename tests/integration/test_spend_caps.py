"""Spend caps in governance's store against a real PostgreSQL, as governance's own role: 50
concurrent branches never settle more than the cap and one step's worst case, a tenant at its
cap never refuses another's steps, a replayed step is held and charged once, an agent's cap
covers its runs only, and each refusal is journaled naming the cap."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import msgspec
import nats
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry

from libs.db import connect_pool, load_migrations, provision, role_name, with_database
from libs.embedded import EmbeddedNats
from libs.journal import DataKeys, Journal
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from schemas.governance import BudgetRefused, BudgetReserved, RegisterRun
from services.governance.budgets import Limits
from services.governance.service import GovernanceService
from services.governance.spend import (
    ActionPrice,
    Cap,
    ModelPrice,
    PriceTable,
    money,
    sign_prices,
)
from services.governance.store import GovernanceStore

pytestmark = pytest.mark.anyio

MIGRATIONS = Path(__file__).resolve().parents[2] / "services" / "governance" / "migrations"
MODEL = "openai/gpt-test"
# 1.00 per million input tokens, 2.00 per million output tokens: a step reserving 10,000
# tokens may cost at most 0.02 (every token an output token).
WORST = money("0.02")


def _table(tenant: str, *caps: Cap) -> PriceTable:
    return PriceTable(
        tenant=tenant,
        version="v1",
        currency="EUR",
        time_zone="Europe/Paris",
        models={MODEL: ModelPrice(input_per_mtok="1.00", output_per_mtok="2.00")},
        caps=list(caps),
    )


class Env(msgspec.Struct, kw_only=True):
    store: GovernanceStore
    admin: asyncpg.Connection
    journal: Journal


@pytest.fixture
async def env(scratch_db: str) -> AsyncIterator[Env]:
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
    pool = await connect_pool(dsn, min_size=20, max_size=20)
    admin = await asyncpg.connect(scratch_db)
    journal = Journal(service="governance", keys=DataKeys.from_json(DataKeys.generate("d1")))
    yield Env(store=GovernanceStore(pool, journal=journal), admin=admin, journal=journal)
    await admin.close()
    await pool.close()


async def _run(store: GovernanceStore, tenant: str, run_id: str, agent: str = "billing") -> None:
    await store.register_run(
        RegisterRun(tenant=tenant, run_id=run_id, principal=f"alice@{tenant}", agent=agent),
        Limits(wall_time_s=600, max_concurrent_steps=64, provider_calls=1000, tokens=10**9),
    )


async def _call(
    store: GovernanceStore, tenant: str, run_id: str, step_key: str
) -> BudgetReserved | BudgetRefused:
    return await store.reserve(
        tenant=tenant,
        run_id=run_id,
        step_key=step_key,
        provider_calls=1,
        tokens=10_000,
        model=MODEL,
    )


async def _spent(env: Env, tenant: str) -> tuple[int, int]:
    row = await env.admin.fetchrow(
        "SELECT coalesce(sum(reserved_micros), 0) AS r, coalesce(sum(used_micros), 0) AS u "
        "FROM governance.spend WHERE tenant = $1",
        tenant,
    )
    return row["r"], row["u"]


async def test_fifty_concurrent_branches_settle_at_most_the_cap_plus_one_step(env: Env) -> None:
    cap = Cap(name="daily", window="day", limit="0.25")
    env.store.set_prices("acme", _table("acme", cap))
    # Twenty-five runs, two branches each (a run's branches share its budget row, so runs are
    # what contend on the cap): every branch reserves its worst case, calls, settles.
    for r in range(25):
        await _run(env.store, "acme", f"run-{r}")
    rng = random.Random(7)
    charged: list[int] = []
    refused: list[BudgetRefused] = []

    async def branch(i: int) -> None:
        run_id = f"run-{i % 25}"
        held = await _call(env.store, "acme", run_id, f"{run_id}:branch-{i}:model")
        if isinstance(held, BudgetRefused):
            refused.append(held)
            return
        # The fake model reports what it used: up to what was reserved, and most of it (so
        # twenty holds at once, one per connection, would settle above the cap).
        used_in, used_out = rng.randint(4_000, 5_000), rng.randint(4_000, 5_000)
        await anyio.sleep(rng.random() / 50)
        await env.store.settle(
            tenant="acme",
            run_id=run_id,
            reservation_id=held.reservation_id,
            provider_calls=1,
            tokens=used_in + used_out,
            input_tokens=used_in,
            output_tokens=used_out,
        )
        charged.append(-(-used_in * money("1.00") // 10**6) - (-used_out * money("2.00") // 10**6))

    # Today's row exists, and is held elsewhere while the branches start: they all read the
    # same room before any holds, so only the check made under the row's lock can stop them.
    warm = await _call(env.store, "acme", "run-0", "warm-up")
    assert isinstance(warm, BudgetReserved)
    await env.store.settle(
        tenant="acme", run_id="run-0", reservation_id=warm.reservation_id, release=True
    )
    tx = env.admin.transaction()
    await tx.start()
    await env.admin.execute("SELECT 1 FROM governance.spend FOR UPDATE")
    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(branch, i)
        await anyio.sleep(1.0)
        await tx.commit()
    reserved, used = await _spent(env, "acme")
    assert reserved == 0  # every hold returned
    assert used == sum(charged)  # charged what the model reported, each step once
    # Every step reported at most what it held, so not even one step's worst case over.
    assert used <= money(cap.limit)
    assert refused and all(r.budget == "spend" and r.cap == "daily" for r in refused)
    assert len(charged) + len(refused) == 50
    # Each refusal is journaled, naming the cap and its window.
    rows = await env.admin.fetch(
        "SELECT * FROM governance.journal WHERE kind = 'budget.exhausted' ORDER BY id"
    )
    assert len(rows) == len(refused)
    payload = msgspec.json.decode(env.journal.open(rows[0]))
    assert (payload["budget"], payload["cap"]) == ("spend", "daily")
    assert payload["worst_micros"] == WORST


async def test_one_tenant_at_its_cap_never_refuses_another(env: Env) -> None:
    env.store.set_prices("acme", _table("acme", Cap(name="daily", window="day", limit="0.02")))
    env.store.set_prices("globex", _table("globex", Cap(name="daily", window="day", limit="0.02")))
    await _run(env.store, "acme", "run-a")
    await _run(env.store, "globex", "run-b")
    assert isinstance(await _call(env.store, "acme", "run-a", "s1"), BudgetReserved)
    at_cap = await _call(env.store, "acme", "run-a", "s2")
    assert isinstance(at_cap, BudgetRefused) and at_cap.budget == "spend"
    # Same cap name, same window: globex's row is its own.
    assert isinstance(await _call(env.store, "globex", "run-b", "s1"), BudgetReserved)
    assert await _spent(env, "globex") == (WORST, 0)


async def test_a_replayed_step_is_held_and_charged_once(env: Env) -> None:
    env.store.set_prices("acme", _table("acme", Cap(name="monthly", window="month", limit="1")))
    await _run(env.store, "acme", "run-1")
    first = await _call(env.store, "acme", "run-1", "run-1:3:model")
    again = await _call(env.store, "acme", "run-1", "run-1:3:model")
    assert isinstance(first, BudgetReserved) and isinstance(again, BudgetReserved)
    assert again.reservation_id == first.reservation_id
    assert await _spent(env, "acme") == (WORST, 0)
    for _ in range(2):  # a redelivered settlement too
        await env.store.settle(
            tenant="acme",
            run_id="run-1",
            reservation_id=first.reservation_id,
            provider_calls=1,
            tokens=1_500,
            input_tokens=1_000,
            output_tokens=500,
        )
    # 1,000 x 1.00 + 500 x 2.00 per million: 0.002, once.
    assert await _spent(env, "acme") == (0, money("0.002"))
    kinds = await env.admin.fetch(
        "SELECT kind FROM governance.journal WHERE kind LIKE 'spend.%' ORDER BY id"
    )
    assert [k["kind"] for k in kinds] == ["spend.held", "spend.charged"]
    # Replayed after settlement, the step finds its closed reservation: nothing is held again.
    replay = await _call(env.store, "acme", "run-1", "run-1:3:model")
    assert isinstance(replay, BudgetReserved) and replay.status == "settled"
    assert await _spent(env, "acme") == (0, money("0.002"))


async def test_an_agents_cap_covers_its_runs_only(env: Env) -> None:
    env.store.set_prices(
        "acme",
        _table(
            "acme",
            Cap(name="billing-daily", window="day", limit="0.03", agent="billing"),
            Cap(name="tenant-daily", window="day", limit="0.05"),
        ),
    )
    await _run(env.store, "acme", "run-b", agent="billing")
    await _run(env.store, "acme", "run-s", agent="support")
    assert isinstance(await _call(env.store, "acme", "run-b", "s1"), BudgetReserved)
    billing = await _call(env.store, "acme", "run-b", "s2")
    assert isinstance(billing, BudgetRefused) and "'billing-daily'" in billing.reason
    assert isinstance(await _call(env.store, "acme", "run-s", "s1"), BudgetReserved)
    # The tenant's cap covers both: 0.04 held, 0.01 left, less than a step's worst case.
    tenant = await _call(env.store, "acme", "run-s", "s2")
    assert isinstance(tenant, BudgetRefused) and "'tenant-daily'" in tenant.reason
    spend = {(s["cap"], s["reserved_micros"]) for s in await env.store.spend("acme")}
    assert spend == {("billing-daily", WORST), ("tenant-daily", 2 * WORST)}


async def test_an_unpriced_step_and_a_tenant_without_caps_hold_nothing(env: Env) -> None:
    env.store.set_prices("acme", _table("acme", Cap(name="daily", window="day", limit="0.01")))
    await _run(env.store, "acme", "run-1")
    await _run(env.store, "globex", "run-1")
    # A model the table does not price costs nothing; nor does any step of a tenant without one.
    free = await env.store.reserve(
        tenant="acme",
        run_id="run-1",
        step_key="s1",
        provider_calls=1,
        tokens=10_000,
        model="other/model",
    )
    assert isinstance(free, BudgetReserved)
    assert isinstance(await _call(env.store, "globex", "run-1", "s1"), BudgetReserved)
    assert await env.admin.fetchval("SELECT count(*) FROM governance.spend_charges") == 0


async def test_steps_that_check_a_cap_at_once_queue_on_its_row(env: Env) -> None:
    # 0.05 fits two steps' worst cases (0.02 each), not three.
    env.store.set_prices("acme", _table("acme", Cap(name="daily", window="day", limit="0.05")))
    for r in range(10):
        await _run(env.store, "acme", f"run-{r}")
    first = await _call(env.store, "acme", "run-0", "warm-up")  # creates today's row
    assert isinstance(first, BudgetReserved)
    await env.store.settle(
        tenant="acme", run_id="run-0", reservation_id=first.reservation_id, release=True
    )
    answers: list[BudgetReserved | BudgetRefused] = []

    async def step(r: int) -> None:
        answers.append(await _call(env.store, "acme", f"run-{r}", "s1"))

    # Ten runs check the cap while its row is held elsewhere: once it is let go, each must see
    # what the previous one held, never all read the same total.
    tx = env.admin.transaction()
    await tx.start()
    await env.admin.execute("SELECT 1 FROM governance.spend FOR UPDATE")
    async with anyio.create_task_group() as tg:
        for r in range(10):
            tg.start_soon(step, r)
        await anyio.sleep(1.0)
        assert answers == []  # all waiting on the row
        await tx.commit()
    granted = [a for a in answers if isinstance(a, BudgetReserved)]
    assert len(granted) == 2
    assert await _spent(env, "acme") == (2 * WORST, 0)


async def test_governance_loads_signed_price_files_and_keeps_them_over_a_bad_one(
    env: Env, private_nats: EmbeddedNats, tmp_path: Path
) -> None:
    key = Ed25519PrivateKey.generate()
    nc = await nats.connect(private_nats.url)
    service = GovernanceService(
        rt=Runtime(
            name="governance",
            nc=nc,
            js=nc.jetstream(),
            registry=CollectorRegistry(),
            tracer_provider=make_tracer_provider("governance"),
        ),
        store=env.store,
        policy_dir=tmp_path,
        policy_keys={"ops-1": key.public_key()},
    )
    (tmp_path / "prices").mkdir()
    file = tmp_path / "prices" / "acme.json"
    tight = _table("acme", Cap(name="daily", window="day", limit="0.01"))
    file.write_bytes(sign_prices(tight, key, "ops-1"))
    service.load_prices()
    await _run(env.store, "acme", "run-1")
    refused = await _call(env.store, "acme", "run-1", "s1")
    assert isinstance(refused, BudgetRefused) and refused.cap == "daily"
    # A wider cap that does not verify changes nothing.
    wide = _table("acme", Cap(name="daily", window="day", limit="100"))
    forged = msgspec.json.decode(sign_prices(tight, key, "ops-1"))
    forged["prices"] = msgspec.to_builtins(wide)
    file.write_bytes(msgspec.json.encode(forged))
    service.load_prices()
    assert isinstance(await _call(env.store, "acme", "run-1", "s2"), BudgetRefused)
    # Signed, it holds from the next reload.
    file.write_bytes(sign_prices(wide, key, "ops-1") + b"\n")
    service.load_prices()
    assert isinstance(await _call(env.store, "acme", "run-1", "s3"), BudgetReserved)
    await nc.close()


async def test_spend_gauges_name_listed_tenants_and_sum_the_others(
    env: Env, private_nats: EmbeddedNats
) -> None:
    nc = await nats.connect(private_nats.url)
    registry = CollectorRegistry()
    service = GovernanceService(
        rt=Runtime(
            name="governance",
            nc=nc,
            js=nc.jetstream(),
            registry=registry,
            tracer_provider=make_tracer_provider("governance"),
        ),
        store=env.store,
        spend_label_tenants=["acme"],
    )
    for tenant in ("acme", "globex", "initech"):
        env.store.set_prices(tenant, _table(tenant, Cap(name="daily", window="day", limit="1")))
        await _run(env.store, tenant, f"run-{tenant}")
    held = await _call(env.store, "acme", "run-acme", "s1")  # held: 0.02 at worst
    for tenant in ("globex", "initech"):  # each settled: 1,000 input tokens at 1.00 a million
        done = await _call(env.store, tenant, f"run-{tenant}", "s1")
        assert isinstance(done, BudgetReserved)
        await env.store.settle(
            tenant=tenant,
            run_id=f"run-{tenant}",
            reservation_id=done.reservation_id,
            provider_calls=1,
            tokens=1_000,
            input_tokens=1_000,
            output_tokens=0,
        )
    assert isinstance(held, BudgetReserved)
    await service.refresh_spend()

    def gauge(name: str, tenant: str) -> float | None:
        return registry.get_sample_value(
            f"writ_governance_spend_{name}", {"cap": "daily", "tenant": tenant, "currency": "EUR"}
        )

    assert (gauge("settled", "acme"), gauge("held", "acme"), gauge("limit", "acme")) == (
        0.0,
        0.02,
        1.0,
    )
    # globex and initech are not listed: one series for both, never their names.
    assert (gauge("settled", ""), gauge("held", ""), gauge("limit", "")) == (0.002, 0.0, 2.0)
    assert gauge("settled", "globex") is None
    tenants = {
        s.labels["tenant"]
        for m in registry.collect()
        if m.name.startswith("writ_governance_spend_")
        for s in m.samples
        if "tenant" in s.labels
    }
    assert tenants == {"acme", ""}
    await nc.close()


async def test_an_amount_that_cannot_be_priced_is_refused_only_where_a_cap_covers_it(
    env: Env,
) -> None:
    table = msgspec.structs.replace(
        _table("acme", Cap(name="billing-daily", window="day", limit="100", agent="billing")),
        actions={"payment.charge.create": ActionPrice(per_call="0", amount_from_arguments=True)},
    )
    env.store.set_prices("acme", table)
    await _run(env.store, "acme", "run-b", agent="billing")
    await _run(env.store, "acme", "run-s", agent="support")

    async def charge(run_id: str, amount: str | None, currency: str | None) -> object:
        return await env.store.reserve(
            tenant="acme",
            run_id=run_id,
            step_key=f"{run_id}:{currency}:capability",
            capability_calls=1,
            action="payment.charge.create",
            amount=amount,
            currency=currency,
        )

    refused = await charge("run-b", "30.00", "USD")
    assert isinstance(refused, BudgetRefused) and refused.budget == "spend"
    assert refused.cap is None and "cannot be priced" in refused.reason
    assert isinstance(await charge("run-b", None, None), BudgetRefused)
    # No cap covers support's runs: nothing to price, nothing refused.
    assert isinstance(await charge("run-s", "30.00", "USD"), BudgetReserved)
    held = await charge("run-b", "30.00", "EUR")
    assert isinstance(held, BudgetReserved)
    assert await _spent(env, "acme") == (money("30.00"), 0)
