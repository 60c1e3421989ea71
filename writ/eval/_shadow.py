"""Shadow mode: a candidate beside the production planner, on a copy of the runs that start.

The shadow connects as the NATS user `eval` (libs/natsauth.py): it learns of each run that
starts from the evidence it is handed to the planner with, through its own durable consumer, and may
publish under `writ.eval.>` only — the server refuses anything toward governance, admission or
the dispatcher. It follows each run through the planner's sealed journal, read with the
auditor's read-only role: at every decision point production reached, it rebuilds the model
input exactly as the planner did (the digest checked against the one journaled, `_case.py`),
asks the candidate, and judges the answer against production's decision there as a step case
is judged (`_score.py`): whether it is equivalent, the runtime's checks on the run's catalog,
the contract's `resolve` and preview against the facts admission recorded for production's
proposal (read-only, `_facts.py`; the given facts for what nothing was recorded for; it calls
no system: no connector, no dispatcher), governance's pure `decide` with the given policy,
scope widening. An ask or a review is recorded as "would ask", never sent to a person; a proposal is
recorded "would propose" with its resolved arguments, preview and ruling, never admitted.

Where the candidate leaves production's path there is nothing recorded to continue its own
run from, so nothing is invented: the next decision point asked is production's next one,
with production's input (`follows` says whether the candidate was still on that path).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig, DeliverPolicy

from libs.natsauth import EVAL
from schemas import subjects
from schemas.retrieval import EvidenceGathered
from services.planner.journal_entries import DECISION, OBSERVATION, RUN_STATUS, Captured
from services.planner.provider import SelectCapability
from services.planner.sessions._plans import PLANNED
from writ.eval._case import CaseError, EvalCase, cases_from_run, make_set
from writ.eval._facts import RecordedFacts
from writ.eval._report import Report, case_result, summarize
from writ.eval._run import _ask
from writ.eval._score import Judged, Sample, _call, judge

__all__ = [
    "EVIDENCE_COPY",
    "ShadowRecord",
    "Shadowed",
    "shadow",
    "shadow_reports",
    "shadow_run",
    "shadow_subject",
]

# What the shadow reads: the evidence of every run that starts (one stream, its own durable).
EVIDENCE_COPY: Final = subjects.evidence.filter
# A run is settled once it ended, or stopped for a person (it may go on later).
_ENDED: Final = frozenset({"succeeded", "failed", "cancelled"})
_MAX_FOLLOWED: Final = 1000

Replay = Callable[[str, str], Awaitable[list[Captured]]]
# What admission recorded for a run's proposals (`_facts.recorded_facts`), by tenant and run.
FactsOf = Callable[[str, str], Awaitable[list[RecordedFacts]]]
# Where the shadow publishes what its candidate would have done.
shadow_subject: Final = subjects.shadow


class ShadowRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the candidate would have done at one decision point of a production run."""

    run_id: str
    tenant: str
    agent: str
    step: int
    input_digest: str
    would: str  # ask | propose | read | call | answer | catalog | be refused | nothing
    decision: dict[str, Any] | None = None
    capability: str | None = None
    # A selection's arguments after the contract's `resolve`, and the preview a person would
    # have been shown.
    arguments: dict[str, Any] | None = None
    preview: dict[str, Any] | None = None
    ruling: str | None = None
    valid: bool = True
    invalid: str = ""
    tokens: int = 0
    # Production's decision at this point, and whether the candidate's is equivalent to it.
    production: dict[str, Any] | None = None
    follows: bool = False
    widening: list[str] = []
    violations: list[str] = []


def _record(
    case: EvalCase, run_id: str, tenant: str, step: int, sample: Sample, judged: Judged
) -> ShadowRecord:
    common: dict[str, Any] = {
        "run_id": run_id,
        "tenant": tenant,
        "agent": case.agent,
        "step": step,
        "input_digest": case.input_digest,
        "decision": sample.decision,
        "tokens": sample.tokens,
        "production": msgspec.to_builtins(case.expected),
        "follows": judged.agrees,
        "widening": judged.widening,
        "violations": judged.violations,
    }
    decision = sample.decision
    if decision is None or judged.kind is None:
        return ShadowRecord(
            **common, would="nothing", valid=False, invalid=judged.invalid or sample.detail
        )
    kind = decision.get("decision")
    if kind != "select_capability":
        would = {
            "request_human_review": "ask",
            "answer_directly": "answer",
            "request_capabilities": "catalog",
        }.get(str(kind), "nothing")
        return ShadowRecord(**common, would=would)
    got = _call(case, msgspec.convert(decision, SelectCapability))
    # A call the runtime refuses (not in the catalog, a bad signature) is never proposed.
    would = {"read": "read", "agent": "call", "refused": "be refused"}.get(
        got.kind, "ask" if got.ruling == "ask" else "propose"
    )
    return ShadowRecord(
        **common,
        would=would,
        capability=got.action or got.target,
        arguments=got.arguments or decision.get("arguments"),
        preview=got.preview or None,
        ruling=got.ruling,
        valid=not got.invalid,
        invalid=got.invalid,
    )


class Shadowed(msgspec.Struct, frozen=True, kw_only=True):
    """One shadowed decision point as a step case: what a report is summarised from."""

    tenant: str
    case: EvalCase
    sample: Sample
    judged: Judged


async def shadow_run(
    provider: Any,
    run_id: str,
    tenant: str,
    entries: list[Captured],
    *,
    asked: set[int],
    policy: dict[str, Any] | None = None,
    facts: dict[str, Any] | None = None,
    scored: list[Shadowed] | None = None,
    recorded: list[RecordedFacts] | None = None,
    settled: bool = False,
) -> list[ShadowRecord]:
    """Ask the candidate at each of the run's journaled decision points not in `asked` (which
    it extends) and judge it against production's decision there; each one also appended to
    `scored`, if given.

    A selection is judged against the facts admission `recorded` for the run's proposal (the
    given `facts` only for what nothing was recorded for), so it waits until the run went past
    it (a later step journaled) or is `settled`: admission records a proposal's facts before
    its verdict, and so before the run can go on. A selection a planning turn recorded as a
    plan's step waits until the run is `settled`: admission keeps its facts when the plan is
    proposed, before the turn waits for the user."""
    if -1 in asked:
        return []
    try:
        cases = cases_from_run(run_id, entries, facts=facts, policy=policy, recorded=recorded)
    except (CaseError, msgspec.ValidationError) as exc:
        # The journal does not rebuild the input production was given: nothing to ask, said
        # once.
        asked.add(-1)
        return [
            ShadowRecord(
                run_id=run_id,
                tenant=tenant,
                agent="",
                step=-1,
                input_digest="",
                would="nothing",
                valid=False,
                invalid=str(exc)[:500],
            )
        ]
    records = []
    planned = _planned(entries)
    for case in cases:
        step = int(case.case_id.rpartition("@")[2])
        if step in asked:
            continue
        if case.expected.kind == "select_capability" and not (
            settled or (_past(entries, step) and step not in planned)
        ):
            # Its facts may not be recorded yet (a proposal's before its verdict, a planned
            # selection's once its plan is proposed, when the run waits): at a later poll.
            continue
        asked.add(step)
        sample = await _ask(provider, case.input)
        judged = judge(case, sample)
        records.append(_record(case, run_id, tenant, step, sample, judged))
        if scored is not None:
            scored.append(Shadowed(tenant=tenant, case=case, sample=sample, judged=judged))
    return records


def shadow_reports(scored: list[Shadowed], candidate: str) -> dict[str, Report]:
    """Each tenant's shadowed decision points as a report (mode `shadow`, k = 1): the cases
    are production's decisions, so the scores and the gate read as in step mode."""
    reports = {}
    for tenant in sorted({s.tenant for s in scored}):
        mine = {s.case.case_id: s for s in scored if s.tenant == tenant}
        eval_set = make_set(tenant, [s.case for s in mine.values()])
        results = [
            case_result(
                c.case_id,
                msgspec.to_builtins(c.expected),
                [mine[c.case_id].sample],
                [mine[c.case_id].judged],
            )
            for c in eval_set.cases
        ]
        reports[tenant] = summarize(eval_set, candidate, results, k=1, mode="shadow")
    return reports


def _past(entries: list[Captured], step: int) -> bool:
    """Whether the run journaled a step after `step` (a decision's or observation's own `seq`,
    not the entry's place in the chain)."""
    return any(
        e.kind in (DECISION, OBSERVATION) and int(e.payload.get("seq", -1)) > step for e in entries
    )


def _planned(entries: list[Captured]) -> set[int]:
    """The steps whose selection a planning turn recorded as a plan's step (`PLANNED`)."""
    return {
        int(e.payload.get("step", -1))
        for e in entries
        if e.kind == OBSERVATION and (e.payload.get("observation") or {}).get("refused") == PLANNED
    }


def _status(entries: list[Captured]) -> str | None:
    statuses = [e.payload.get("status") for e in entries if e.kind == RUN_STATUS]
    return str(statuses[-1]) if statuses else None


class _Followed(msgspec.Struct, kw_only=True):
    tenant: str
    asked: set[int] = msgspec.field(default_factory=set)
    counted: bool = False
    # Polls to skip: a run waiting for a person is looked at again only now and then.
    skip: int = 0


# A run waiting for a person is re-read every this many polls (it may go on after an answer).
_WAITING_EVERY: Final = 20


async def shadow(
    nc: Client,
    provider: Any,
    *,
    replay: Replay,
    policy: dict[str, Any] | None = None,
    facts: dict[str, Any] | None = None,
    count: int | None = None,
    poll_s: float = 0.5,
    on_record: Callable[[ShadowRecord], None] | None = None,
    on_ready: Callable[[], None] | None = None,
    scored: list[Shadowed] | None = None,
    facts_of: FactsOf | None = None,
) -> list[ShadowRecord]:
    """Shadow the runs that start from now until `count` of them settled (ended, or stopped
    for a person), or until cancelled. `replay(tenant, run_id)` is the run's sealed journal
    entries (read-only), `facts_of(tenant, run_id)` the facts admission recorded for its
    proposals (read-only; without it, `facts` only). A run that ended is dropped; one waiting
    for a person is read again every `_WAITING_EVERY` polls, since it may go on once
    answered."""
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        EVIDENCE_COPY,
        durable=EVAL,
        stream="WRIT_INT",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
    )
    decoder = msgspec.json.Decoder(EvidenceGathered)
    # The durable outlives a shadow: what it holds from before this one started is not a run
    # that starts beside it.
    since = datetime.now(UTC)
    if on_ready is not None:
        on_ready()
    followed: dict[str, _Followed] = {}
    records: list[ShadowRecord] = []
    settled = 0
    while count is None or settled < count:
        try:
            msgs = await sub.fetch(8, timeout=poll_s)
        except (NatsTimeoutError, TimeoutError):  # a batch fetch raises the builtin one
            msgs = []
        for msg in msgs:
            try:
                event = decoder.decode(msg.data)
            except msgspec.DecodeError:
                event = None  # not a run to follow; never the shadow's to stop over
            if (
                event is not None
                and msg.metadata.timestamp >= since
                and len(followed) < _MAX_FOLLOWED
            ):
                followed.setdefault(event.run_id, _Followed(tenant=event.tenant))
            await msg.ack()
        for run_id, run in list(followed.items()):
            if run.skip > 0:
                run.skip -= 1
                continue
            entries = await replay(run.tenant, run_id)
            status = _status(entries)
            for record in await shadow_run(
                provider,
                run_id,
                run.tenant,
                entries,
                asked=run.asked,
                policy=policy,
                facts=facts,
                scored=scored,
                recorded=None if facts_of is None else await facts_of(run.tenant, run_id),
                settled=status in _ENDED or status == "awaiting_human",
            ):
                await nc.publish(shadow_subject(run.tenant), msgspec.json.encode(record))
                records.append(record)
                if on_record is not None:
                    on_record(record)
            if status in _ENDED or status == "awaiting_human":
                settled += not run.counted
                run.counted = True
            if status in _ENDED:
                del followed[run_id]
            elif status == "awaiting_human":
                run.skip = _WAITING_EVERY - 1
    return records
