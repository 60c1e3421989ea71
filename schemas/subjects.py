"""Subjects and streams: the bus's address book.

Host-facing subjects (`writ.in.*`, `writ.out.*`) are a public contract, versioned by
`HOST_API_VERSION` and documented in the README. Internal subjects live under `writ.int.`, with
the tenant as the last token so permissions and limits can follow tenants.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

__all__ = [
    "ADMISSION_IN",
    "ANSWER",
    "DECIDE",
    "DECIDE_BATCH",
    "FACTS",
    "HOST_FACTS",
    "MCP_CATALOG",
    "MCP_CLASSIFY",
    "MCP_LIST",
    "MCP_LISTING",
    "DISPATCH_IN",
    "GOVERNANCE_IN",
    "PENDING_LIST",
    "REGISTER_RUN",
    "REGISTER_TURN",
    "HOST_API_VERSION",
    "HOST_KINDS",
    "INGRESS_IN",
    "JOURNAL_RECORD",
    "JOURNAL_RECORD_STREAM",
    "PLANNER_IN",
    "READ",
    "RECONCILE",
    "REPLAY",
    "RESERVE",
    "SEARCH",
    "SETTLE",
    "STREAMS",
    "TENANT_PATTERN",
    "in_stream",
    "out_stream",
    "tenant_streams",
    "valid_tenant",
    "UNKNOWN_LIST",
    "StreamSpec",
    "admitted",
    "answer",
    "answered",
    "approval",
    "branch",
    "command",
    "command_request",
    "dead_letter",
    "evidence",
    "host_subjects",
    "human_decision",
    "journal_checkpoints",
    "outcome",
    "planner_progress",
    "proposal",
    "proposal_answer",
    "refused",
    "request",
    "result",
    "review",
]

HOST_API_VERSION: Final = "1"


# Host-facing.
def request(tenant: str) -> str:
    """Where a host publishes a `RunRequest`."""
    return f"writ.in.requests.{tenant}"


def result(tenant: str) -> str:
    """Where a host reads `RunResult`s (a stream: an offline host catches up)."""
    return f"writ.out.results.{tenant}"


def human_decision(tenant: str) -> str:
    """Where an approver publishes a `HumanDecision`."""
    return f"writ.in.decisions.{tenant}"


def answer(tenant: str) -> str:
    """Verified answers, from ingress to governance."""
    return f"writ.int.answers.{tenant}"


def answered(tenant: str) -> str:
    """Decided pending decisions, from governance: to admission (about a proposal) and to the
    planner (about a read a run stopped for)."""
    return f"writ.int.answered.{tenant}"


def approval(tenant: str) -> str:
    """Where an approver publishes an `ApproveProposal` (approve or reject, by proposal id)."""
    return f"writ.in.approvals.{tenant}"


def proposal_answer(tenant: str) -> str:
    """Verified approvals and rejections of proposals, from ingress to admission."""
    return f"writ.int.approvals.{tenant}"


def review(tenant: str) -> str:
    """Where an approver publishes a `ReviewDecision` (approve or reject a requested review);
    ingress forwards it to the planner (`schemas.planner.REVIEW`) by request/reply."""
    return f"writ.in.reviews.{tenant}"


def command_request(tenant: str) -> str:
    """Where a host publishes a `SubmitCommand`."""
    return f"writ.in.commands.{tenant}"


# Internal, one event type per subject family.
def branch(tenant: str) -> str:
    """`BranchChanged`: a run the planner drives as a branch of another started or ended (the
    planner's own inbox, under the runs' family so WRIT_INT keeps it)."""
    return f"writ.int.runs.branch.{tenant}"


def evidence(tenant: str) -> str:
    return f"writ.int.evidence.{tenant}"


def proposal(tenant: str) -> str:
    return f"writ.int.proposals.{tenant}"


def admitted(tenant: str) -> str:
    """`CommandAdmitted` progress events: core NATS only, in no stream (nothing depends on them;
    the audit journal is the record)."""
    return f"writ.int.admitted.{tenant}"


def outcome(tenant: str, origin: str = "run") -> str:
    """A command's outcome; `origin` (run | host) says who waits for it."""
    return f"writ.int.outcomes.{origin}.{tenant}"


def refused(tenant: str) -> str:
    """Proposals of runs that did not become commands (the planner's concern)."""
    return f"writ.int.refused.{tenant}"


def planner_progress(tenant: str) -> str:
    """`StepRecorded` progress events: core NATS only, in no stream (watchers, the demo's
    timeline)."""
    return f"writ.events.planner.{tenant}"


def command(tenant: str) -> str:
    """Admitted commands, relayed from the outbox; `Nats-Msg-Id` = `<tenant>:<operation_id>`."""
    return f"writ.cmd.{tenant}"


def dead_letter(consumer: str) -> str:
    return f"writ.dlq.{consumer}"


def journal_checkpoints(service: str) -> str:
    """`JournalCheckpoint`s of one service's audit journal: its sealer publishes them, in the
    append-only `WRIT_AUDIT` stream; `writ audit verify` reads them."""
    return f"writ.audit.checkpoints.{service}"


DECIDE: Final = "writ.int.governance.decide"
# `DecideBatch` -> `Decisions`: the same decisions, several per request/reply.
DECIDE_BATCH: Final = "writ.int.governance.decide_batch"
# `RegisterRun` (from ingress only: a verified host's request) and `RegisterTurn` (from the
# planner only: a chat turn, which carries no grants of its own). NATS lets each service
# publish its own subject only, so governance knows who registered from where it arrived.
REGISTER_RUN: Final = "writ.int.governance.register_run"
REGISTER_TURN: Final = "writ.int.governance.register_turn"
PENDING_LIST: Final = "writ.int.governance.pending"
UNKNOWN_LIST: Final = "writ.int.dispatcher.unknown"
RECONCILE: Final = "writ.int.dispatcher.reconcile"
# The state a proposal's preview stands on, read by the one service holding the credentials.
FACTS: Final = "writ.int.dispatcher.facts"
# Record a person's answer to a pending decision and say what it became (admission asks it when
# a proposal is approved by its id).
ANSWER: Final = "writ.int.governance.answer"
# Run budgets: reserve before a step starts (`ReserveBudget` -> `BudgetReserved` |
# `BudgetRefused`), settle when it ends (`SettleBudget` -> `BudgetSettled`). libs/budget.py.
RESERVE: Final = "writ.int.governance.reserve"
SETTLE: Final = "writ.int.governance.settle"
# Execute a read tool for a run (`ReadCapability` -> `ReadResult` | `ReadRefused`), after
# governance's `decide`; the tools and their catalog are `schemas.retrieval.READ_TOOLS`.
READ: Final = "writ.int.retrieval.read"
# A starting run's evidence (`SearchEvidence`), asked of retrieval by whoever starts the run.
SEARCH: Final = "writ.int.retrieval.search"
# Federation (schemas/mcp.py): retrieval records each `tools/list` with governance
# (`RecordListing` -> `ListingRecorded`); an operator lists a server now through retrieval
# (`ListServer` -> `ServerListing`) and classifies a tool with governance (`ClassifyTool` ->
# `ToolClassified`); admission reads a host record a preview stands on through retrieval
# (`ReadFacts` -> `FactsRead`), the only holder of the MCP credential.
MCP_LISTING: Final = "writ.int.governance.mcp.listing"
MCP_CLASSIFY: Final = "writ.int.governance.mcp.classify"
MCP_LIST: Final = "writ.int.retrieval.mcp.list"
# The planner's catalog of a run's `mcp:` capabilities, as classified (`DescribeTools` ->
# `ToolDescriptions`).
MCP_CATALOG: Final = "writ.int.retrieval.mcp.catalog"
HOST_FACTS: Final = "writ.int.retrieval.facts"
# Replay a run offline from the planner's audit journal (`ReplayRun` -> `ReplayReport`).
REPLAY: Final = "writ.int.planner.replay"

# Inbox filters of each durable consumer.
# What a host may send: `writ.in.<kind>.<tenant>`, one stream per tenant (`tenant_streams`).
HOST_KINDS: Final = ("requests", "commands", "decisions", "approvals", "reviews", "cancels")
INGRESS_IN: Final = tuple(f"writ.in.{kind}.*" for kind in HOST_KINDS)
GOVERNANCE_IN: Final = ("writ.int.answers.*",)
PLANNER_IN: Final = (
    "writ.int.evidence.*",
    "writ.int.outcomes.run.*",
    "writ.int.refused.*",
    "writ.int.runs.branch.*",
    "writ.int.answered.*",
    "writ.int.runs.cancel.*",
)
ADMISSION_IN: Final = (
    "writ.int.proposals.*",
    "writ.int.outcomes.host.*",
    "writ.int.answered.*",
    "writ.int.approvals.*",
)
DISPATCH_IN: Final = ("writ.cmd.*",)


class StreamSpec(msgspec.Struct, frozen=True):
    """A JetStream stream Writ declares at start-up.

    `append_only`: the stream refuses deleting a message, purging and rollups (deny_delete,
    deny_purge, no rollup headers), and the server refuses any update that lifts either denial.
    """

    name: str
    subjects: tuple[str, ...]
    max_age_s: float
    duplicate_window_s: float = 120.0
    append_only: bool = False


_DAY: Final = 86400.0
JOURNAL_RECORD_STREAM: Final = "WRIT_AUDIT"
# Writ's streams, which provisioning creates in Writ's account (libs/provision.py), beside
# each tenant's own (`tenant_streams`).
STREAMS: Final = (
    StreamSpec(
        "WRIT_INT",
        (
            "writ.int.runs.>",
            "writ.int.evidence.>",
            "writ.int.proposals.>",
            "writ.int.outcomes.>",
            "writ.int.answers.>",
            "writ.int.answered.>",
            "writ.int.refused.>",
            "writ.int.approvals.>",
        ),
        7 * _DAY,
    ),
    StreamSpec("WRIT_CMD", ("writ.cmd.>",), 7 * _DAY, duplicate_window_s=3600.0),
    StreamSpec("WRIT_DLQ", ("writ.dlq.>",), 30 * _DAY),
    # Chat sessions' event streams, one subject per session (`writ.chat.<tenant>.<session>`,
    # schemas/sessions.py); the planner publishes each numbered event with `chat:<id>:<n>`.
    StreamSpec("WRIT_CHAT", ("writ.chat.>",), 30 * _DAY, duplicate_window_s=600.0),
)
# The audit journals' checkpoints, kept as long as the journals (forever: no max age). Not one
# of Writ's streams: it lives in an account of its own (`AUDIT`, libs/natsauth.py), where no
# runtime identity's publish, and so no JetStream acknowledgement it steers, can reach it.
JOURNAL_RECORD: Final = StreamSpec(
    JOURNAL_RECORD_STREAM, ("writ.audit.checkpoints.>",), 0.0, append_only=True
)


# A tenant is one subject token and part of stream names: letters, digits, `_` and `-`.
TENANT_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
_TENANT = re.compile(TENANT_PATTERN)


def valid_tenant(tenant: str) -> bool:
    """Whether `tenant` can name subjects and streams (one token, no wildcard, no dot)."""
    return _TENANT.match(tenant) is not None


def host_subjects(tenant: str) -> tuple[str, ...]:
    """Every subject a tenant's host may publish on."""
    return tuple(f"writ.in.{kind}.{tenant}" for kind in HOST_KINDS)


def in_stream(tenant: str) -> str:
    """The stream of one tenant's host messages (`writ.in.<kind>.<tenant>`)."""
    return f"WRIT_IN_{tenant}"


def out_stream(tenant: str) -> str:
    """The stream of one tenant's results (`writ.out.results.<tenant>`)."""
    return f"WRIT_OUT_{tenant}"


def tenant_streams(tenant: str) -> tuple[StreamSpec, StreamSpec]:
    """One tenant's inbound and result streams.

    A stream per tenant, because JetStream's `Nats-Msg-Id` dedupe is per stream: in one shared
    stream tenant B's request with the id tenant A used would be dropped as A's duplicate.
    Only `writ.in.<kind>.<tenant>` of a known kind is stored (nothing that nobody consumes),
    and a tenant Writ does not hold has no stream: a publish there is refused, nothing stored.
    NATS permissions (libs/natsauth.py) give a tenant's host exactly these two streams.
    """
    if not valid_tenant(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}")
    return (
        StreamSpec(in_stream(tenant), host_subjects(tenant), 7 * _DAY, duplicate_window_s=3600.0),
        StreamSpec(out_stream(tenant), (result(tenant),), 7 * _DAY),
    )
