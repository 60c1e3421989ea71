"""The crash matrix: for each connector contract kind and each boundary, K commands that reached
that boundary when their dispatcher was killed there from outside (or whose provider lost the
response), then every command's row in Writ's journal compared with the provider's own ledger:
its state and attempts, and the dispatcher's hash-chained journal entries about it.

A command counts toward K only on evidence taken at the kill, before any successor starts: the
dispatcher names it held at the point, its attempts in the journal and the provider's call log
show it where the boundary says (`at_boundary`). Rounds go on until K commands reached it."""

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
from writ.conformance.deployment import TERMINAL, Deployment, NotReached

__all__ = [
    "BOUNDARIES",
    "CONTRACTS",
    "Cell",
    "Contract",
    "Trial",
    "at_boundary",
    "journal_disagrees",
    "run_cell",
]

_CRASH_WAIT_S: Final = 90.0
_ROUNDS_PER_BATCH: Final = 4  # rounds at most per `batch` of K before a cell gives up
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

# Each boundary: the points the dispatcher is killed at, in order (the second by its successor).
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
    reached: bool = False  # the evidence at the kill shows it at the boundary
    evidence: str = ""  # what that evidence was (or what it lacked)
    listed: bool = False  # an unknown, found by `writ reconcile list`
    journal: str = ""  # how the dispatcher's journal entries disagree with the row, if they do


@dataclass
class Cell:
    """The figures of one contract at one boundary."""

    contract: str
    boundary: str
    k: int = 0  # commands wanted at the boundary
    trials: list[Trial] = field(default_factory=list)
    crashes: int = 0  # SIGKILLs sent
    rounds: int = 0
    not_reached: int = 0  # rounds in which no command reached the point

    def count(self, verdict: str) -> int:
        return sum(t.verdict == verdict for t in self.trials)

    @property
    def reached(self) -> int:
        """K as published: the commands the evidence shows at the boundary when killed."""
        return sum(t.reached for t in self.trials)

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


def journal_disagrees(state: str, attempts: int, kinds: list[str]) -> str:
    """How the dispatcher's journal entries about a command (their kinds, in order) disagree
    with its recorded state and attempts; empty when they agree.

    The dispatcher journals each attempt as it starts and each outcome once, in the statement
    that records it: a row the journal does not tell, or tells twice, is not evidence.
    """
    started = kinds.count("attempt.started")
    if started != attempts:
        return f"journal: {started} attempt(s) started, {attempts} recorded"
    outcomes = [k for k in kinds if k.startswith("command.") and k != "command.reconciled"]
    wanted = [f"command.{state}"] if state in TERMINAL else []
    if outcomes != wanted:
        return f"journal: {', '.join(outcomes) or 'no outcome'}; recorded {state}"
    return ""


def at_boundary(
    tenant: str,
    boundary: str,
    contract: Contract,
    op: str,
    held: set[str],
    tried: list[tuple[int, str | None]],
    calls: list[dict[str, Any]],
    state: str,
) -> tuple[bool, str]:
    """Whether the evidence taken at the kill shows `op` at `boundary`, and what it showed."""
    key = f"{tenant}:{op}"
    writes = [c for c in calls if c["key"] == key and c["kind"] == "write"]
    if boundary == "lost_response":
        lost = sum(not c["answered"] for c in writes)
        return lost > 0, f"{len(writes)} write(s) at the provider, {lost} answer(s) lost"
    if op not in held:
        return False, "not held at the point when killed"
    if not tried:
        return False, "held, but no attempt in the journal"
    last = tried[-1][1]
    seen = f"held; journal: {len(tried)} attempt(s), last {last or 'open'}; {len(writes)} write(s)"
    if boundary == "before_send":
        return last is None and not writes, seen
    if boundary == "after_commit":
        return last is None and bool(writes), seen
    if boundary == "before_ack":
        return last is not None, seen
    # reconciling: a successor settling an earlier attempt left open, the command not ended
    lookups = sum(c["key"] == key and c["kind"] == "lookup" for c in calls)
    seen += f", {lookups} lookup(s), {state}"
    open_earlier = any(result is None for _, result in tried)
    asked = lookups > 0 or not contract.queryable
    return open_earlier and asked and state not in TERMINAL, seen


async def _round(
    dep: Deployment, contract: Contract, boundary: str, first: int, size: int, cell: Cell
) -> None:
    points = BOUNDARIES[boundary]
    if dep.supervised:  # it runs on: its commands are held as they come
        dep.arm(points[:1])
    else:  # stopped while the round is submitted: it fetches the commands together
        await dep.stop_dispatcher()
        value = "true" if contract.queryable else None
        await dep.set_dispatcher_env("WRIT_PAYMENTS_QUERYABLE", value)
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
    ops = {r["operation_key"]: str(r["operation_id"]) for r in await dep.rows(keys)}

    evidence: dict[str, tuple[bool, str]] = {}
    if not points:
        dep.control(contract.provider, "/_control/mode", {"mode": "lose_response", "count": size})
    wanted = set(ops.values())
    try:
        for index, point in enumerate(points):
            if index or not dep.supervised:  # a supervised one's first was armed already
                dep.arm((point,))
            if not dep.running():
                await dep.start_dispatcher()
            held = await dep.kill_held(point, wanted, _CRASH_WAIT_S)
            cell.crashes += 1
            # The evidence, before any successor runs: the journal and the provider's calls.
            at_kill = await dep.attempts(list(ops.values()))
            calls = dep.calls(contract.provider)
            states = {str(r["operation_id"]): r["state"] for r in await dep.rows(keys)}
            evidence = {
                op: at_boundary(
                    dep.tenant,
                    boundary,
                    contract,
                    op,
                    held,
                    at_kill.get(op, []),
                    calls,
                    states.get(op, ""),
                )
                for op in ops.values()
            }
            wanted = {op for op in held if at_kill.get(op) and at_kill[op][-1][1] is None}
    except NotReached:
        cell.not_reached += 1
    finally:
        dep.disarm()
    if not dep.running():
        await dep.start_dispatcher()
    rows = {r["operation_key"]: r for r in await dep.settled(keys, _SETTLE_WAIT_S)}
    dep.control(contract.provider, "/_control/mode", {"mode": "normal"})
    if not points:  # the provider's own log says whose answer it lost
        calls = dep.calls(contract.provider)
        evidence = {
            op: at_boundary(dep.tenant, boundary, contract, op, set(), [], calls, "")
            for op in ops.values()
        }

    ledger = dep.ledger(contract.provider)
    ids = [str(r["operation_id"]) for r in rows.values()]
    attempts = await dep.attempts(ids)
    journaled = await dep.journaled(ids)
    for key in keys:
        row = rows.get(key)
        op = None if row is None else str(row["operation_id"])
        state = "missing" if row is None else row["state"]
        effects = ledger.get(f"{dep.tenant}:{op}", []) if op else []
        tried = attempts.get(op or "", [])
        reached, seen = evidence.get(ops.get(key, ""), (False, "no evidence taken"))
        verdict = _verdict(state, None if row is None else row["receipt"], effects)
        told = journal_disagrees(state, len(tried), journaled.get(op or "", []))
        if told and verdict in ("ok", "unknown"):
            verdict = "mismatch"
        cell.trials.append(
            Trial(
                contract=contract.name,
                boundary=boundary,
                operation_id=op,
                state=state,
                receipt=None if row is None else row["receipt"],
                effects=effects,
                attempts=tried,
                verdict=verdict,
                settled=_settlement(contract, state, None if row is None else row["reason"], tried),
                reached=reached,
                evidence=seen,
                journal=told,
            )
        )


def listed_unknown(dep: Deployment) -> set[str]:
    """The operation ids `writ reconcile list` prints, run as an operator would."""
    done = subprocess.run(
        [sys.executable, "-m", "writ.cli", "reconcile", "--nats-url", dep.nats_url, "list"],
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
            tenant=dep.tenant,
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
    # The operator's settlement is journaled too, once, beside the `unknown` it settled.
    journaled = await dep.journaled([t.operation_id for t in unknown if t.operation_id])
    for trial in unknown:
        settled = journaled.get(trial.operation_id or "", []).count("command.reconciled")
        if trial.settled.startswith("unknown, listed, reconciled") and settled != 1:
            trial.verdict = "mismatch"
            trial.journal = f"journal: {settled} reconciliation(s) of a settled unknown"


async def run_cell(
    dep: Deployment,
    contract: Contract,
    boundary: str,
    k: int,
    batch: int,
    progress: Callable[[str], None] = lambda _: None,
) -> Cell:
    """Rounds of up to `batch` commands at `boundary` until K of them reached it (or a cell
    gives up after a few rounds per batch, which the report says)."""
    cell = Cell(contract.name, boundary, k)
    limit = _ROUNDS_PER_BATCH * -(-k // batch) + 2
    while cell.reached < k and cell.rounds < limit:
        size = min(batch, k - cell.reached)
        await _round(dep, contract, boundary, len(cell.trials), size, cell)
        cell.rounds += 1
        progress(
            f"{contract.name}/{boundary}: {cell.reached}/{k} reached, "
            f"{len(cell.trials)} commands, {cell.rounds} round(s)"
        )
    await settle_unknowns(dep, cell)
    return cell
