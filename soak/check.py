"""The checker: after the load stopped and everything settled, it reads the fakes' own records,
the registry (Postgres, as the administrator) and the journal, and checks the invariants
(docs/design.md §3) over every accepted submission. Each check says whether it held, how many it
examined, and its first examples when it did not."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any, Final

import asyncpg
import httpx

from schemas import subjects
from schemas.host import ApprovalResult, CommandResult, RunResult
from soak.check_chat import chat_checks, chat_in_flight
from soak.check_model import model_asks
from soak.deploy import TENANTS, Deployment, admin_connect
from soak.invariant import EXAMPLES, Check
from soak.ledger import Ledger, Op
from soak.observe import within
from writ.stack import Stack

__all__ = ["Check", "check", "settled", "stream_replicas"]

_COMMANDS: Final = ("note", "repeat", "conflict", "refund")
# The decisions `crm-assistant`'s script makes in a run (writ/demo/decisions.json): one
# capability, one answer. A run that recorded more asked its provider again.
NOTE_RUN_DECISIONS: Final = 2


def _checked(ledger: Ledger) -> list[Op]:
    return [op for op in ledger.accepted() if op.kind in (*_COMMANDS, "run")]


def _has_outcome(ledger: Ledger, op: Op) -> bool:
    # A submission of a key that is answered once, with the state then recorded, is a replay;
    # the submission that recorded the key carries the outcome. That is the first one sent,
    # unless a repeat overtook it: with two admissions, one frozen with the first, the other
    # takes the repeat first. So a note or a repeat has its outcome when it was answered and
    # one submission of its key got the outcome.
    if op.kind in ("note", "repeat") and op.operation_key:
        return bool(ledger.results.get(op.request_id)) and any(
            ledger.final(other.request_id) is not None
            for other in ledger.keyed.get(op.operation_key, [op])
        )
    return ledger.final(op.request_id) is not None


async def settled(ledger: Ledger, db: asyncpg.Connection) -> dict[str, int]:
    """What is still in flight: submissions without an outcome, commands, runs and chat turns
    not ended."""
    waiting = sum(not _has_outcome(ledger, op) for op in _checked(ledger))
    commands = await db.fetchval(
        "SELECT count(*) FROM admission.commands WHERE state IN ('pending', 'dispatching')"
    )
    runs = await db.fetchval(
        "SELECT count(*) FROM planner.runs WHERE status IN ('queued', 'running')"
    )
    return {
        "without_outcome": waiting,
        "commands_in_flight": commands,
        "runs_in_flight": runs,
        **await chat_in_flight(db),
    }


async def check(
    deployment: Deployment,
    ledger: Ledger,
    *,
    faults: dict[str, int],
    baseline: dict[str, Any],
    end: dict[str, Any],
    instances: dict[str, str],
) -> list[Check]:
    """Every invariant over the settled deployment, over both tenants."""
    stack = deployment.stack
    tenants = list(TENANTS)
    db = await asyncpg.connect(stack.database_dsn)
    try:
        commands = {
            r["operation_key"] or str(r["operation_id"]): dict(r)
            for r in await db.fetch(
                "SELECT tenant, operation_id::text, operation_key, request_id, action, state, "
                "receipt, reason, arguments, run_id FROM admission.commands "
                "WHERE tenant = ANY($1)",
                tenants,
            )
        }
        runs = {
            (r["tenant"], r["request_id"]): dict(r)
            for r in await db.fetch(
                "SELECT r.tenant, r.request_id, r.run_id, r.status, "
                "(SELECT count(*) FROM planner.steps s WHERE s.run_id = r.run_id "
                " AND s.kind = 'decision') AS decisions, "
                "(SELECT count(*) FROM admission.proposals p WHERE p.run_id = r.run_id) "
                " AS proposals FROM planner.runs r WHERE r.tenant = ANY($1)",
                tenants,
            )
        }
        waiting = await db.fetchval(
            "SELECT count(*) FROM admission.proposals WHERE tenant = ANY($1) "
            "AND state = 'pending' AND agent = 'refund-assistant'",
            tenants,
        )
        async with httpx.AsyncClient(timeout=30) as client:
            notes = (await client.get(f"{stack.crm_url}/_control/notes")).json()
            refunds = (await client.get(f"{stack.payments_url}/_control/refunds")).json()
        in_flight = await settled(ledger, db)
        chat = await chat_checks(stack, ledger, db, commands, notes)
        model = await model_asks(db, await _model_log(deployment), stack.home / "secrets")
    finally:
        await db.close()
    ops = _checked(ledger)
    out = [
        _outcomes(ledger, ops, in_flight, waiting),
        *_effects(commands, notes, refunds),
        _unknown(stack, commands, faults),
        _keys(ledger, commands),
        _replanning(ledger, runs),
        model,
        *chat,
        _tenants(ledger, commands, runs),
        _audit(stack),
        await _dead_letters(stack, ledger),
    ]
    resources = Check("resources_bounded", examined=len(baseline["processes"]))
    for problem in within(baseline, end, instances):
        resources.fail(problem)
    out.append(resources)
    return out


def _outcomes(ledger: Ledger, ops: list[Op], in_flight: dict[str, int], waiting: int) -> Check:
    result = Check("every_accepted_request_ended", examined=len(ops))
    for op in ops:
        if not _has_outcome(ledger, op):
            seen = [getattr(r, "status", "?") for r in ledger.results.get(op.request_id, [])]
            result.fail(
                f"{op.kind} {op.request_id} (key {op.operation_key or '-'}): "
                f"results seen {seen or 'none'}"
            )
    if in_flight["commands_in_flight"] or in_flight["runs_in_flight"]:
        result.fail(f"still in flight in the registry: {in_flight}")
    if waiting:
        result.fail(f"{waiting} refund proposals still wait for a person after approval")
    return result


def _effects(
    commands: dict[str, dict[str, Any]], notes: list[dict[str, Any]], refunds: list[dict[str, Any]]
) -> list[Check]:
    crm = Check("at_most_one_crm_note_per_operation", examined=len(notes))
    for key, n in Counter(note["idempotency_key"] for note in notes).items():
        if n > 1:
            crm.fail(f"{n} notes with idempotency key {key}")
    pay = Check("no_refund_twice", examined=len(refunds))
    for key, n in Counter(r["reference"] for r in refunds).items():
        if n > 1:
            pay.fail(f"{n} refunds with reference {key}")
    for (payment, line), n in Counter((r["payment_id"], r.get("line_id")) for r in refunds).items():
        if n > 1:
            pay.fail(f"{n} refunds of {payment} line {line}")
    keys = {note["idempotency_key"] for note in notes}
    references = {r["reference"] for r in refunds}
    real = Check("every_success_has_its_effect")
    for command in commands.values():
        if command["state"] != "succeeded":
            continue
        real.examined += 1
        key = f"{command['tenant']}:{command['operation_id']}"
        if command["action"] == "crm.note.create" and key not in keys:
            real.fail(f"{command['operation_id']} succeeded with no note at the CRM")
        if command["action"] == "payment.refund" and key not in references:
            real.fail(f"{command['operation_id']} succeeded with no refund at the provider")
    return [crm, pay, real]


def _unknown(stack: Stack, commands: dict[str, dict[str, Any]], faults: dict[str, int]) -> Check:
    unknown = {c["operation_id"]: c for c in commands.values() if c["state"] == "unknown"}
    result = Check("unknown_only_where_the_answer_was_lost", examined=len(unknown))
    shown: set[str] = set()
    for tenant in sorted({c["tenant"] for c in unknown.values()}):
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "writ.cli",
                "reconcile",
                "--home",
                str(stack.home),
                "--tenant",
                tenant,
                "list",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        shown |= {
            line.split()[0]
            for line in listed.stdout.splitlines()
            if line and not line.startswith(" ") and not line.startswith("no unknown")
        }
        if listed.returncode != 0:
            result.fail(f"writ reconcile list --tenant {tenant} failed: {listed.stderr[-300:]}")
    # Where an answer can be lost: the payment provider losing or delaying it, or the
    # dispatcher holding the call dying or freezing in the middle of it.
    losers = sum(
        n
        for kind, n in faults.items()
        if kind in ("provider:lose_response", "provider:slow", "kill", "freeze")
    )
    for operation_id, command in unknown.items():
        if not command["action"].startswith("payment."):
            result.fail(
                f"{operation_id} ({command['action']}) ended unknown, but its "
                "connector can replay its key"
            )
        if operation_id not in shown:
            result.fail(f"{operation_id} is unknown but `writ reconcile list` omits it")
    if unknown and not losers:
        result.fail(f"{len(unknown)} unknown with no fault that could lose an answer")
    result.note = (
        f"{len(unknown)} unknown, all listed by `writ reconcile list`" if (result.held) else ""
    )
    return result


def _keys(ledger: Ledger, commands: dict[str, dict[str, Any]]) -> Check:
    result = Check("a_repeated_key_returns_the_first_outcome_a_conflict_changes_nothing")
    for op in ledger.accepted():
        if op.kind not in ("repeat", "conflict"):
            continue
        result.examined += 1
        first = ledger.final(op.original)
        answers = [r for r in ledger.results.get(op.request_id, []) if isinstance(r, CommandResult)]
        stored = commands.get(op.operation_key)
        if not answers or stored is None:
            continue  # counted by every_accepted_request_ended
        answer = answers[0]
        if op.kind == "conflict":
            if answer.status != "conflict":
                result.fail(
                    f"conflict {op.request_id} on {op.operation_key} answered {answer.status}"
                )
            if (
                stored["arguments"]
                and json.loads(stored["arguments"]) != ledger.ops[op.original].arguments
            ):
                result.fail(f"{op.operation_key}: the stored arguments changed")
            continue
        if answer.operation_id != stored["operation_id"]:
            result.fail(
                f"repeat {op.request_id} named operation {answer.operation_id}, the "
                f"key's is {stored['operation_id']}"
            )
        terminal = answer.status not in ("pending", "dispatching", "awaiting_human")
        if (
            terminal
            and first is not None
            and (answer.status, answer.receipt) != (first.status, first.receipt)
        ):
            result.fail(
                f"repeat {op.request_id} answered {answer.status}/{answer.receipt}, "
                f"the first {first.status}/{first.receipt}"
            )
    return result


def _replanning(ledger: Ledger, runs: dict[tuple[str, str], dict[str, Any]]) -> Check:
    result = Check("no_run_recorded_more_decisions_than_its_script")
    result.note = (
        "decisions recorded per run against the model's rules (two), and one proposal per run"
    )
    for op in ledger.accepted("run"):
        run = runs.get((op.tenant, op.request_id))
        if run is None:
            continue
        result.examined += 1
        if run["decisions"] > NOTE_RUN_DECISIONS:
            result.fail(
                f"run {run['run_id']} recorded {run['decisions']} decisions, its "
                f"script has {NOTE_RUN_DECISIONS}"
            )
        if run["proposals"] > 1:
            result.fail(f"run {run['run_id']} proposed {run['proposals']} times")
    return result


def _tenants(
    ledger: Ledger, commands: dict[str, dict[str, Any]], runs: dict[tuple[str, str], dict[str, Any]]
) -> Check:
    """Both tenants were driven on every path, and what each sent is recorded as its own."""
    result = Check("every_tenant_driven_and_kept_apart")
    driven = ledger.by_tenant()
    for tenant in TENANTS:
        for kind in ("note", "run", "refund", "chat"):
            if not driven.get(tenant, {}).get(kind) and any(
                op.kind == kind for op in ledger.ops.values()
            ):
                result.fail(f"tenant {tenant} had no accepted {kind}")
    for op in ledger.accepted():
        if op.kind in ("note", "refund"):
            result.examined += 1
            stored = commands.get(op.operation_key)
            if stored is not None and stored["tenant"] != op.tenant:
                result.fail(
                    f"{op.kind} {op.request_id} of {op.tenant} is recorded under {stored['tenant']}"
                )
        elif op.kind == "run":
            result.examined += 1
            if op.request_id in {rid for (t, rid) in runs if t != op.tenant}:
                result.fail(f"run {op.request_id} of {op.tenant} is recorded under another tenant")
    result.note = f"accepted per tenant: {driven}"
    return result


async def _model_log(deployment: Deployment) -> list[dict[str, Any]]:
    async with deployment.model_client() as client:
        response = await client.get("/_control/requests")
        response.raise_for_status()
        return list(response.json())


def _audit(stack: Stack) -> Check:
    result = Check("audit_journal_intact")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "writ.cli",
            "audit",
            "verify",
            "--home",
            str(stack.home),
            "--grace-s",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    result.examined = done.stdout.count("\n")
    result.note = done.stdout.strip()[-1500:]
    if done.returncode != 0:
        result.fail(
            f"writ audit verify exited {done.returncode}: "
            f"{(done.stdout + done.stderr).strip()[-600:]}"
        )
    return result


async def _dead_letters(stack: Stack, ledger: Ledger) -> Check:
    """No dead letter at all: the only invalid inputs are the hostile ones a host can send,
    which ingress answers with an error (and which must not be lost either)."""
    hostile = ledger.accepted("hostile")
    result = Check("dead_letters_only_for_invalid_inputs", examined=len(hostile))
    nc = await admin_connect(stack, connect_timeout=10)
    try:
        js = nc.jetstream()
        count = (await js.stream_info("WRIT_DLQ")).state.messages
        if count:
            sub = await js.subscribe(
                subjects.DEAD_LETTER_FAMILY, stream="WRIT_DLQ", ordered_consumer=True
            )
            try:
                for _ in range(min(count, EXAMPLES)):
                    msg = await sub.next_msg(timeout=5)
                    result.fail(f"{msg.subject}: {(msg.headers or {}).get('Writ-Dlq-Reason')}")
            finally:
                await sub.unsubscribe()
            result.broken = count
    finally:
        await nc.close()
    # A body that is JSON names its request id: ingress must answer it (an error, as data).
    for op in hostile:
        if op.arguments.get("json") and not any(
            isinstance(r, RunResult) and r.status == "rejected"
            for r in ledger.results.get(op.request_id, [])
        ):
            result.fail(f"hostile {op.request_id} was never answered with its error")
    return result


def outcomes(ledger: Ledger) -> dict[str, dict[str, int]]:
    """Final states by kind of submission (a chat message: its turn started, or the session
    was busy; how the turns ended is in the chat check's note)."""
    out: dict[str, Counter[str]] = {}
    for op in ledger.ops.values():
        if op.kind == "chat":
            state = (
                "turn started"
                if op.accepted
                else "SESSION_BUSY"
                if op.busy
                else op.error.split(":")[0] or "no answer"
            )
            out.setdefault(op.kind, Counter())[state] += 1
            continue
        if not op.accepted:
            continue
        final = ledger.final(op.request_id)
        if op.kind == "approval":
            answers = [
                r for r in ledger.results.get(op.request_id, []) if isinstance(r, ApprovalResult)
            ]
            state = answers[0].status if answers else "no answer"
        elif op.kind == "open":
            state = "opened"
        elif (
            op.kind in ("note", "repeat") and final is None and ledger.results.get(op.request_id)
        ):  # answered as a replay (a note: overtaken by its repeat)
            state = f"replayed {ledger.results[op.request_id][0].status}"
        else:
            state = getattr(final, "status", None) or "no outcome"
        out.setdefault(op.kind, Counter())[state] += 1
    return {kind: dict(c) for kind, c in out.items()}


def stream_replicas(layout: dict[str, dict[str, Any]], expected: int) -> Check:
    """Every stream and bucket of Writ's at the topology's replicas (3 on the cluster: what
    survives one node lost), found from the servers' own stream info."""
    result = Check(
        "every_stream_at_the_topologys_replicas", examined=len(layout), note=f"expected {expected}"
    )
    if not layout:
        result.fail("no stream was listed")
    for name, info in sorted(layout.items()):
        if info.get("replicas") != expected:
            result.fail(
                f"{name} at {info.get('replicas')} replicas {info.get('note', '')}".rstrip()
            )
    return result
