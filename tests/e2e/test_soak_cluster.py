"""A short soak of the production topology in the suite (docs/soak.md): three NATS nodes,
streams at three replicas, 120 s of load over both tenants under the cluster nemesis (node
faults one at a time, the commands stream's leader among them; service kills and freezes,
PostgreSQL, providers), with a seed drawn for each run and printed, then every invariant
checked, `every_accepted_request_ended` within 60 s of the last fault healed (about three
minutes in all)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from soak.__main__ import run
from soak.settings import SoakSettings

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1200)
def test_a_short_cluster_soak_under_a_fresh_seed_keeps_every_invariant(tmp_path: Path) -> None:
    """The production topology (three NATS nodes, streams at three replicas) under a seed drawn
    for this run: the seed is printed, and `SOAK_SEED=<seed> SOAK_TOPOLOGY=cluster
    SOAK_FAULT_EVERY=8-16 SOAK_S=120 make soak` replays its schedule. Every invariant holds, and
    every accepted request ended within the bound after the last fault healed."""
    seed = random.SystemRandom().randrange(1, 1_000_000)
    print(f"cluster soak seed {seed}", flush=True)
    settings = SoakSettings(
        duration_s=120,
        seed=seed,
        topology="cluster",
        out=tmp_path / "soak.json",
        command_rate=8,
        run_rate=2,
        refund_rate=1,
        chat_rate=1,
        hostile_every_s=5,
        fault_every=(8, 16),
        warmup_s=8,
        settle_s=120,
        bound_s=60,
        home=tmp_path / "home",
        durable_pg=False,
    )
    status, summary = run(settings)
    broken = [i for i in summary.get("invariants", []) if not i["held"]]
    assert status == 0, (seed, summary.get("error"), broken, f"logs in {tmp_path / 'home'}")
    assert summary["held"] and not broken, seed
    assert summary["settle"]["seconds_since_healed"] <= settings.bound_s, (seed, summary["settle"])
    assert {s["replicas"] for s in summary["streams"].values()} == {3}, summary["streams"]
    assert sum(summary["faults_injected"].values()) >= 5, (seed, summary["faults"])
    requests = summary["requests"]
    for kind in ("note", "run", "refund"):
        assert requests[kind]["accepted"] == requests[kind]["sent"] > 0, (seed, requests)
