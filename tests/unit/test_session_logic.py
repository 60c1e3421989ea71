"""Chat sessions' pure rules: the transition table, exhaustively; ids; the conversation rule."""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Mapping

import anyio
import msgspec
import pytest

from actions.base import FactsRef
from schemas.sessions import (
    SESSION_STATES,
    AnySessionEvent,
    MessageBody,
    OpenSession,
    PlanStep,
    SessionOp,
    TurnStarted,
)
from services.planner.sessions._plans import plan_digest
from services.planner.sessions._resolve import FactsReader, changed, request_of, resolve
from services.planner.sessions._turns import outcome_note
from services.planner.sessions.logic import (
    HISTORY_TOKENS,
    MAX_ENTRY_CHARS,
    HistoryEntry,
    SessionRefused,
    conversation,
    estimate_tokens,
    fork_id_for,
    is_turn_run,
    session_id_for,
    transition,
    turn_of,
    turn_run_id,
)

HAPPENINGS = ("message", "turn_ended", "pause", "resume", "inject", "close", "fork")

# Every (state, happening, turn in flight) the table allows, and where it leads: anything not
# here must be refused.
ALLOWED = {
    ("active", "message"): "processing",
    ("active", "pause"): "paused",
    ("active", "inject"): "active",
    ("active", "close"): "closed",
    ("active", "fork"): "active",
    ("processing", "turn_ended"): "processing→active",
    ("processing", "pause"): "paused",
    ("processing", "inject"): "processing",
    ("processing", "close"): "closed",
    ("processing", "fork"): "processing",
    ("paused", "inject"): "paused",
    ("paused", "turn_ended"): "paused",
    ("paused", "close"): "closed",
    ("paused", "fork"): "paused",
    ("closed", "turn_ended"): "closed",
    ("closed", "fork"): "closed",
}


@pytest.mark.parametrize(
    ("state", "happening", "turn_open"),
    list(itertools.product(SESSION_STATES, HAPPENINGS, (False, True))),
)
def test_every_pair_is_allowed_by_the_table_or_refused_with_a_code(
    state: str, happening: str, turn_open: bool
) -> None:
    if happening == "resume" and state == "paused":
        assert transition(state, happening, turn_open=turn_open) == (
            "processing" if turn_open else "active"
        )
        return
    expected = ALLOWED.get((state, happening))
    if expected is None:
        with pytest.raises(SessionRefused) as refused:
            transition(state, happening, turn_open=turn_open)
        assert refused.value.state == state and refused.value.happening == happening
        if state == "closed":
            assert refused.value.code == "SESSION_CLOSED"
        elif (state, happening) == ("processing", "message"):
            assert refused.value.code == "SESSION_BUSY"
        elif (state, happening) == ("paused", "message"):
            assert refused.value.code == "SESSION_PAUSED"
        else:
            assert refused.value.code == "INVALID_TRANSITION"
        return
    assert transition(state, happening, turn_open=turn_open) == expected.split("→")[-1]


def test_closed_is_terminal_and_unknown_states_are_refused() -> None:
    for happening in ("message", "pause", "resume", "inject", "close"):
        with pytest.raises(SessionRefused):
            transition("closed", happening)
    with pytest.raises(SessionRefused) as refused:
        transition("sleeping", "message")
    assert refused.value.code == "INVALID_TRANSITION"


def test_ids_are_derived_and_turn_runs_are_recognised() -> None:
    sid = session_id_for("acme", "k1")
    assert sid == session_id_for("acme", "k1") != session_id_for("globex", "k1")
    assert fork_id_for(sid, "k") != fork_id_for(sid, "k2")
    run = turn_run_id(sid, 3)
    assert is_turn_run(run) and turn_of(run) == (sid, 3)
    assert not is_turn_run(f"{run}.b2")  # a branch of a turn is a child session
    assert not is_turn_run("6f1d8a52-3b8e-4c1e-9a57-2f0c9b7e4d10")


def test_the_conversation_keeps_the_message_whole_and_drops_the_oldest_beyond_budget() -> None:
    from services.planner.memory import split_memory

    assert split_memory(conversation([], "hello")) == ([], "hello")  # no memory: the message
    history = [
        HistoryEntry(turn=i, role="user" if i % 2 else "agent", text=f"entry {i} " + "x" * 400)
        for i in range(1, 60)
    ]
    text = conversation(history, "now this")
    assert text.endswith("The user's message now:\nnow this")
    memory = text.split("\n\nThe user's message now:")[0]
    assert estimate_tokens(memory) <= HISTORY_TOKENS
    kept = [line for line in text.splitlines() if line.startswith("- [turn ")]
    assert kept and kept[-1].startswith("- [turn 59] user:")  # newest kept, in order
    dropped = 59 - len(kept)
    assert (
        f"({dropped} older entries dropped to fit the memory budget: {dropped} conversation; "
        f"from turns 1-{dropped})" in (text)
    )
    assert "[turn 1]" not in text
    long = conversation([HistoryEntry(turn=1, role="user", text="y" * 5000)], "m")
    assert max(len(line) for line in long.splitlines()) < MAX_ENTRY_CHARS + 30


def test_outcome_notes_come_from_the_typed_outcome() -> None:
    assert (
        outcome_note({"action": "crm.note.create", "state": "succeeded", "receipt": "n-1"})
        == "crm.note.create succeeded (receipt n-1)"
    )
    assert outcome_note(
        {
            "action": "a",
            "state": "failed",
            "outcome": "terminal_failure",
            "correlation_id": "c-9",
            "reason": "secret detail",
        }
    ) == ("a failed; correlation id c-9")
    assert "stale" in outcome_note(
        {
            "action": "a",
            "state": "revision_required",
            "outcome": "revision_required",
            "reason": "stale",
        }
    )


def test_session_bodies_refuse_unknown_fields_and_bound_sizes() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"agent": "crm-assistant", "extra": 1}', type=OpenSession)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"text": "' + b"x" * 9000 + b'"}', type=MessageBody)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"text": ""}', type=MessageBody)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(
            b'{"type": "SessionOp", "op": "explode", "tenant": "acme", "principal": "a"}',
            type=SessionOp,
        )
    event = TurnStarted(session_id="ses-1", n=2, turn=1, run_id="ses-1-t1")
    assert msgspec.json.decode(msgspec.json.encode(event), type=AnySessionEvent) == event


def _resolved(
    capability: str, arguments: Mapping[str, object], read: FactsReader | None = None
) -> tuple[dict[str, object], dict[str, object]]:
    got = anyio.run(resolve, capability, dict(arguments), read)
    return got.arguments, got.preview


def test_a_plan_step_freezes_what_the_contract_resolves_not_what_the_model_wrote() -> None:
    composed = {"customer_id": "ACME-42", "body": "Le client a payé."}
    decomposed = {"body": unicodedata.normalize("NFD", composed["body"]), "customer_id": "ACME-42"}
    assert decomposed["body"] != composed["body"]
    args, preview = _resolved("crm.note.create", decomposed)
    assert args == composed and preview == composed  # the contract's preview of the note
    assert _resolved("crm.note.create", composed) == (args, preview)
    # What is sent when the step is taken: the request as the contract decodes it, in the
    # contract's field order, NFC — not the model's spelling.
    request, _ = request_of("action:crm.note.create", decomposed)
    assert list(request) == ["customer_id", "body"] and request == composed
    # The same resolution, the same hash; another body, another.
    step = PlanStep(index=0, capability="crm.note.create", arguments=args, preview=preview)
    again = PlanStep(
        index=0,
        capability="crm.note.create",
        **dict(
            zip(("arguments", "preview"), _resolved("crm.note.create", decomposed), strict=True)
        ),
    )
    assert plan_digest([step]) == plan_digest([again])
    other = _resolved("crm.note.create", {**composed, "body": "Autre chose."})
    assert other[0] != args
    assert plan_digest(
        [PlanStep(index=0, capability="crm.note.create", arguments=other[0], preview=other[1])]
    ) != plan_digest([step])
    # A request the contract refuses stays as written (admission refuses it too); a read's
    # arguments are only normalised; a facts-bound action without a reader keeps its decoded
    # request and no preview.
    assert _resolved("crm.note.create", {"oops": 1}) == ({"oops": 1}, {})
    assert _resolved("kb.search", {"q": "cafe\u0301"}) == ({"q": "café"}, {})
    refund = {"payment_id": "pay_1", "line_id": "L2"}
    assert _resolved("payment.refund", refund) == ({**refund, "destination": "original_method"}, {})


def _payment(discount_cents: int) -> dict[str, object]:
    return {
        "payment_id": "pay_1",
        "currency": "EUR",
        "status": "captured",
        "method": {"kind": "card", "last4": "4242", "usable": True},
        "amount_cents": 12000,
        "refunded_cents": 0,
        "refunds": [],
        "lines": [
            {
                "line_id": "L2",
                "product": "Junior programme",
                "participant": "Léo Martin",
                "amount_cents": 12000,
                "discount": {
                    "discount_id": "D-SIB",
                    "name": "Sibling discount",
                    "amount_cents": discount_cents,
                },
            }
        ],
    }


def test_a_facts_bound_step_resolves_from_its_facts_and_a_change_is_named() -> None:
    reads: list[FactsRef] = []
    facts = {"pay_1": _payment(1500)}

    async def read(ref: FactsRef) -> dict[str, object] | None:
        reads.append(ref)
        return facts.get(ref.id)

    refund = {"line_id": "L2", "payment_id": "pay_1"}
    args, preview = _resolved("payment.refund", refund, read)
    assert reads == [FactsRef(kind="payment", id="pay_1")]
    assert (args["amount_cents"], preview["amount_cents"], preview["payment"]) == (
        1500,
        1500,
        "pay_1",
    )
    assert preview["payment_method"] == "card ending 4242"
    same = anyio.run(resolve, "payment.refund", refund, read)
    assert changed(args, preview, same) is None
    facts["pay_1"] = _payment(2000)  # the discount changed since the plan was approved
    now = anyio.run(resolve, "payment.refund", refund, read)
    reason = changed(args, preview, now)
    assert reason is not None and "amount_cents" in reason and "resulting_total_cents" in reason
    del facts["pay_1"]  # gone: it no longer resolves, and is not guessed at
    gone = anyio.run(resolve, "payment.refund", refund, read)
    assert gone.unresolved and gone.preview == {}
    assert (changed(args, preview, gone) or "").startswith("it no longer resolves")


def test_the_consequential_mark_is_a_strict_bool_that_only_adds_a_plan() -> None:
    from services.planner.openai_provider._wire import _decision_schema, _from_structured
    from services.planner.provider import ModelDecision, SelectCapability
    from services.planner.sessions._plans import marked
    from services.planner.store import Step

    plain = {"decision": "select_capability", "capability": "crm.note.create", "arguments": {}}
    # Unmarked, a decision keeps the bytes it had before the mark existed.
    decoded = msgspec.convert(plain, ModelDecision)
    assert msgspec.json.decode(msgspec.json.encode(decoded)) == plain
    mark = msgspec.convert({**plain, "consequential": True}, ModelDecision)
    assert isinstance(mark, SelectCapability) and mark.consequential
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({**plain, "consequential": "yes"}, ModelDecision)
    # The structured wire carries it, and its strict schema asks for it.
    wire = _from_structured(
        '{"next": {"decision": "select_capability", "capability": "a", '
        '"arguments": "{}", "consequential": true}}'
    )
    assert isinstance(wire, SelectCapability) and wire.consequential
    [select] = [
        v
        for v in _decision_schema(["a"])["properties"]["next"]["anyOf"]
        if v["properties"]["decision"]["enum"] == ["select_capability"]
    ]
    assert "consequential" in select["required"]
    assert select["properties"]["consequential"]["type"] == "boolean"
    # A run plans once any of its selections was marked; a later `false` does not undo it.
    steps = [
        Step(seq=0, kind="decision", payload=msgspec.to_builtins(mark)),
        Step(seq=1, kind="observation", payload={"refused": "PLANNED"}),
        Step(seq=2, kind="decision", payload={**plain, "consequential": False}),
    ]
    assert marked(steps) and not marked(steps[2:])
