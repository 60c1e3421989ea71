"""Offline replay of a run from the planner's audit journal (docs/design.md §7). No I/O here.

`replay_run` walks a run's journal entries (`journal_entries.py`) in chain order without calling
a model or running a tool: each captured response must decode as a decision, each model input
must be the one the captured evidence and tool outputs give (`inputs.py`), each observation the
one its captured output gives (`observations.py`), and what the runtime did next must be what the
decision implies, given the run's agent snapshot (`snapshot.py`): a `select_capability` that
passes the runtime's checks becomes a proposal of that action with those arguments, whose output
is then observed — or, for a read tool, is read by retrieval and its answer observed, with no
proposal; for another agent, is called as a branch — a run of its own, journaled under its own
id and replayed on its own — whose end is observed — and one that fails them becomes the refusal
the model observes next; a `request_capabilities` is followed by another decision, made over the
catalog; a `request_human_review` stops the run for a person; an `answer_directly` ends the run
succeeded with that answer — or, for an agent with a critic, is followed by the critic's verdict:
`accept` ends the run with the answer, `replan` becomes an observation and another decision; a
refusal fails it; a budget that ran out fails it with `BUDGET_EXHAUSTED` where a new step would
have started. Given the runtime's own record (`planner.runs`, `planner.steps`), it also compares
that record with what was captured. The verdict is `identical`, `divergent` (each divergence
listed) or `incomplete` (a captured response or tool output is missing, or the run has not
ended). The walk itself, entry by entry, is `_walk.py`.
"""

from __future__ import annotations

from typing import Literal

from schemas.planner import ReplayReport
from services.planner.journal_entries import Captured, RunRecord, StatusEntry
from services.planner.replay._expect import canon, show
from services.planner.replay._walk import Walk

__all__ = ["expired", "render", "replay_run"]


def replay_run(
    run_id: str, entries: list[Captured], *, record: RunRecord | None = None, unsealed: int = 0
) -> ReplayReport:
    """Walk a run's captured entries (in chain order) offline and say what the walk found.

    `record` is the runtime's own record of the run, compared with what was captured; `unsealed`
    is how many of the run's journal rows are not sealed yet (not evidence yet).
    """
    walk = Walk(run_id, unsealed)
    for captured in sorted(entries, key=lambda c: c.seq):
        walk.entry(captured)
    walk.end()
    if record is not None:
        _compare(walk, record)
    verdict: Literal["identical", "divergent", "incomplete"] = (
        "divergent" if walk.divergences else "incomplete" if walk.missing else "identical"
    )
    return ReplayReport(
        run_id=run_id,
        verdict=verdict,
        divergences=walk.divergences,
        missing=walk.missing,
        entries=len(entries),
    )


def _compare(walk: Walk, record: RunRecord) -> None:
    """The runtime's record against what was captured."""
    recorded = {s.seq: s for s in record.steps}

    def differs(step: int | None, expected: str, found: str) -> None:
        if walk.unsealed:  # what differs may simply not be sealed yet
            walk.lacks(f"step {step}: {found}{walk.unsealed_note()}")
        else:
            walk.diverged(step, expected, found)

    for seq in sorted(set(recorded) | set(walk.steps)):
        captured, row = walk.steps.get(seq), recorded.get(seq)
        if row is None:
            assert captured is not None
            differs(
                seq,
                f"the captured {captured.kind} in planner.steps",
                "no such step in the runtime's record",
            )
        elif captured is None:
            differs(
                seq,
                "a journal entry for every recorded step",
                f"a recorded {row.kind} the journal never captured",
            )
        elif row.kind != captured.kind or canon(row.payload) != canon(captured.payload):
            walk.diverged(
                seq,
                f"{captured.kind} {show(captured.payload)} (captured)",
                f"{row.kind} {show(row.payload)} (planner.steps)",
            )
        elif captured.input_digest is not None and row.input_digest != captured.input_digest:
            walk.diverged(
                seq,
                f"model input sha256 {captured.input_digest} (captured)",
                f"sha256 {row.input_digest} (planner.steps)",
            )
    last = walk.last_status or StatusEntry(status="running")
    want = (last.status, last.answer, last.error_code, last.error_message)
    have = (record.status, record.answer, record.error_code, record.error_message)
    if want != have:
        differs(
            None, f"the run {show(list(want))} (captured)", f"{show(list(have))} (planner.runs)"
        )
    for expected, found in walk.plans.compare(record.plans):
        differs(None, expected, found)
    if walk.started is not None and canon(record.evidence) != canon(walk.started.evidence):
        walk.diverged(
            None,
            f"the evidence the model saw: {show(walk.started.evidence)}",
            f"{show(record.evidence)} (planner.runs)",
        )


def expired(run_id: str, window: str) -> ReplayReport:
    """The report on a run whose payloads have expired: incomplete, never divergent (what is
    gone cannot be compared, and its digests are still checked by `writ audit verify`)."""
    return ReplayReport(
        run_id=run_id, verdict="incomplete", missing=[f"payloads expired (window {window})"]
    )


def render(report: ReplayReport) -> str:
    """A readable report (`writ audit replay`)."""
    lines = [
        f"run {report.run_id}: {report.verdict.upper()} ({report.entries} captured "
        "entries replayed; no model called, no tool run)"
    ]
    for d in report.divergences:
        where = f"step {d.step}" if d.step is not None else "run"
        lines += [f"  {where}:", f"    expected {d.expected}", f"    found    {d.found}"]
    lines += [f"  missing: {m}" for m in report.missing]
    return "\n".join(lines)
