"""The soak's settings, from SOAK_* environment variables (`make soak` passes them through)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SoakSettings"]

# Under what the deployment drains on a 2-core machine (docs/soak.md, "Capacity"): the cluster
# topology, its three NATS nodes and eight services sharing the two cores, drained a backlog at
# 20 to 46 requests a second; the defaults offer about 12 (8 host commands, 2 runs, a refund
# and a chat message a second), so what a fault held up is caught up within the bound. The
# command path alone did 544 commands a second (`make bench`); a rate above capacity measures
# the machine, not the bound. Refunds wait for a person, so they have no bench figure: one a
# second.
COMMAND_RATE = 8.0
RUN_RATE = 2.0
REFUND_RATE = 1.0
# Chat messages start turns of the planner (one model call and one note each, or a reply):
# no bench figure either; one a second, over a few sessions per tenant, so some find their
# session busy.
CHAT_RATE = 1.0


def _float(name: str, default: float) -> float:
    value = os.environ.get(name, "")
    return float(value) if value else default


@dataclass(frozen=True)
class SoakSettings:
    """How long, how hard, which faults and where to write the summary."""

    duration_s: float = 600.0
    seed: int = field(default_factory=lambda: int(time.time()))
    topology: str = "single"  # or "cluster": three nats-server nodes, streams at 3 replicas
    out: Path = Path("soak-results.json")
    command_rate: float = COMMAND_RATE  # host commands a second (new, repeated, conflicting)
    run_rate: float = RUN_RATE  # runs a second that write a CRM note
    refund_rate: float = REFUND_RATE  # refund commands a second, approved by the approver
    chat_rate: float = CHAT_RATE  # chat messages a second (each a turn, or SESSION_BUSY)
    repeat_fraction: float = 0.1  # of host commands: an earlier key sent again, unchanged
    conflict_fraction: float = 0.05  # of host commands: an earlier key with other arguments
    hostile_every_s: float = 10.0  # one input invalid by construction this often
    fault_every: tuple[float, float] = (20.0, 60.0)  # seconds between two faults
    warmup_s: float = 20.0  # load before the resource baseline is taken
    settle_s: float = 240.0  # how long to wait for what is in flight after the load
    # The bound: every accepted request ended this long after the last fault healed (the
    # invariant `every_accepted_request_ended` holds only within it).
    bound_s: float = 60.0
    lease_s: float = 4.0  # the dispatcher's lease: a SIGSTOP lasts longer than this
    home: Path | None = None  # default: a fresh temporary folder
    keep: bool = False  # keep the deployment folder even when every invariant held
    durable_pg: bool = True  # fsync on; the short soak in `make test` trades it for speed

    @classmethod
    def from_env(cls) -> SoakSettings:
        """Read SOAK_S, SOAK_SEED, SOAK_TOPOLOGY, SOAK_OUT, SOAK_BOUND_S and the rate settings
        (SOAK_*_RATE)."""
        env = os.environ
        topology = env.get("SOAK_TOPOLOGY", "") or "single"
        if topology not in ("single", "cluster"):
            raise SystemExit(f"SOAK_TOPOLOGY must be single or cluster, not {topology!r}")
        every = env.get("SOAK_FAULT_EVERY", "")
        low, high = (float(x) for x in every.split("-")) if every else (20.0, 60.0)
        seed = env.get("SOAK_SEED", "")
        home = env.get("SOAK_HOME", "")
        return cls(
            duration_s=_float("SOAK_S", 600.0),
            seed=int(seed) if seed else int(time.time()),
            topology=topology,
            out=Path(env.get("SOAK_OUT", "") or "soak-results.json"),
            command_rate=_float("SOAK_COMMAND_RATE", COMMAND_RATE),
            run_rate=_float("SOAK_RUN_RATE", RUN_RATE),
            refund_rate=_float("SOAK_REFUND_RATE", REFUND_RATE),
            chat_rate=_float("SOAK_CHAT_RATE", CHAT_RATE),
            repeat_fraction=_float("SOAK_REPEAT_FRACTION", 0.1),
            conflict_fraction=_float("SOAK_CONFLICT_FRACTION", 0.05),
            hostile_every_s=_float("SOAK_HOSTILE_EVERY_S", 10.0),
            fault_every=(low, high),
            warmup_s=_float("SOAK_WARMUP_S", 20.0),
            settle_s=_float("SOAK_SETTLE_S", 240.0),
            bound_s=_float("SOAK_BOUND_S", 60.0),
            lease_s=_float("SOAK_LEASE_S", 4.0),
            home=Path(home) if home else None,
            keep=env.get("SOAK_KEEP", "") == "1",
            durable_pg=env.get("SOAK_DURABLE_PG", "1") != "0",
        )
