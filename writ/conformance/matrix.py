"""The crash matrix: for each connector contract kind and each boundary, K commands whose
dispatcher dies at that boundary (or whose provider loses the response), then every command's
row in Writ's journal compared with the provider's own ledger."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import msgspec

from libs.deadline import timed_request
from schemas import subjects
from schemas.dispatcher import Reconcile, Reconciled
from writ.conformance.deployment import TENANT, Deployment, NotReached

__all__ = ["BOUNDARIES", "CONTRACTS", "Cell", "Contract", "Trial", "run_cell"]

_CRASH_WAIT_S: Final = 90.0
_SETTLE_WAIT_S: Final = 180.0
_UUID: Final = re.compile(
    r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\s", re.M
)


@dataclass(frozen=True)
class Contract:
    """A connector contract kind and the fake provider that keeps it."""

    name: str
    provider: str  # "crm" | "payments"
    action: str
    approved: bool  # money moves: a person approves every command
    queryable: bool  # the provider can be asked for a key's effect

    def arguments(self, index: int) -> dict[str, Any]:
        if self.provider == "crm":
            return {"customer_id": "ACME-42", "body": f"Conformance trial {index}."}
        return {
            "customer_id": "ACME-42",
            "amount_cents": 100 + index,
            "currency": "EUR",
            "description": f"Conformance trial {index}",
        }


CONTRACTS: Final = {
    "idempotent": Contract("idempotent", "crm", "crm.note.create", False, False),
    "lookup": Contract("lookup", "payments", "payment.charge.create", True, True),
    "none": Contract("none", "payments", "payment.charge.create", True, False),
}

# Each boundary: the crash points armed, in order (the second is taken by the successor).
BOUNDARIES: Final[dict[str, tuple[str, ...]]] = {
    "before_send": ("dispatcher.before_send",),
    "after_commit": ("dispatcher.after_remote_write",),
    "before_ack": ("dispatcher.before_ack",),
    "reconciling": ("dispatcher.after_remote_write", "dispatcher.reconciling"),
    "lost_response": (),  # no crash: the provider acts and its response never arrives
}


@dataclass
class Trial:
    """One command: what Writ's journal says and what the provider's ledger holds."""

    contract: str
    boundary: str
    operation_id: str | None
    state: str
    receipt: str | None
    effects: list[str]
    attempts: list[tuple[int, str | None]]
    verdict: str  # ok | duplicate | lost | mismatch | unknown
    settled: str  # how its outcome was settled
    listed: bool = False  # an unknown, found by `writ reconcile list`


@dataclass
class Cell:
    """The figures of one contract at one boundary."""

    contract: str
    boundary: str
    trials: list[Trial] = field(default_factory=list)
    crashes: int = 0
    not_reached: int = 0

    def count(self, verdict: str) -> int:
        return sum(t.verdict == verdict for t in self.trials)

    @property
    def interrupted(self) -> int:
        """Commands whose journal shows the kill: an attempt cut short or a takeover."""
        return sum(
            any(result in (None, "lost") or epoch > 1 for epoch, result in t.attempts)
            for t in self.trials
        )

    def settlements(self) -> dict[str, int]:
        return dict(Counter(t.settled for t in self.trials))


def _settlement(contract: Contract, state: str, reason: str | None, attempts: list[Any]) -> str:
    if state == "unknown":
        return "unknown"
    if state != "succeeded":
        return state
    if reason == "found by key lookup":
        return "found by key lookup"
    if len(attempts) <= 1:
        return "one attempt"
    return "sent again under its key"


def _verdict(state: str, receipt: str | None, effects: list[str]) -> str:
    if len(effects) > 1:
        return "duplicate"
    if state == "unknown":
        return "unknown"
    if state == "succeeded":
        return (
            "ok" if effects and receipt == effects[0] else ("lost" if not effects else "mismatch")
        )
    if state in ("failed", "denied", "expired", "revision_required"):
        return "mismatch" if effects else "lost"  # trials ask for nothing a provider refuses
    return "lost"  # never reached an outcome


async def _round(
    dep: Deployment, contract: Contract, boundary: str, first: int, size: int, cell: Cell
) -> None:
    await dep.stop_dispatcher()
    await dep.set_dispatcher_env("WRIT_PAYMENTS_QUERYABLE", "true" if contract.queryable else None)
    if contract.provider == "payments":
        dep.control("payments", "/_control/queryable", {"queryable": contract.queryable})
    commands = [dep.command(contract.action, contract.arguments(first + i)) for i in range(size)]
    for command in commands:
        await dep.submit(command)
    if contract.approved:
        async with anyio.create_task_group() as tg:
            for command in commands:
                tg.start_soon(dep.approve, command)
    keys = [c.operation_key for c in commands]
    await dep.published(keys)

    points = BOUNDARIES[boundary]
    if points:
        dep.arm(points)
    else:
        dep.control(contract.provider, "/_control/mode", {"mode": "lose_response", "count": size})
    try:
        await dep.start_dispatcher(ready=not points)
        for index, _ in enumerate(points):
            await dep.crashed(_CRASH_WAIT_S)
            cell.crashes += 1
            await dep.start_dispatcher(ready=index == len(points) - 1)
    except NotReached:
        cell.not_reached += 1
    finally:
        dep.disarm()
    rows = {r["operation_key"]: r for r in await dep.settled(keys, _SETTLE_WAIT_S)}
    dep.control(contract.provider, "/_control/mode", {"mode": "normal"})

    ledger = dep.ledger(contract.provider)
    ids = [str(r["operation_id"]) for r in rows.values()]
    attempts = await dep.attempts(ids)
    for key in keys:
        row = rows.get(key)
        op = None if row is None else str(row["operation_id"])
        state = "missing" if row is None else row["state"]
        effects = ledger.get(f"{TENANT}:{op}", []) if op else []
        tried = attempts.get(op or "", [])
        cell.trials.append(
            Trial(
                contract=contract.name,
                boundary=boundary,
                operation_id=op,
                state=state,
                receipt=None if row is None else row["receipt"],
                effects=effects,
                attempts=tried,
                verdict=_verdict(state, None if row is None else row["receipt"], effects),
                settled=_settlement(contract, state, None if row is None else row["reason"], tried),
            )
        )


def listed_unknown(dep: Deployment) -> set[str]:
    """The operation ids `writ reconcile list` prints, run as an operator would."""
    done = subprocess.run(
        [sys.executable, "-m", "writ.cli", "reconcile", "--nats-url", dep.stack.nats_url, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(_UUID.findall(done.stdout))


async def settle_unknowns(dep: Deployment, cell: Cell) -> None:
    """Check each `unknown` is listed for an operator, then settle it as one would: with the
    provider's ledger as evidence (so the list stays short for the next cell)."""
    unknown = [t for t in cell.trials if t.verdict == "unknown"]
    if not unknown:
        return
    listed = await anyio.to_thread.run_sync(listed_unknown, dep)
    assert dep.nc is not None
    for trial in unknown:
        trial.listed = trial.operation_id in listed
        assert trial.operation_id is not None
        acted = len(trial.effects) == 1
        ask = Reconcile(
            tenant=TENANT,
            operation_id=trial.operation_id,
            state="succeeded" if acted else "failed",
            receipt=trial.effects[0] if acted else None,
            evidence=f"provider ledger: {len(trial.effects)} effect(s) under the key",
            resolved_by="conformance@writ",
        )
        reply = await timed_request(
            dep.nc, subjects.RECONCILE, msgspec.json.encode(ask), timeout=10
        )
        answer = msgspec.json.decode(reply.data, type=Reconciled)
        outcome = "succeeded" if acted else "failed"
        trial.settled = (
            f"unknown, listed, reconciled {outcome}" if answer.ok else "unknown, not reconciled"
        )


async def run_cell(
    dep: Deployment,
    contract: Contract,
    boundary: str,
    k: int,
    batch: int,
    progress: Callable[[str], None] = lambda _: None,
) -> Cell:
    """K trials of `contract` at `boundary`, in rounds of up to `batch` commands: the
    dispatcher fetches a round's commands together, so one kill interrupts the whole round."""
    cell = Cell(contract.name, boundary)
    done = 0
    while done < k:
        size = min(batch, k - done)
        await _round(dep, contract, boundary, done, size, cell)
        done += size
        progress(f"{contract.name}/{boundary}: {done}/{k}")
    await settle_unknowns(dep, cell)
    return cell
