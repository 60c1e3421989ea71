# A copy of schemas/planner.py made by clients/python/copy_wire.py: do not edit.
"""Proposals of side effects, for admission to judge: from the planner, or from ingress when a
host submits a command directly; the offline replay of a run the planner answers; and a
person's answer to a review a run's agent asked for."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Final, Literal

import msgspec

from .base import AgentName, Command, Digest, Event, Id, Principal, ShortText, Tenant
from .host import RunStatus
from .subjects import REVIEW as REVIEW

__all__ = [
    "BRANCH_MARK",
    "REVIEW",
    "BranchChanged",
    "Divergence",
    "ProposeCommand",
    "ReplayReport",
    "ReplayRun",
    "ReviewAnswer",
    "ReviewTaken",
    "StepRecorded",
    "branch_run_id",
    "preview_digest",
    "root_run_id",
]


# A branch run (a run's call of another agent at one of its steps) is `<caller>.b<step>`. The
# runs ingress starts have no '.' in their ids (a uuid, or `cmd-<uuid>`), so a branch's root
# is what comes before its first mark. Governance judges a branch's calls by its root run:
# the host's run grants, whether a person watches, the budget and its clock are the root's.
BRANCH_MARK: Final = ".b"


def branch_run_id(run_id: str, step: int) -> str:
    """The branch a run's call at `step` starts: the same on every attempt of that step."""
    return f"{run_id}{BRANCH_MARK}{step}"


def preview_digest(preview: dict[str, Any]) -> str:
    """sha256 of a preview's canonical JSON (keys sorted): how admission tells that the preview
    it resolved now is the one an approved plan showed (`ProposeCommand.plan_preview`)."""
    return hashlib.sha256(msgspec.json.encode(preview, order="sorted")).hexdigest()


def root_run_id(run_id: str) -> str:
    """The run ingress started that `run_id` is (a root run) or descends from (a branch)."""
    return run_id.split(BRANCH_MARK, 1)[0]


class ProposeCommand(Command, frozen=True):
    """The model asks for an action; admission validates it against the action's contract.

    `arguments` is what the model wrote, untyped on purpose: only admission turns it into the
    contract's typed arguments, and rejects what does not fit.
    """

    run_id: Id
    step: Annotated[int, msgspec.Meta(ge=0, le=1000)]
    tenant: Tenant
    principal: Principal
    agent: AgentName
    action: ShortText
    arguments: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
    expected_revision: ShortText | None = None
    # Set when a host submitted the command itself (no planner involved): the host's own key,
    # and the request to answer on `writ.out.results.<tenant>`.
    operation_key: Id | None = None
    request_id: Id | None = None
    # A step of a plan the user approved (a chat session's plan-mode): the `preview_digest` of
    # the preview the plan showed for it. Admission refuses the proposal if the preview it
    # resolves from the facts now differs: the approval consented to that preview only.
    plan_preview: Digest | None = None


class ReplayRun(Command, frozen=True):
    """Replay one run offline from the planner's audit journal (`writ.int.planner.replay`).

    No model is called and no tool is run: the captured responses and outputs are walked.
    """

    tenant: Tenant
    run_id: Id


class Divergence(msgspec.Struct, frozen=True, kw_only=True):
    """Where the runtime did not do what a captured response or output implies."""

    step: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] | None
    expected: ShortText
    found: ShortText


class ReplayReport(Event, frozen=True):
    """The answer to `ReplayRun`: identical, divergent (each divergence) or incomplete (what is
    missing: a captured response or tool output, or the run's end)."""

    run_id: Id
    verdict: Literal["identical", "divergent", "incomplete"]
    divergences: Annotated[list[Divergence], msgspec.Meta(max_length=100)] = []
    missing: Annotated[list[ShortText], msgspec.Meta(max_length=100)] = []
    entries: Annotated[int, msgspec.Meta(ge=0)] = 0  # captured entries replayed


class ReviewAnswer(Command, frozen=True):
    """A person's explicit answer to the review a run's agent requested (`request_human_review`)
    at `step`: approve resumes the run, reject fails it with `REJECTED` and the reason."""

    tenant: Tenant
    run_id: Id
    step: Annotated[int, msgspec.Meta(ge=0, le=1000)]
    answer: Literal["approve", "reject"]
    reviewer: Principal
    reason: ShortText = ""


class ReviewTaken(Event, frozen=True):
    """The planner's reply to a `ReviewAnswer` it took: where the run stands now. `running`: it
    goes on (its `RunResult` follows on the host's results when it ends or stops again)."""

    run_id: Id
    status: Literal["running"] | RunStatus


class StepRecorded(Event, frozen=True):
    """A step of a run was committed: a model decision, a critic verdict or an observation."""

    tenant: Tenant
    run_id: Id
    seq: Annotated[int, msgspec.Meta(ge=0)]
    kind: ShortText  # decision | critic | observation
    decision: ShortText | None = None  # the decision's type
    target: ShortText | None = None  # what a select_capability names
    verdict: ShortText | None = None  # the critic's
    summary: ShortText = ""  # of an observation: what ran and how it ended, no content


class BranchChanged(Event, frozen=True):
    """The planner to itself: run `run_id` has something new to do, because a branch it called
    started (the branch's first step), a branch of it ended or stopped for a person (its answer
    to observe, or its wait to share), or a person's answer was recorded outside the inbox and
    the step after it is to be taken (retried) here.

    It carries no state: the planner reads both runs from its store, so a redelivery or a
    duplicate advances nothing twice.
    """

    tenant: Tenant
    run_id: Id
