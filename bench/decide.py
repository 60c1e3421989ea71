"""Governance's `decide` request/reply, against a rule store holding many fine rules."""

from __future__ import annotations

import random
import time
import uuid
from typing import Final

import asyncpg
import msgspec
from nats.aio.client import Client

from actions import ACTIONS
from bench.measure import Measurement, Watcher, closed_loop
from schemas import subjects
from schemas.governance import DecideRequest, Decision
from services.governance.logic import Call, decide
from services.governance.store import GovernanceStore

__all__ = [
    "AGENT",
    "MANY_RULES_AGENT",
    "DecideLoad",
    "decide_logic",
    "seed_rules",
    "seed_rules_naming",
]

AGENT: Final = "crm-assistant"  # has a standing write_delete grant: allowed on line 5
MANY_RULES_AGENT: Final = "bench-many-rules"
PRINCIPAL: Final = "bench@acme.example"

# Tools other than the benchmark's: what a tenant with many integrations would have rules for.
_SYSTEMS = ("crm", "mail", "calendar", "billing", "tickets", "files", "chat", "hr", "erp", "wiki")
_OBJECTS = (
    "note",
    "contact",
    "deal",
    "invoice",
    "event",
    "message",
    "document",
    "task",
    "account",
    "order",
)
_VERBS = ("create", "update", "delete", "send", "read")


async def seed_rules(dsn: str, *, count: int, noop_share: float, seed: int = 7) -> dict[str, int]:
    """Insert `count` fine rules for tenant acme, none of which decides the bench's calls.

    A `noop_share` of them are `writ.noop` allow rules naming other agents: `decide`'s query
    finds them through the (tenant, tool) index and must filter each one out by agent. The rest
    name other tools (allow and deny, some for all agents, some with an argument prefix).
    Returns how many rules of each kind were inserted.
    """
    rng = random.Random(seed)
    tools = [f"{s}.{o}.{v}" for s in _SYSTEMS for o in _OBJECTS for v in _VERBS]
    noop = int(count * noop_share)
    records: list[tuple[str, str, str | None, str | None, str]] = []
    for i in range(noop):
        records.append(("acme", "writ.noop", None, f"agent-{i % 97}", "allow"))
    for i in range(count - noop):
        records.append(
            (
                "acme",
                rng.choice(tools),
                f"ACME-{rng.randrange(1000)}" if rng.random() < 0.3 else None,
                f"agent-{i % 97}" if rng.random() < 0.7 else None,
                "deny" if rng.random() < 0.2 else "allow",
            )
        )
    conn = await asyncpg.connect(dsn)
    try:
        await conn.copy_records_to_table(
            "rules",
            schema_name="governance",
            records=records,
            columns=["tenant", "tool", "arg_prefix", "agent", "effect"],
        )
        # What autovacuum would do within a minute of such an insert, done now: without
        # statistics the rules query's plan would be an accident of timing, and an autovacuum
        # of the new rows would land inside the measurement.
        await conn.execute("VACUUM ANALYZE governance.rules")
        total = await conn.fetchval("SELECT count(*) FROM governance.rules WHERE tenant = 'acme'")
    finally:
        await conn.close()
    return {
        "rules_total": int(total),
        "rules_writ_noop_other_agents": noop,
        "rules_other_tools": count - noop,
    }


async def seed_rules_naming(
    dsn: str, *, count: int, agent: str = MANY_RULES_AGENT
) -> dict[str, int]:
    """Insert `count` fine rules that all name `agent`'s `writ.noop` calls, with argument
    prefixes none of the bench's arguments (hex) starts with, and the standing grant that lets
    that agent's calls through on line 5 like crm-assistant's: a tenant with hundreds of
    prefix rules for one tool. Another agent, so the bus measurement is not changed by them."""
    kinds = ("INV-", "ACME-ORDER-", "T-")
    records = [
        ("acme", "writ.noop", f"{kinds[i % 3]}{i}-", agent, "deny" if i % 2 else "allow")
        for i in range(count)
    ]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.copy_records_to_table(
            "rules",
            schema_name="governance",
            records=records,
            columns=["tenant", "tool", "arg_prefix", "agent", "effect"],
        )
        await conn.execute(
            "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by) "
            "VALUES ('acme', $1, $2, 'bench') ON CONFLICT DO NOTHING",
            agent,
            ACTIONS["writ.noop"].family,
        )
        await conn.execute("VACUUM ANALYZE governance.rules")
    finally:
        await conn.close()
    return {"rules_naming_the_call": len(records)}


async def decide_logic(dsn: str, *, duration_s: float, agent: str = AGENT) -> dict[str, float]:
    """`decide` alone, in this process, timed over the facts governance's store returns for
    the bench's call (`GovernanceStore.facts`, read once from the seeded database): what the
    decision costs without the bus, the store or the journal. The facts are built, and their
    rule index with them, once: `index_ms` is what building that index cost."""
    contract = ACTIONS["writ.noop"]
    call = Call(
        tool="writ.noop",
        family=contract.family,
        connector=contract.connector,
        agent=agent,
        first_argument=uuid.uuid4().hex,
        scope=contract.scope,
        profile_fact=contract.profile_fact,
    )
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    try:
        facts = await GovernanceStore(pool).facts("acme", call, PRINCIPAL, str(uuid.uuid4()))
    finally:
        await pool.close()
    began = time.perf_counter()
    _ = facts.index
    index_ms = (time.perf_counter() - began) * 1000
    if (ruling := decide(call, facts)).verdict != "allow":
        raise RuntimeError(f"the bench's call is not allowed over its facts: {ruling}")
    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < duration_s:
        for _ in range(100):
            decide(call, facts)
        done += 100
    return {
        "per_s": round(done / elapsed, 1),
        "decisions": done,
        "seconds": round(elapsed, 2),
        "rules_in_facts": len(facts.rules),
        "index_ms": round(index_ms, 3),
    }


class DecideLoad:
    """Asks `decide` for the bench's call: `writ.noop` by crm-assistant (allowed on line 5)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Decision)
        self.verdicts: dict[str, int] = {}

    async def one(self) -> bool:
        """One request/reply; anything but the expected allow counts as a failure."""
        ask = DecideRequest(
            tenant="acme",
            principal=PRINCIPAL,
            agent=AGENT,
            run_id=str(uuid.uuid4()),
            tool="writ.noop",
            first_argument=uuid.uuid4().hex,
        )
        try:
            reply = await self._nc.request(subjects.DECIDE, self._encoder.encode(ask), timeout=30)
            decision = self._decoder.decode(reply.data)
        except Exception as exc:  # timeouts, no responders, a service error reply
            key = type(exc).__name__
            self.verdicts[key] = self.verdicts.get(key, 0) + 1
            return False
        key = f"{decision.verdict}/line{decision.line}"
        self.verdicts[key] = self.verdicts.get(key, 0) + 1
        return key == "allow/line5"

    async def measure(
        self,
        *,
        concurrency: int,
        warmup_s: float,
        duration_s: float,
        watcher: Watcher | None = None,
    ) -> Measurement:
        """Closed loop of `concurrency` outstanding requests."""
        return await closed_loop(
            self.one,
            concurrency=concurrency,
            warmup_s=warmup_s,
            duration_s=duration_s,
            watcher=watcher,
        )
