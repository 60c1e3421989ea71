"""A short soak in the suite: the deployment `make soak` runs (two dispatchers, two
admissions, the supervisor, the planner asking the fake model), 60 s of open-loop load over
both demo tenants (host commands, runs, refunds, chat messages) under a fixed seed's nemesis —
NATS restarted twice, admission and then the second dispatcher frozen past the lease,
PostgreSQL killed, the payment provider losing its answers after the effect, the first
dispatcher killed — then every invariant the checker knows held (about two minutes in all).

The seed is fixed so the same faults come at the same times; what the load meets in between
varies with the machine, and the checker holds whatever it met to the same invariants.
`SOAK_S=600 make soak` runs the long one.

The cluster topology's short soak is `test_soak_cluster.py` (a file of its own, so the two run
on different workers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from soak.__main__ import run
from soak.settings import SoakSettings

pytestmark = pytest.mark.e2e

SEED = 102  # the faults above, every 6-10 s (`SOAK_SEED=102 SOAK_FAULT_EVERY=6-10` replays them)


@pytest.mark.timeout(900)
def test_a_short_soak_under_random_faults_keeps_every_invariant(tmp_path: Path) -> None:
    settings = SoakSettings(
        duration_s=60,
        seed=SEED,
        out=tmp_path / "soak.json",
        command_rate=8,
        run_rate=2,
        refund_rate=1,
        chat_rate=1,
        hostile_every_s=5,
        fault_every=(6, 10),
        warmup_s=8,
        settle_s=180,
        home=tmp_path / "home",
        durable_pg=False,
    )
    status, summary = run(settings)
    broken = [i for i in summary.get("invariants", []) if not i["held"]]
    assert status == 0, (summary.get("error"), broken, f"logs kept in {tmp_path / 'home'}")
    assert summary["held"] and not broken
    # The faults the seed schedules were injected, not skipped.
    assert summary["faults_injected"].keys() >= {
        "kill",
        "freeze",
        "postgres",
        "nats",
        "provider:lose_response",
    }, summary["faults"]
    assert summary["restarts_by_supervisor"] >= 1
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
