"""The soak's nemesis schedule replays from its seed, and its checker finds what it checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.host import CommandResult, CommandStatus
from soak import nemesis
from soak.check import _effects, _keys, _outcomes, _tenants, stream_replicas
from soak.check_chat import event_gaps, turn_notes
from soak.check_model import replayed
from soak.ledger import Ledger, Op
from soak.nemesis import schedule
from soak.observe import FD_SLACK, POOL_MAX, within

INSTANCES = [
    "admission",
    "admission-2",
    "dispatcher",
    "dispatcher-2",
    "governance",
    "ingress",
    "planner",
    "retrieval",
]


def _schedule(seed: int, *, cluster: bool = False) -> list:
    return schedule(
        seed, duration_s=3600, every=(20, 60), lease_s=4, instances=INSTANCES, cluster=cluster
    )


def test_the_same_seed_gives_the_same_faults_and_another_seed_others() -> None:
    assert _schedule(42) == _schedule(42)
    assert _schedule(42) != _schedule(43)


def test_faults_come_every_20_to_60_s_and_a_freeze_outlasts_the_lease() -> None:
    faults = _schedule(7)
    gaps = [b.at_s - a.at_s for a, b in zip(faults, faults[1:], strict=False)]
    assert gaps and all(20 <= g <= 60 for g in gaps)
    assert 20 <= faults[0].at_s <= 60 and faults[-1].at_s < 3600
    freezes = [f for f in faults if f.kind == "freeze"]
    assert freezes and all(f.hold_s > 4 for f in freezes)
    assert {f.kind for f in faults} >= {"kill", "freeze", "nats", "postgres", "provider"}
    assert {f.mode for f in faults if f.kind == "provider"} == {"lose_response", "fail", "slow"}


def test_the_cluster_faults_one_node_and_never_all_of_nats() -> None:
    kinds = {f.kind for f in _schedule(7, cluster=True)}
    assert {"node_kill", "node_freeze", "node_restart"} <= kinds and "nats" not in kinds


def test_the_cluster_moves_leaders_and_faults_the_dispatchers_node_besides_the_first_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = _schedule(7, cluster=True)
    assert [f.at_s for f in cluster] == sorted(f.at_s for f in cluster)
    stepdowns = {f.target for f in cluster if f.kind == "stepdown"}
    assert {"WRIT_CMD", "WRIT_INT", "WRIT_CMD/dispatcher", "WRIT_INT/planner"} <= stepdowns
    aimed = {f.kind for f in cluster if f.kind.startswith("node_") and f.target == "dispatcher"}
    assert aimed == {"node_kill", "node_freeze"}
    assert _schedule(7, cluster=True) == cluster
    # The first draw is the same with or without the second: a seed keeps its schedule.
    monkeypatch.setattr(nemesis, "_leader_faults", lambda *_: [])
    first = _schedule(7, cluster=True)
    assert [f for f in cluster if f in first] == first
    assert all(f.kind == "stepdown" or f.target == "dispatcher" for f in cluster if f not in first)


def _result(
    request_id: str,
    status: CommandStatus,
    *,
    operation_id: str = "op-1",
    receipt: str | None = None,
) -> CommandResult:
    return CommandResult(
        request_id=request_id,
        operation_key="k",
        status=status,
        operation_id=operation_id,
        receipt=receipt,
    )


def test_the_checker_finds_a_second_effect_and_a_success_without_one() -> None:
    commands = {
        "k1": {
            "tenant": "acme",
            "operation_id": "a",
            "action": "crm.note.create",
            "state": "succeeded",
        },
        "k2": {
            "tenant": "acme",
            "operation_id": "b",
            "action": "payment.refund",
            "state": "succeeded",
        },
    }
    notes = [{"idempotency_key": "acme:a"}, {"idempotency_key": "acme:a"}]
    refunds = [
        {"reference": "acme:x", "payment_id": "p", "line_id": "L2"},
        {"reference": "acme:y", "payment_id": "p", "line_id": "L2"},
    ]
    crm, pay, real = _effects(commands, notes, refunds)
    assert crm.broken == 1 and "2 notes" in crm.examples[0]
    assert pay.broken == 1 and "refunds of p" in pay.examples[0]
    assert real.broken == 1 and "no refund" in real.examples[0]
    crm, pay, real = _effects(commands, notes[:1], [refunds[0] | {"reference": "acme:b"}])
    assert crm.held and pay.held and real.held


def test_the_checker_finds_a_replay_that_differs_and_a_conflict_that_changed_the_payload() -> None:
    ledger = Ledger()
    first = ledger.add(Op("note", "r1", "k", arguments={"body": "one"}, accepted=True))
    ledger.add(Op("repeat", "r2", "k", "r1", first.arguments, accepted=True))
    ledger.add(Op("conflict", "r3", "k", "r1", {"body": "two"}, accepted=True))
    ledger.results = {
        "r1": [_result("r1", "succeeded", receipt="n1")],
        "r2": [_result("r2", "failed")],
        "r3": [_result("r3", "succeeded")],
    }
    stored = {"k": {"operation_id": "op-1", "arguments": json.dumps({"body": "two"})}}
    found = _keys(ledger, stored)
    assert found.broken == 3, found.examples
    ledger.results["r2"] = [_result("r2", "succeeded", receipt="n1")]
    ledger.results["r3"] = [_result("r3", "conflict")]
    assert _keys(ledger, {"k": {**stored["k"], "arguments": json.dumps({"body": "one"})}}).held


def test_the_checker_finds_a_request_without_an_outcome_and_work_left_in_flight() -> None:
    ledger = Ledger()
    ledger.add(Op("note", "r1", "k", accepted=True))
    ledger.add(Op("note", "r2", "k2", accepted=True))
    ledger.results = {
        "r1": [_result("r1", "dispatching")],
        "r2": [_result("r2", "dispatching"), _result("r2", "unknown")],
    }
    ops = ledger.accepted()
    quiet = {"commands_in_flight": 0, "runs_in_flight": 0}
    found = _outcomes(ledger, ops, quiet, 0)
    assert found.broken == 1 and "r1" in found.examples[0]
    assert _outcomes(ledger, ops[1:], {**quiet, "commands_in_flight": 1}, 0).broken == 1
    assert _outcomes(ledger, ops[1:], quiet, 0).held


def test_a_repeat_that_overtook_its_note_carries_the_outcome_for_both() -> None:
    # Two admissions: the one holding the note was frozen, the other recorded the key from
    # the repeat; the note was then answered as a replay, with the state then recorded.
    ledger = Ledger()
    ledger.add(Op("note", "n1", "k", accepted=True))
    ledger.add(Op("repeat", "r1", "k", "n1", accepted=True))
    ledger.results = {
        "n1": [_result("n1", "dispatching")],
        "r1": [_result("r1", "pending"), _result("r1", "succeeded")],
    }
    quiet = {"commands_in_flight": 0, "runs_in_flight": 0}
    assert _outcomes(ledger, ledger.accepted(), quiet, 0).held
    # Neither got the outcome: both are named.
    ledger.results["r1"] = [_result("r1", "pending")]
    assert _outcomes(ledger, ledger.accepted(), quiet, 0).broken == 2
    # A submission never answered at all is named even when its key has its outcome.
    ledger.results = {"r1": [_result("r1", "succeeded")]}
    found = _outcomes(ledger, ledger.accepted(), quiet, 0)
    assert found.broken == 1 and "n1" in found.examples[0]


def test_resources_past_their_bound_are_named() -> None:
    start = {
        "processes": {"planner": {"rss_mb": 80.0, "fds": 20}},
        "pg_connections": {"writ_planner": 10},
    }
    end = {
        "processes": {"planner": {"rss_mb": 250.0, "fds": 150}},
        "pg_connections": {"writ_planner": 60},
    }
    two = {"planner": "planner", "planner-2": "planner"}
    assert len(within(start, end, {"planner": "planner"})) == 3
    assert len(within(start, end, two)) == 2  # two pools hold 60
    # Descriptors up to the pool's size beyond the slack are the pool's connections, no leak.
    pooled = {"rss_mb": 80.0, "fds": 20 + FD_SLACK + POOL_MAX["planner"]}
    assert within(start, {**start, "processes": {"planner": pooled}}, {"planner": "planner"}) == []
    one_more = {**pooled, "fds": pooled["fds"] + 1}
    assert within(start, {**start, "processes": {"planner": one_more}}, {"planner": "planner"})
    assert within(start, start) == []
    assert within(start, {**start, "processes": {}}) == ["planner is not running at the end"]


def test_a_full_pool_with_its_journal_keys_and_listener_is_within_the_bound() -> None:
    # Each admission: its pool (20), the journal's window keys (2) and the relay's LISTEN.
    two = {"admission": "admission", "admission-2": "admission"}
    start = {"processes": {}, "pg_connections": {"soak_admission": 10}}
    assert within(start, {**start, "pg_connections": {"soak_admission": 46}}, two) == []
    assert within(start, {**start, "pg_connections": {"soak_admission": 53}}, two)


def _ask(
    run_input: str, observations: int, serial: int | None, request_id: str | None = None
) -> dict:
    """A model request of the planner's shape (structured mode), as the fake model logs it."""
    untrusted = {
        "untrusted": {
            "authority": "none",
            "evidence": [],
            "observations": [{"ok": True}] * observations,
        }
    }
    body = {
        "model": "soak-model",
        "messages": [
            {"role": "system", "content": "Answer with one decision under the `next` key"},
            {"role": "user", "content": json.dumps({"user_input": {"request": run_input}})},
            {"role": "user", "content": json.dumps(untrusted)},
        ],
    }
    headers = {} if request_id is None else {"x-client-request-id": request_id}
    return {"body": body, "serial": serial, "at": 0.0, "headers": headers}


def _decision(serial: int) -> tuple[str, dict]:
    return "decision", {"decision": "answer_directly", "answer": f"Done (model reply {serial})."}


def test_the_checker_finds_a_model_asked_again_for_a_step_its_run_had_recorded() -> None:
    inputs = {"note for ACME (soak run-1)": "run-1", "note for ACME (soak run-2)": "run-2"}
    # run-1: step 0's first answer was lost (no serial), the retry answered 2 and was
    # recorded; step 1 answered 4. run-2: step 0 answered 3, recorded.
    log = [
        _ask("note for ACME (soak run-1)", 0, None),
        _ask("note for ACME (soak run-1)", 0, 2),
        _ask("note for ACME (soak run-2)", 0, 3),
        _ask("note for ACME (soak run-1)", 1, 4),
        _ask("something else", 0, 5),
    ]
    steps = {
        "run-1": [_decision(2), ("observation", {"ok": True}), _decision(4)],
        "run-2": [_decision(3)],
    }
    held = replayed(log, inputs, steps)
    assert held.held and held.examined == 3, held.examples
    assert "1 retries" in held.note and "1 requests of no soak run" in held.note
    # The planner forgot step 0 of run-2 and asked for it again after recording answer 3.
    again = replayed([*log, _ask("note for ACME (soak run-2)", 0, 6)], inputs, steps)
    assert again.broken == 1 and "run-2 step 0" in again.examples[0], again.examples
    assert "asked again 1 time" in again.examples[0]
    # A recorded answer the log never gave for that step is caught too.
    wrong = replayed(log, inputs, {**steps, "run-2": [_decision(4)]})
    assert wrong.broken == 1 and "does not show" in wrong.examples[0]


def test_an_attempt_read_after_its_calls_recorded_answer_is_a_retry_not_a_second_call() -> None:
    # A starved fake read the call's first attempt (given up on at its timeout) after the
    # second, which was answered and recorded: a retry, logged late. Another call for the
    # same step after the recorded answer is still the violation.
    inputs = {"note for ACME (soak run-3)": "run-3"}
    steps = {"run-3": [_decision(7)]}
    answered = _ask("note for ACME (soak run-3)", 0, 7, "c1-2")
    late = _ask("note for ACME (soak run-3)", 0, 8, "c1-1")
    held = replayed([answered, late], inputs, steps)
    assert held.held, held.examples
    assert "1 of them logged after their call's answer" in held.note
    other = _ask("note for ACME (soak run-3)", 0, 9, "c2-1")
    again = replayed([answered, late, other], inputs, steps)
    assert again.broken == 1 and "asked again 1 time" in again.examples[0], again.examples


def test_the_checker_finds_a_gap_or_a_repeat_in_a_sessions_events() -> None:
    sessions = {"s1": {"last_n": 4}, "s2": {"last_n": 3}, "s3": {"last_n": 2}}
    assert event_gaps(sessions, {"s1": [1, 2, 3, 4], "s2": [1, 2, 3], "s3": [1, 2]}) == []
    found = event_gaps(sessions, {"s1": [1, 2, 4], "s2": [1, 2, 2, 3], "s3": [1, 2]})
    assert len(found) == 2
    assert "missing [3]" in found[0] and "repeated [2]" in found[1]


def test_the_checker_finds_a_turn_that_wrote_twice() -> None:
    turns = [
        Op("chat", "m1", accepted=True, run_id="t1"),
        Op("chat", "m2", accepted=True, run_id="t2"),
    ]
    commands = {
        "o1": {"tenant": "acme", "operation_id": "o1", "run_id": "t1", "action": "crm.note.create"},
        "o2": {"tenant": "acme", "operation_id": "o2", "run_id": "t2", "action": "crm.note.create"},
    }
    notes = [{"idempotency_key": "acme:o1"}, {"idempotency_key": "acme:o2"}]
    assert turn_notes(turns, commands, notes).held
    twice = turn_notes(turns, commands, [*notes, {"idempotency_key": "acme:o2"}])
    assert twice.broken == 1 and "t2: 2 notes" in twice.examples[0]
    other = {**commands, "o3": {**commands["o2"], "operation_id": "o3"}}
    two_ops = turn_notes(turns, other, [*notes, {"idempotency_key": "acme:o3"}])
    assert two_ops.broken == 1 and "wrote 2 notes" in two_ops.examples[0]


def test_the_checker_finds_a_tenant_left_undriven_or_a_command_under_another_tenant() -> None:
    ledger = Ledger()
    for tenant in ("acme", "globex"):
        for kind in ("note", "run", "refund", "chat"):
            ledger.add(
                Op(kind, f"{tenant}-{kind}", f"key-{tenant}-{kind}", accepted=True, tenant=tenant)
            )
    commands = {
        f"key-{t}-{k}": {"tenant": t} for t in ("acme", "globex") for k in ("note", "refund")
    }
    runs: dict[tuple[str, str], dict[str, Any]] = {
        ("acme", "acme-run"): {},
        ("globex", "globex-run"): {},
    }
    assert _tenants(ledger, commands, runs).held
    moved = {**commands, "key-globex-note": {"tenant": "acme"}}
    assert _tenants(ledger, moved, runs).broken == 1
    ledger.ops["globex-chat"].accepted = False
    found = _tenants(ledger, commands, runs)
    assert found.broken == 1 and "globex had no accepted chat" in found.examples[0]


def test_the_checker_finds_a_stream_or_bucket_below_the_topologys_replicas() -> None:
    layout = {
        "WRIT_CMD": {"replicas": 3},
        "KV_WRIT_IDEMPOTENCY": {"replicas": 3},
        "KV_WRIT_CONSOLE": {"replicas": 1},
    }
    broken = stream_replicas(layout, 3)
    assert (broken.held, broken.examined, broken.examples) == (
        False,
        3,
        ["KV_WRIT_CONSOLE at 1 replicas"],
    )
    assert stream_replicas({k: {"replicas": 3} for k in layout}, 3).held
    assert stream_replicas({"WRIT_CMD": {"replicas": 1}}, 1).held
    assert not stream_replicas({}, 3).held  # nothing listed is not evidence of anything
    unreadable = stream_replicas({"error": {"replicas": 0, "note": "TimeoutError()"}}, 1)
    assert unreadable.examples == ["error at 0 replicas TimeoutError()"]
