"""On the three-node topology, under load: the administrator moves the commands stream's leader
(`$JS.API.STREAM.LEADER.STEPDOWN.WRIT_CMD`) and the leader of the dispatcher's consumer
(`$JS.API.CONSUMER.LEADER.STEPDOWN.WRIT_CMD.dispatcher`), then the NATS node the dispatcher is
connected to is killed (`kill -9`, back after a few seconds). Deliveries resume: every accepted
request ends within the bound after the last fault healed (60 s), and every other invariant of
the soak holds (nothing done twice, every success has its effect). The soak's machinery drives
it with this schedule instead of a seed's (soak/nemesis.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from soak.__main__ import run
from soak.nemesis import Fault
from soak.settings import SoakSettings

pytestmark = pytest.mark.e2e

FAULTS = [
    Fault(8.0, "stepdown", "WRIT_CMD"),
    Fault(15.0, "stepdown", "WRIT_CMD/dispatcher"),
    Fault(22.0, "node_kill", "dispatcher", hold_s=5.0),
]


@pytest.mark.timeout(900)
def test_deliveries_resume_after_the_leader_moves_and_the_dispatchers_node_dies(
    tmp_path: Path,
) -> None:
    settings = SoakSettings(
        duration_s=40,
        seed=0,
        topology="cluster",
        out=tmp_path / "soak.json",
        command_rate=8,
        run_rate=2,
        refund_rate=1,
        chat_rate=1,
        hostile_every_s=5,
        warmup_s=8,
        settle_s=120,
        bound_s=60,
        home=tmp_path / "home",
        durable_pg=False,
    )
    status, summary = run(settings, FAULTS)
    broken = [i for i in summary.get("invariants", []) if not i["held"]]
    assert status == 0, (summary.get("error"), broken, f"logs kept in {tmp_path / 'home'}")
    # Every fault was applied: each leader moved to another node, the node went down.
    applied = {f["target"] if f["kind"] == "stepdown" else f["kind"]: f for f in summary["faults"]}
    for leader in ("WRIT_CMD", "WRIT_CMD/dispatcher"):
        assert applied[leader]["ok"] and "->" in applied[leader]["note"], applied
    assert applied["node_kill"]["ok"] and applied["node_kill"]["note"].startswith("node writ-n")
    # Work accepted before, between and after the faults all ended, within the bound.
    assert summary["settle"]["seconds_since_healed"] <= settings.bound_s, summary["settle"]
    ended = {i["name"]: i for i in summary["invariants"]}["every_accepted_request_ended"]
    assert ended["held"] and ended["examined"] > 100, ended
    requests = summary["requests"]
    for kind in ("note", "run"):
        assert requests[kind]["accepted"] == requests[kind]["sent"] > 0, requests
    assert summary["outcomes"]["note"].get("succeeded", 0) > 0, summary["outcomes"]
