"""A short soak in the suite: the deployment `make soak` runs (two dispatchers, two
admissions, the supervisor, the planner asking the fake model), 60 s of open-loop load over
both demo tenants (host commands, runs, refunds, chat messages) under a nemesis whose seed is
drawn for each run — among the seeds whose schedule kills a service, freezes one past the
lease, restarts NATS, kills PostgreSQL and has a payment provider lose its answers after the
effect — then every invariant the checker knows held (about two minutes in all).

The seed is printed: `SOAK_SEED=<seed> SOAK_S=60 SOAK_FAULT_EVERY=6-10 make soak` replays its
faults. What the load meets in between varies with the machine, and the checker holds whatever
it met to the same invariants. `SOAK_S=600 make soak` runs the long one.

The cluster topology's short soak is `test_soak_cluster.py` (a file of its own, so the two run
on different workers).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from soak.__main__ import run
from soak.deploy import REPLICAS
from soak.nemesis import schedule
from soak.settings import SoakSettings
from writ.stack import SERVICES

pytestmark = pytest.mark.e2e

DURATION_S, EVERY, LEASE_S = 60.0, (6.0, 10.0), 4.0
KINDS = {"kill", "freeze", "postgres", "nats", "provider:lose_response"}


def _kinds(seed: int) -> set[str]:
    """The fault kinds a seed's schedule injects in the short soak (a provider's by its mode)."""
    faults = schedule(
        seed,
        duration_s=DURATION_S,
        every=EVERY,
        lease_s=LEASE_S,
        instances=sorted({**{name: name for name in SERVICES}, **REPLICAS}),
        cluster=False,
    )
    return {f"{f.kind}:{f.mode}" if f.kind == "provider" else f.kind for f in faults}


def drawn_seed() -> int:
    """A seed drawn for this run, the first from a random start whose schedule has every kind."""
    seed = random.SystemRandom().randrange(1, 1_000_000)
    while not _kinds(seed) >= KINDS:
        seed += 1
    return seed


def test_seeds_are_drawn_and_each_covers_every_fault_kind() -> None:
    seeds = {drawn_seed() for _ in range(5)}
    assert len(seeds) > 1
    assert all(_kinds(seed) >= KINDS for seed in seeds)
    assert not _kinds(1) >= KINDS or not _kinds(2) >= KINDS  # not every seed would do


@pytest.mark.timeout(900)
def test_a_short_soak_under_random_faults_keeps_every_invariant(tmp_path: Path) -> None:
    seed = drawn_seed()
    print(f"soak seed {seed}", flush=True)
    settings = SoakSettings(
        duration_s=DURATION_S,
        seed=seed,
        out=tmp_path / "soak.json",
        command_rate=8,
        run_rate=2,
        refund_rate=1,
        chat_rate=1,
        hostile_every_s=5,
        fault_every=EVERY,
        lease_s=LEASE_S,
        warmup_s=8,
        settle_s=180,
        home=tmp_path / "home",
        durable_pg=False,
    )
    status, summary = run(settings)
    broken = [i for i in summary.get("invariants", []) if not i["held"]]
    assert status == 0, (seed, summary.get("error"), broken, f"logs in {tmp_path / 'home'}")
    assert summary["held"] and not broken, seed
    # The faults the seed schedules were injected, not skipped.
    assert summary["faults_injected"].keys() >= {
        "kill",
        "freeze",
        "postgres",
        "nats",
        "provider:lose_response",
    }, (seed, summary["faults"])
    assert summary["restarts_by_supervisor"] >= 1, seed
    # The load went through every path while they were (nothing refused at the door).
    requests = summary["requests"]
    for kind in ("note", "repeat", "conflict", "refund", "run", "hostile"):
        assert requests[kind]["accepted"] == requests[kind]["sent"] > 0, requests
    assert summary["outcomes"]["conflict"] == {"conflict": requests["conflict"]["sent"]}
    # Chat messages started turns; the ones that found their session busy changed nothing.
    assert requests["chat"]["accepted"] > 10 and summary["chat_sessions"] >= 2, requests
    assert (
        requests["chat"]["accepted"] + requests["chat"].get("busy", 0) == requests["chat"]["sent"]
    ), requests
    # Both tenants on every path.
    for tenant in ("acme", "globex"):
        assert summary["requests_by_tenant"][tenant].keys() >= {"note", "run", "refund", "chat"}, (
            summary["requests_by_tenant"]
        )
    checked = {i["name"]: i["examined"] for i in summary["invariants"]}
    assert checked["every_accepted_request_ended"] > 300
    assert checked["no_refund_twice"] > 0
    # Decisions checked against the fake model's request log: the runs', the turns'.
    assert (
        checked["no_run_asked_the_model_again_for_a_recorded_step"] > requests["run"]["accepted"]
    ), checked
    assert checked["session_events_numbered_without_gaps"] == summary["chat_sessions"]
