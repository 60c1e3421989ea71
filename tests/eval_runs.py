"""The demo agents' runs, journaled as the planner journals them (its entries, its model inputs
and their digests), and the scripted candidates the evaluation tests run against them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from actions import ACTIONS
from schemas.dispatcher import CommandOutcome
from services.planner.agents import AgentRegistry, load_manifest
from services.planner.inputs import input_digest, model_input
from services.planner.journal_entries import (
    DECISION,
    OBSERVATION,
    PROPOSAL,
    RUN_STARTED,
    RUN_STATUS,
    Captured,
    DecisionEntry,
    ObservationEntry,
    ProposalEntry,
    RunStartedEntry,
    StatusEntry,
)
from services.planner.observations import ReviewAnswered, observation_of
from services.planner.snapshot import snapshot_of

DEMO: Path = Path(__file__).resolve().parents[1] / "writ" / "demo"
DEMO_DECISIONS: dict[str, Any] = json.loads((DEMO / "decisions.json").read_text())
EVIDENCE = [
    {
        "document_id": "doc-1",
        "kind": "ticket",
        "title": "Delayed shipment",
        "text": "Order 7781 was delayed; the sibling discount is missing.",
        "rank": 0.5,
    }
]
# The payment as the provider showed it when the refund was proposed, with a second discounted
# line a wider candidate can reach for.
PAYMENT = {
    "payment_id": "pay_7781",
    "currency": "EUR",
    "status": "captured",
    "method": {"kind": "card", "last4": "4242", "usable": True},
    "lines": [
        {
            "line_id": "L2",
            "product": "Junior programme",
            "participant": "Léo Martin",
            "amount_cents": 12000,
            "discount": {
                "discount_id": "D-SIBLING",
                "name": "Sibling discount",
                "amount_cents": 1500,
            },
        },
        {
            "line_id": "L3",
            "product": "Summer camp",
            "participant": "Ada Martin",
            "amount_cents": 30000,
            "discount": {"discount_id": "D-EARLY", "name": "Early bird", "amount_cents": 4000},
        },
    ],
    "amount_cents": 42000,
    "refunded_cents": 0,
    "refunds": [],
}
FACTS = {"payment:pay_7781": PAYMENT}


def demo_manifests() -> dict[str, dict[str, Any]]:
    """The demo agents' snapshots, as a run of each starts with."""
    agents = AgentRegistry(
        [
            load_manifest(p.read_bytes(), path=str(p))
            for p in sorted((DEMO / "agents").glob("*.json"))
        ]
    )
    agents.resolve(actions=ACTIONS)
    out = {}
    for name in ("crm-assistant", "refund-assistant", "review-assistant"):
        snap = snapshot_of(agents.get(name))
        assert snap is not None
        out[name] = snap
    return out


def journaled_run(run_id: str, agent: str, manifest: dict[str, Any], user: str) -> list[Captured]:
    """A run of `agent` following the demo's decisions, journaled entry by entry."""
    entries: list[Captured] = []

    def add(kind: str, payload: msgspec.Struct) -> None:
        entries.append(
            Captured(seq=len(entries) + 1, kind=kind, payload=msgspec.to_builtins(payload))
        )

    started = RunStartedEntry(
        request_id=f"req-{run_id}",
        principal="alice@acme",
        agent=agent,
        input=user,
        evidence=EVIDENCE,
        manifest=manifest,
    )
    add(RUN_STARTED, started)
    observations: list[dict[str, Any]] = []
    seq = 0
    for turn, decision in enumerate(
        DEMO_DECISIONS["agents"].get(agent, DEMO_DECISIONS["decisions"])
    ):
        digest = input_digest(
            model_input(
                user=user,
                evidence=EVIDENCE,
                observations=observations,
                turn=turn,
                agent=agent,
                manifest=manifest,
            )
        )
        add(DECISION, DecisionEntry(seq=seq, turn=turn, input_digest=digest, response=decision))
        step, seq = seq, seq + 1
        kind = decision["decision"]
        if kind == "answer_directly":
            add(RUN_STATUS, StatusEntry(status="succeeded", step=step, answer=decision["answer"]))
            break
        if kind == "select_capability":
            action = decision["capability"].removeprefix("action:")
            add(PROPOSAL, ProposalEntry(step=step, action=action, arguments=decision["arguments"]))
            output: Any = CommandOutcome(
                tenant="acme",
                operation_id=f"op-{step}",
                run_id=run_id,
                step=step,
                action=action,
                state="succeeded",
                receipt="r-1",
            )
        else:
            output = ReviewAnswered(run_id=run_id, step=step, answer="approve", reviewer="ops@acme")
        observation = observation_of(output)
        add(
            OBSERVATION,
            ObservationEntry(
                seq=seq, step=step, output=msgspec.to_builtins(output), observation=observation
            ),
        )
        observations.append(observation)
        seq += 1
    return entries


def demo_runs() -> dict[str, list[Captured]]:
    """Three journaled demo runs: a CRM note, a refund, a note after a person's review."""
    m = demo_manifests()
    return {
        "run-note": journaled_run(
            "run-note",
            "crm-assistant",
            m["crm-assistant"],
            "Note the call about the delayed shipment",
        ),
        "run-refund": journaled_run(
            "run-refund",
            "refund-assistant",
            m["refund-assistant"],
            "Refund the missing sibling discount on order 7781",
        ),
        "run-review": journaled_run(
            "run-review",
            "review-assistant",
            m["review-assistant"],
            "Record the call, once a person confirmed it",
        ),
    }


def agreeing_script() -> dict[str, Any]:
    """A candidate that decides what the demo decided."""
    return {
        "decisions": DEMO_DECISIONS["decisions"],
        "agents": {
            a: DEMO_DECISIONS["agents"][a] for a in ("refund-assistant", "review-assistant")
        },
    }


def widening_script() -> dict[str, Any]:
    """A candidate that refunds where it should note, and refunds the larger line."""
    refund_l3 = {
        "decision": "select_capability",
        "capability": "payment.refund",
        "arguments": {"payment_id": "pay_7781", "line_id": "L3"},
    }
    script = agreeing_script()
    script["decisions"] = [
        {
            "decision": "select_capability",
            "capability": "payment.refund",
            "arguments": {"payment_id": "pay_7781", "line_id": "L2"},
        },
        *DEMO_DECISIONS["decisions"][1:],
    ]
    script["agents"]["refund-assistant"] = [
        refund_l3,
        *DEMO_DECISIONS["agents"]["refund-assistant"][1:],
    ]
    return script


def no_escalation_script() -> dict[str, Any]:
    """A candidate that answers where a person had to confirm first."""
    script = agreeing_script()
    script["agents"]["review-assistant"] = [
        {"decision": "answer_directly", "answer": "Recorded the call."}
    ]
    return script


READ_SEARCH: dict[str, Any] = {
    "decision": "select_capability",
    "capability": "tool:documents.search",
    "arguments": {"query": "delayed shipment order 7781", "limit": 5},
}


def read_run(run_id: str = "run-read") -> list[Captured]:
    """A journaled run of the research assistant: a documents search (recorded with its
    default limit written out), its result, then an answer."""
    agents = AgentRegistry(
        [
            load_manifest(p.read_bytes(), path=str(p))
            for p in sorted((DEMO / "agents").glob("*.json"))
        ]
    )
    agents.resolve(actions=ACTIONS)
    manifest = snapshot_of(agents.get("research-assistant"))
    user = "What do the tickets say about order 7781?"
    observation = {
        "tool": "documents.search",
        "items": [
            {"document_id": "doc-1", "title": "Delayed shipment", "text": EVIDENCE[0]["text"]}
        ],
        "untrusted": True,
    }
    entries: list[Captured] = []

    def add(kind: str, payload: msgspec.Struct) -> None:
        entries.append(
            Captured(seq=len(entries) + 1, kind=kind, payload=msgspec.to_builtins(payload))
        )

    add(
        RUN_STARTED,
        RunStartedEntry(
            request_id=f"req-{run_id}",
            principal="alice@acme",
            agent="research-assistant",
            input=user,
            evidence=EVIDENCE,
            manifest=manifest,
        ),
    )
    answer = {"decision": "answer_directly", "answer": "Order 7781 was delayed."}
    observations: list[dict[str, Any]] = []
    decisions: tuple[dict[str, Any], ...] = (READ_SEARCH, answer)
    for turn, decision in enumerate(decisions):
        digest = input_digest(
            model_input(
                user=user,
                evidence=EVIDENCE,
                observations=observations,
                turn=turn,
                agent="research-assistant",
                manifest=manifest,
            )
        )
        add(
            DECISION, DecisionEntry(seq=2 * turn, turn=turn, input_digest=digest, response=decision)
        )
        if turn == 0:
            add(
                OBSERVATION,
                ObservationEntry(seq=1, step=0, output=observation, observation=observation),
            )
            observations.append(observation)
    add(RUN_STATUS, StatusEntry(status="succeeded", step=2, answer=answer["answer"]))
    return entries
