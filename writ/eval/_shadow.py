"""Shadow mode: a candidate beside the production planner, on a copy of the runs that start.

The shadow connects as the NATS user `eval` (libs/natsauth.py): it reads the evidence retrieval
gathers for each run through its own durable consumer, and may publish under `writ.eval.>`
only — the server refuses anything toward governance, admission or the dispatcher. For each run
it builds the first model input exactly as the planner does (so its digest is the one the
planner journals), asks the candidate, and judges the answer as a proposal would be: the
runtime's checks on the run's catalog, the contract's `resolve` (against facts it was given; it
reads none), and governance's pure `decide` with the given policy. An ask or a review is
recorded as "would ask", never sent to a person; a proposal is recorded "would propose" with
its ruling, never admitted. The run goes on in production, unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy

from libs.natsauth import EVAL
from schemas.retrieval import EvidenceGathered
from services.planner.inputs import input_digest, model_input
from services.planner.provider import DecisionProvider, SelectCapability
from writ.eval._case import EvalCase, Expected
from writ.eval._run import _ask
from writ.eval._score import _call

__all__ = ["EVIDENCE_COPY", "ShadowRecord", "shadow", "shadow_subject"]

# What the shadow reads: the evidence of every run that starts (one stream, its own durable).
EVIDENCE_COPY: Final = "writ.int.evidence.*"


def shadow_subject(tenant: str) -> str:
    """Where the shadow publishes what its candidate would have done."""
    return f"writ.eval.shadow.{tenant}"


class ShadowRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the candidate would have done at a run's first decision."""

    run_id: str
    tenant: str
    agent: str
    input_digest: str
    would: str  # ask | propose | read | answer | catalog | nothing
    decision: dict[str, Any] | None = None
    capability: str | None = None
    arguments: dict[str, Any] | None = None
    ruling: str | None = None
    valid: bool = True
    invalid: str = ""
    tokens: int = 0


def _judged(case: EvalCase, decision: dict[str, Any] | None) -> dict[str, Any]:
    if decision is None:
        return {"would": "nothing", "valid": False}
    kind = decision.get("decision")
    if kind == "request_human_review":
        return {"would": "ask"}
    if kind == "answer_directly":
        return {"would": "answer"}
    if kind == "request_capabilities":
        return {"would": "catalog"}
    got = _call(case, msgspec.convert(decision, SelectCapability))
    would = ("read" if got.kind == "read" else "ask" if got.ruling == "ask" else "propose")
    return {"would": would, "capability": got.action or got.target,
            "arguments": got.arguments or decision.get("arguments"), "ruling": got.ruling,
            "valid": not got.invalid, "invalid": got.invalid}


async def shadow(nc: Client, provider: DecisionProvider, *,
                 manifests: Callable[[str], dict[str, Any] | None],
                 policy: dict[str, Any] | None = None, facts: dict[str, Any] | None = None,
                 count: int | None = None,
                 on_record: Callable[[ShadowRecord], None] | None = None,
                 on_ready: Callable[[], None] | None = None) -> list[ShadowRecord]:
    """Shadow the runs that start (all of them, or the next `count`) until cancelled."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(EVIDENCE_COPY, durable=EVAL, stream="WRIT_INT",
                                  config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW))
    decoder = msgspec.json.Decoder(EvidenceGathered)
    if on_ready is not None:
        on_ready()
    records: list[ShadowRecord] = []
    while count is None or len(records) < count:
        try:
            msgs = await sub.fetch(1, timeout=1)
        except NatsTimeoutError:
            continue
        for msg in msgs:
            event = decoder.decode(msg.data)
            manifest = manifests(event.agent)
            built = model_input(user=event.input, evidence=msgspec.to_builtins(event.evidence),
                                observations=[], turn=0, agent=event.agent, manifest=manifest)
            case = EvalCase(case_id=event.run_id, agent=event.agent, input=built,
                            input_digest=input_digest(built),
                            expected=Expected(kind="answer_directly"), manifest=manifest,
                            facts=facts or {}, policy=policy)
            sample = await _ask(provider, built)
            record = ShadowRecord(run_id=event.run_id, tenant=event.tenant, agent=event.agent,
                                  input_digest=case.input_digest, decision=sample.decision,
                                  tokens=sample.tokens, **_judged(case, sample.decision))
            await nc.publish(shadow_subject(event.tenant), msgspec.json.encode(record))
            await msg.ack()
            records.append(record)
            if on_record is not None:
                on_record(record)
    return records
