# A copy of schemas/subjects.py made by clients/python/copy_wire.py: do not edit.
"""Subjects and streams: the bus's address book, the one table every subject is declared in.

Each subject is declared once here (`TABLE`): its pattern, who handles it, its kind and what it
means. Everything else is derived from the table: the durable consumers' filters (`inbox`), the
NATS permissions (libs/natsauth.py), the AsyncAPI channels (writ/asyncapi.py); other schema
modules re-export the names their readers know. What a row is made of (`Subject`, the table, how
a row is declared, `inbox`, `StreamSpec`, tenant and stream names) is `_subjects.py`, re-exported
here; the rows and every subject literal are in this module. `tests/unit/test_subjects.py`
fails when a subject is spelled as a string anywhere else.

Host-facing subjects (`writ.in.*`, `writ.out.*`, `writ.api.*`, `writ.events.*`, `writ.chat.*`)
are a public contract, versioned by `HOST_API_VERSION` (docs/subjects.md). Internal subjects live
under `writ.int.`, with the tenant as the last token so permissions and limits can follow tenants.
"""

from __future__ import annotations

from typing import Final

from ._subjects import (
    TABLE,
    TENANT_PATTERN,
    Kind,
    StreamSpec,
    Subject,
    in_stream,
    inbox,
    out_stream,
    valid_tenant,
)
from ._subjects import declare as _declare
from ._subjects import endpoint as _endpoint

__all__ = [
    "ADMISSION_IN",
    "ANSWER",
    "CHAT_FAMILY",
    "CHECKPOINT_FAMILY",
    "COMMAND_FAMILY",
    "COMMAND_STATUS",
    "DEAD_LETTER_FAMILY",
    "DECIDE",
    "DECIDE_BATCH",
    "EVAL_FAMILY",
    "FACTS",
    "HOST_FACTS",
    "HOST_IN_FAMILY",
    "HOST_OUT_FAMILY",
    "INTERNAL_FAMILY",
    "MCP_CATALOG",
    "MCP_CLASSIFY",
    "MCP_LIST",
    "MCP_LISTING",
    "MCP_SERVERS",
    "DISPATCH_IN",
    "GOVERNANCE_IN",
    "JOURNALED",
    "Kind",
    "PENDING_LIST",
    "SPEND_LIST",
    "PROPOSAL_GET",
    "PLAN_FACTS",
    "PROPOSALS_LIST",
    "REGISTER_RUN",
    "REGISTER_TURN",
    "REVIEW",
    "REVIEWS_LIST",
    "RUN_EVENTS",
    "RUN_STATUS",
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
    "SESSION_OPS",
    "SETTLE",
    "STREAMS",
    "Subject",
    "TABLE",
    "TENANT_PATTERN",
    "TURN_CANCELLING",
    "in_stream",
    "inbox",
    "out_stream",
    "tenant_streams",
    "valid_tenant",
    "UNKNOWN_LIST",
    "WORK_FAMILIES",
    "StreamSpec",
    "admitted",
    "answer",
    "answered",
    "approval",
    "branch",
    "cancel",
    "chat_subject",
    "command",
    "command_request",
    "dead_letter",
    "evidence",
    "host_read",
    "host_subjects",
    "human_decision",
    "journal_checkpoints",
    "journal_verify",
    "outcome",
    "planner_progress",
    "proposal",
    "proposal_answer",
    "refused",
    "request",
    "result",
    "review",
    "run_cancel",
    "shadow",
    "turn_cancelling",
]

HOST_API_VERSION: Final = "1"


# Host-facing: what a host may send, `writ.in.<kind>.<tenant>`, one stream per tenant
# (`tenant_streams`), read by ingress's durable consumer of that tenant.
request: Final = _declare(
    "requests",
    "writ.in.requests.{tenant}",
    "stream",
    ("ingress",),
    "Where a host publishes a `RunRequest`.",
)
command_request: Final = _declare(
    "commands",
    "writ.in.commands.{tenant}",
    "stream",
    ("ingress",),
    "Where a host publishes a `SubmitCommand`.",
)
human_decision: Final = _declare(
    "decisions",
    "writ.in.decisions.{tenant}",
    "stream",
    ("ingress",),
    "Where an approver publishes a `HumanDecision`.",
)
approval: Final = _declare(
    "approvals",
    "writ.in.approvals.{tenant}",
    "stream",
    ("ingress",),
    "Where an approver publishes an `ApproveProposal` (approve or reject, by proposal id).",
)
review: Final = _declare(
    "reviews",
    "writ.in.reviews.{tenant}",
    "stream",
    ("ingress",),
    "Where an approver publishes a `ReviewDecision`; ingress forwards it to the planner "
    "(`REVIEW`) by request/reply.",
)
cancel: Final = _declare(
    "cancels",
    "writ.in.cancels.{tenant}",
    "stream",
    ("ingress",),
    "Where a host publishes a `CancelRun`.",
)
result: Final = _declare(
    "results",
    "writ.out.results.{tenant}",
    "stream",
    ("host",),
    "Where a host reads `RunResult`s and every other answer (a stream: an offline host catches "
    "up).",
)
planner_progress: Final = _declare(
    "progress",
    "writ.events.planner.{tenant}",
    "event",
    ("host",),
    "`StepRecorded` progress events: watchers, the demo's timeline.",
)
host_read: Final = _declare(
    "host.reads",
    "writ.api.{tenant}.{read}",
    "request",
    ("ingress",),
    "Where a host asks one read (`HostRead`), or a chat session operation (read `session`).",
)
chat_subject: Final = _declare(
    "chat",
    "writ.chat.{tenant}.{session}",
    "stream",
    ("host",),
    "One chat session's numbered events (WRIT_CHAT): the planner publishes, ingress reads them "
    "for hosts with ordered consumers.",
)

# Internal, one event type per subject family, in the order of the consumers' filters.
evidence: Final = _declare(
    "evidence",
    "writ.int.evidence.{tenant}",
    "stream",
    ("planner", "eval"),
    "A starting run's `RunStarted` with its evidence, to the planner (and the shadow "
    "evaluation's copy).",
)
proposal: Final = _declare(
    "proposals",
    "writ.int.proposals.{tenant}",
    "stream",
    ("admission",),
    "Proposals of runs and chat turns, to admission.",
)
# A command's outcome, `writ.int.outcomes.{origin}.{tenant}`: `origin` says who waits for it.
_OUTCOMES: Final = "writ.int.outcomes.{origin}.{tenant}"
_outcome_run: Final = _declare(
    "outcomes.run",
    _OUTCOMES.replace("{origin}", "run"),
    "stream",
    ("planner",),
    "Outcomes of commands a run waits for, from the dispatcher.",
)
_outcome_host: Final = _declare(
    "outcomes.host",
    _OUTCOMES.replace("{origin}", "host"),
    "stream",
    ("admission",),
    "Outcomes of host commands, from the dispatcher (admission answers the host).",
)
refused: Final = _declare(
    "refused",
    "writ.int.refused.{tenant}",
    "stream",
    ("planner",),
    "Proposals of runs that did not become commands (the planner's concern).",
)
branch: Final = _declare(
    "runs.branch",
    "writ.int.runs.branch.{tenant}",
    "stream",
    ("planner",),
    "`BranchChanged`: a run the planner drives as a branch of another started or ended (the "
    "planner's own inbox, under the runs' family so WRIT_INT keeps it).",
)
answered: Final = _declare(
    "answered",
    "writ.int.answered.{tenant}",
    "stream",
    ("planner", "admission"),
    "Decided pending decisions, from governance: to admission (about a proposal) and to the "
    "planner (about a read a run stopped for).",
)
proposal_answer: Final = _declare(
    "approvals.verified",
    "writ.int.approvals.{tenant}",
    "stream",
    ("admission",),
    "Verified approvals and rejections of proposals, from ingress to admission.",
)
run_cancel: Final = _declare(
    "runs.cancel",
    "writ.int.runs.cancel.{tenant}",
    "stream",
    ("planner",),
    "Verified cancellations, from ingress to the planner (in WRIT_INT, under the runs).",
)
answer: Final = _declare(
    "answers",
    "writ.int.answers.{tenant}",
    "stream",
    ("governance",),
    "Verified answers to pending decisions, from ingress to governance.",
)
command: Final = _declare(
    "cmd",
    "writ.cmd.{tenant}",
    "stream",
    ("dispatcher",),
    "Admitted commands, relayed from admission's outbox; `Nats-Msg-Id` = "
    "`<tenant>:<operation_id>`.",
)
admitted: Final = _declare(
    "admitted",
    "writ.int.admitted.{tenant}",
    "event",
    ("planner",),
    "`CommandAdmitted` progress events (the audit journal is the record); a chat session "
    "shows them as its `StepAdmitted`.",
)
turn_cancelling: Final = _declare(
    "sessions.cancelling",
    "writ.int.sessions.cancelling.{tenant}",
    "event",
    ("planner",),
    "`TurnCancelling`, planner to every planner: a closed session's model call in flight is "
    "abandoned.",
)
dead_letter: Final = _declare(
    "dlq",
    "writ.dlq.{consumer}",
    "stream",
    ("operator",),
    "Messages a consumer gave up on, with why (WRIT_DLQ).",
)
journal_checkpoints: Final = _declare(
    "audit.checkpoints",
    "writ.audit.checkpoints.{service}",
    "stream",
    ("operator",),
    "`JournalCheckpoint`s of one service's audit journal: its sealer publishes them in the "
    "append-only WRIT_AUDIT stream; `writ audit verify` reads them.",
)
shadow: Final = _declare(
    "eval.shadow",
    "writ.eval.shadow.{tenant}",
    "event",
    ("operator",),
    "What a shadow evaluation's candidate would have done at each decision point.",
)

# Request/reply endpoints, by the service answering them.
DECIDE: Final = _endpoint(
    "governance.decide",
    "writ.int.governance.decide",
    "governance",
    "`Decide` -> `Decision`: governance rules on one call of a run.",
)
DECIDE_BATCH: Final = _endpoint(
    "governance.decide_batch",
    "writ.int.governance.decide_batch",
    "governance",
    "`DecideBatch` -> `Decisions`: the same decisions, several per request/reply.",
)
# NATS lets each service publish its own subject only, so governance knows who registered from
# where it arrived.
REGISTER_RUN: Final = _endpoint(
    "governance.register_run",
    "writ.int.governance.register_run",
    "governance",
    "`RegisterRun`, from ingress only: a verified host's request and its grants.",
)
REGISTER_TURN: Final = _endpoint(
    "governance.register_turn",
    "writ.int.governance.register_turn",
    "governance",
    "`RegisterTurn`, from the planner only: a chat turn, which carries no grants of its own.",
)
PENDING_LIST: Final = _endpoint(
    "governance.pending",
    "writ.int.governance.pending",
    "governance",
    "A tenant's pending decisions.",
)
ANSWER: Final = _endpoint(
    "governance.answer",
    "writ.int.governance.answer",
    "governance",
    "Record a person's answer to a pending decision and say what it became (admission asks "
    "it when a proposal is approved by its id).",
)
SPEND_LIST: Final = _endpoint(
    "governance.spend",
    "writ.int.governance.spend",
    "governance",
    "A tenant's spend against its caps (`ListSpend` -> `SpendReport`; `writ spend`).",
)
RESERVE: Final = _endpoint(
    "governance.reserve",
    "writ.int.governance.reserve",
    "governance",
    "Run budgets: reserve before a step starts (`ReserveBudget` -> `BudgetReserved` | "
    "`BudgetRefused`); libs/budget.py.",
)
SETTLE: Final = _endpoint(
    "governance.settle",
    "writ.int.governance.settle",
    "governance",
    "Run budgets: settle when a step ends (`SettleBudget` -> `BudgetSettled`).",
)
MCP_LISTING: Final = _endpoint(
    "governance.mcp.listing",
    "writ.int.governance.mcp.listing",
    "governance",
    "Federation: retrieval records each MCP `tools/list` (`RecordListing` -> `ListingRecorded`).",
)
MCP_CLASSIFY: Final = _endpoint(
    "governance.mcp.classify",
    "writ.int.governance.mcp.classify",
    "governance",
    "Federation: an operator classifies a tool (`ClassifyTool` -> `ToolClassified`).",
)
UNKNOWN_LIST: Final = _endpoint(
    "dispatcher.unknown",
    "writ.int.dispatcher.unknown",
    "dispatcher",
    "Commands whose outcome is unknown, for an operator to reconcile.",
)
RECONCILE: Final = _endpoint(
    "dispatcher.reconcile",
    "writ.int.dispatcher.reconcile",
    "dispatcher",
    "An operator settles a command whose outcome was unknown.",
)
FACTS: Final = _endpoint(
    "dispatcher.facts",
    "writ.int.dispatcher.facts",
    "dispatcher",
    "The state a proposal's preview stands on, read by the one service holding the credentials.",
)
READ: Final = _endpoint(
    "retrieval.read",
    "writ.int.retrieval.read",
    "retrieval",
    "Execute a read tool for a run (`ReadCapability` -> `ReadResult` | `ReadRefused`), after "
    "governance's `decide`; the tools are `schemas.retrieval.READ_TOOLS`.",
)
SEARCH: Final = _endpoint(
    "retrieval.search",
    "writ.int.retrieval.search",
    "retrieval",
    "A starting run's evidence (`SearchEvidence`), asked by whoever starts the run.",
)
MCP_LIST: Final = _endpoint(
    "retrieval.mcp.list",
    "writ.int.retrieval.mcp.list",
    "retrieval",
    "Federation: an operator lists an MCP server now (`ListServer` -> `ServerListing`).",
)
MCP_SERVERS: Final = _endpoint(
    "retrieval.mcp.servers",
    "writ.int.retrieval.mcp.servers",
    "retrieval",
    "Federation: an operator asks which MCP servers are registered for their tenant "
    "(`ListServers` -> `RegisteredServers`).",
)
MCP_CATALOG: Final = _endpoint(
    "retrieval.mcp.catalog",
    "writ.int.retrieval.mcp.catalog",
    "retrieval",
    "The planner's catalog of a run's `mcp:` capabilities, as classified (`DescribeTools` -> "
    "`ToolDescriptions`).",
)
HOST_FACTS: Final = _endpoint(
    "retrieval.facts",
    "writ.int.retrieval.facts",
    "retrieval",
    "A host record a preview stands on, read through the only holder of the MCP credential "
    "(`ReadFacts` -> `FactsRead`).",
)
REPLAY: Final = _endpoint(
    "planner.replay",
    "writ.int.planner.replay",
    "planner",
    "Replay a run offline from the planner's audit journal (`ReplayRun` -> `ReplayReport`).",
)
REVIEW: Final = _endpoint(
    "planner.review",
    "writ.int.planner.review",
    "planner",
    "A `ReviewAnswer` in, the run's `RunResult` (or an error) back; ingress, the verified "
    "front door for approvers, publishes here.",
)
RUN_STATUS: Final = _endpoint(
    "planner.run",
    "writ.int.planner.run",
    "planner",
    "`GetRun` -> `schemas.api.RunView`; 404 when the tenant has no such run (yet).",
)
RUN_EVENTS: Final = _endpoint(
    "planner.events",
    "writ.int.planner.events",
    "planner",
    "`GetRunEvents` -> `RunEvents`: a run's committed steps (its timeline).",
)
REVIEWS_LIST: Final = _endpoint(
    "planner.reviews",
    "writ.int.planner.reviews",
    "planner",
    "`ListReviews` -> `PendingReviews`: the runs of a tenant stopped at a review.",
)
SESSION_OPS: Final = _endpoint(
    "planner.session",
    "writ.int.planner.session",
    "planner",
    "Chat sessions and plans, ingress -> planner: a `SessionOp` in, a `SessionReply` back.",
)
COMMAND_STATUS: Final = _endpoint(
    "admission.command",
    "writ.int.admission.command",
    "admission",
    "`GetCommand` -> `schemas.host.CommandResult` (the command's recorded state); 404 if none.",
)
PROPOSALS_LIST: Final = _endpoint(
    "admission.proposals",
    "writ.int.admission.proposals",
    "admission",
    "`ListProposals` -> `Proposals`.",
)
PROPOSAL_GET: Final = _endpoint(
    "admission.proposal",
    "writ.int.admission.proposal",
    "admission",
    "`GetProposal` -> `ProposalDetail` (404 if none).",
)
PLAN_FACTS: Final = _endpoint(
    "admission.plan_facts",
    "writ.int.admission.plan_facts",
    "admission",
    "`RecordPlanFacts` -> `PlanFactsRecorded`: a plan's steps' facts, read and kept for eval.",
)
# The services that keep an audit journal; each answers `VerifyJournal` on its own journal.
JOURNALED: Final = ("admission", "dispatcher", "governance", "planner")
journal_verify: Final = _declare(
    "journal_verify",
    "writ.int.{service}.journal_verify",
    "request",
    JOURNALED,
    "`VerifyJournal` -> `JournalState`: a service verifies its own audit journal "
    "(`GET /api/v1/audit/verify` asks them all).",
)
TURN_CANCELLING: Final = turn_cancelling.filter


def outcome(tenant: str, origin: str = "run") -> str:
    """A command's outcome; `origin` (run | host) says who waits for it."""
    return _OUTCOMES.format(origin=origin, tenant=tenant)


# Families: every subject under one prefix (streams' subjects, permissions' denials).
HOST_IN_FAMILY: Final = "writ.in.>"
HOST_OUT_FAMILY: Final = "writ.out.>"
INTERNAL_FAMILY: Final = "writ.int.>"
COMMAND_FAMILY: Final = "writ.cmd.>"
DEAD_LETTER_FAMILY: Final = "writ.dlq.>"
CHAT_FAMILY: Final = "writ.chat.>"
CHECKPOINT_FAMILY: Final = "writ.audit.checkpoints.>"
EVAL_FAMILY: Final = "writ.eval.>"
# Where Writ's work travels: what a shadow evaluation may never publish on.
WORK_FAMILIES: Final = (INTERNAL_FAMILY, COMMAND_FAMILY, HOST_IN_FAMILY, HOST_OUT_FAMILY)

# What a host may send: `writ.in.<kind>.<tenant>`, one stream per tenant (`tenant_streams`).
INGRESS_IN: Final = inbox("ingress")
_HOST_SENDS: Final = tuple(s for s in TABLE.values() if s.prefix.startswith("writ.in."))
HOST_KINDS: Final = tuple(s.prefix.split(".")[2] for s in _HOST_SENDS)
GOVERNANCE_IN: Final = inbox("governance")
PLANNER_IN: Final = inbox("planner")
ADMISSION_IN: Final = inbox("admission")
DISPATCH_IN: Final = inbox("dispatcher")


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
    StreamSpec("WRIT_CMD", (COMMAND_FAMILY,), 7 * _DAY, duplicate_window_s=3600.0),
    StreamSpec("WRIT_DLQ", (DEAD_LETTER_FAMILY,), 30 * _DAY),
    # Chat sessions' event streams, one subject per session (`writ.chat.<tenant>.<session>`,
    # schemas/sessions.py); the planner publishes each numbered event with `chat:<id>:<n>`.
    StreamSpec("WRIT_CHAT", (CHAT_FAMILY,), 30 * _DAY, duplicate_window_s=600.0),
)
# The audit journals' checkpoints, kept as long as the journals (forever: no max age). Not one
# of Writ's streams: it lives in an account of its own (`AUDIT`, libs/natsauth.py), where no
# runtime identity's publish, and so no JetStream acknowledgement it steers, can reach it.
JOURNAL_RECORD: Final = StreamSpec(
    JOURNAL_RECORD_STREAM, (CHECKPOINT_FAMILY,), 0.0, append_only=True
)


def host_subjects(tenant: str) -> tuple[str, ...]:
    """Every subject a tenant's host may publish on."""
    return tuple(s(tenant) for s in _HOST_SENDS)


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
