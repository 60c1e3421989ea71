"""Wire contracts: round-trips, unknown fields, bounds, and the committed JSON Schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from schemas.admission import (
    CommandAdmitted,
    DispatchCommand,
    PlanFactsRecorded,
    PlannedStep,
    PlannedStepFacts,
    ProposalRefused,
    RecordPlanFacts,
)
from schemas.base import Command, Event, Tenant
from schemas.control import CancelRun, RunCancelRequested
from schemas.dispatcher import (
    CommandOutcome,
    FactsRead,
    ListUnknown,
    ReadFacts,
    Reconcile,
    Reconciled,
    UnknownCommand,
    UnknownCommands,
)
from schemas.governance import (
    AnswerDecision,
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    DecideBatch,
    DecideRequest,
    Decision,
    DecisionAnswered,
    Decisions,
    ListPending,
    PendingDecision,
    PendingDecisions,
    RegisterRun,
    RegisterTurn,
    ReserveBudget,
    RunBudget,
    RunRegistered,
    SettleBudget,
)
from schemas.host import (
    ActionResult,
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    ErrorInfo,
    HumanDecision,
    ReviewDecision,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from schemas.host_reads import HostRead
from schemas.ingress import ProposalAnswer
from schemas.journal import JournalCheckpoint, ReAnchor
from schemas.mcp import (
    ClassifyTool,
    DescribedTool,
    DescribeTools,
    ListedTool,
    ListingRecorded,
    ListServer,
    RecordListing,
    ServerListing,
    ToolClassified,
    ToolDescriptions,
    ToolStatus,
)
from schemas.planner import (
    BranchChanged,
    Divergence,
    ProposeCommand,
    ReplayReport,
    ReplayRun,
    ReviewAnswer,
    ReviewTaken,
    StepRecorded,
)
from schemas.reads import (
    GetCommand,
    GetProposal,
    GetRun,
    GetRunEvents,
    ListProposals,
    VerifyJournal,
)
from schemas.retrieval import (
    Evidence,
    EvidenceFound,
    EvidenceGathered,
    ReadCapability,
    ReadItem,
    ReadRefused,
    ReadResult,
    SearchEvidence,
)
from schemas.sessions import TurnCancelling
from writ.schemas_io import FOLDER, MESSAGES, check_schemas, render, write_schemas

DIGEST = "ab" * 32

SAMPLES: dict[type, Any] = {
    RunRequest: RunRequest(
        request_id="req-1", token="eyJ.x.y", agent="assistant", input="Add a note to ACME-42."
    ),
    RunResult: RunResult(
        request_id="req-1",
        status="succeeded",
        run_id="run-1",
        answer="Done.",
        actions=[
            ActionResult(
                action="crm.note.create", operation_id="op-1", state="succeeded", receipt="note-9"
            )
        ],
    ),
    SearchEvidence: SearchEvidence(tenant="acme", run_id="run-1", input="hello"),
    EvidenceFound: EvidenceFound(
        run_id="run-1",
        evidence=[Evidence(document_id="doc-1", kind="ticket", title="T", text="body", rank=0.5)],
    ),
    EvidenceGathered: EvidenceGathered(
        run_id="run-1",
        request_id="req-1",
        tenant="acme",
        principal="alice@acme",
        agent="assistant",
        input="hello",
        evidence=[Evidence(document_id="doc-1", kind="ticket", title="T", text="body", rank=0.5)],
    ),
    ProposeCommand: ProposeCommand(
        run_id="run-1",
        step=2,
        tenant="acme",
        principal="alice@acme",
        agent="assistant",
        action="crm.note.create",
        arguments={"customer_id": "ACME-42", "body": "hi", "nested": {"n": [1, 2.5, None, True]}},
    ),
    DecideRequest: DecideRequest(
        tenant="acme",
        principal="alice@acme",
        agent="assistant",
        run_id="run-1",
        tool="crm.note.create",
        first_argument="ACME-42",
    ),
    Decision: Decision(
        decision_id="dec-1",
        verdict="ask",
        line=6,
        family="write_delete",
        reason="no grant covers the call",
        policy_version="v3",
    ),
    DecideBatch: DecideBatch(
        requests=[
            DecideRequest(
                tenant="acme",
                principal="alice@acme",
                agent="assistant",
                run_id="run-1",
                tool="writ.noop",
                first_argument="x",
                proposal_id="prop-1",
            )
        ]
    ),
    Decisions: Decisions(
        decisions=[
            Decision(
                decision_id="dec-1",
                verdict="allow",
                line=5,
                family="write_delete",
                reason="standing grant for write_delete",
                policy_version="v3",
            )
        ]
    ),
    CommandAdmitted: CommandAdmitted(
        tenant="acme",
        run_id="run-1",
        step=2,
        action="crm.note.create",
        operation_id="op-1",
        request_hash=DIGEST,
        decision_id="dec-1",
        decision_line=5,
        policy_version="v3",
        replay=True,
    ),
    ProposalRefused: ProposalRefused(
        tenant="acme",
        run_id="run-1",
        step=2,
        action="crm.note.create",
        verdict="deny",
        reason="refused",
        decision_id="dec-1",
    ),
    DispatchCommand: DispatchCommand(tenant="acme", operation_id="op-1"),
    CommandOutcome: CommandOutcome(
        tenant="acme",
        operation_id="op-1",
        run_id="run-1",
        step=2,
        action="crm.note.create",
        state="unknown",
        reason="response lost",
    ),
    SubmitCommand: SubmitCommand(
        request_id="req-2",
        token="eyJ.x.y",
        agent="assistant",
        operation_key="invoice-7-note",
        action="crm.note.create",
        arguments={"customer_id": "ACME-42", "body": "hi"},
        expected_revision="r3",
    ),
    CommandResult: CommandResult(
        request_id="req-2",
        operation_key="invoice-7-note",
        status="succeeded",
        operation_id="op-1",
        receipt="note-9",
    ),
    ListUnknown: ListUnknown(tenant="acme"),
    UnknownCommands: UnknownCommands(
        commands=[
            UnknownCommand(
                operation_id="op-1",
                action="payment.charge.create",
                principal="alice@acme",
                arguments={"customer_id": "ACME-42", "amount_cents": 1250},
                reason="response lost",
                since="2026-01-01T00:00:00Z",
            )
        ]
    ),
    Reconcile: Reconcile(
        tenant="acme",
        operation_id="op-1",
        state="succeeded",
        evidence="Provider dashboard shows charge ch_123.",
        resolved_by="ops@acme",
        receipt="ch_123",
    ),
    Reconciled: Reconciled(operation_id="op-1", ok=True, message="recorded"),
    HumanDecision: HumanDecision(
        request_id="dec-1", token="eyJ.x.y", pending_id="p-1", answer="once", reason="looks right"
    ),
    DecisionResult: DecisionResult(
        request_id="dec-1", pending_id="p-1", accepted=True, message="answered once"
    ),
    RegisterRun: RegisterRun(
        tenant="acme",
        run_id="run-1",
        principal="alice@acme",
        agent="assistant",
        attended=True,
        grants=["send_external"],
        budget=RunBudget(tokens=20_000, max_concurrent_steps=2),
    ),
    RegisterTurn: RegisterTurn(
        tenant="acme",
        run_id="ses-1-t2",
        session_id="ses-1",
        principal="alice@acme",
        agent="assistant",
    ),
    RunRegistered: RunRegistered(run_id="run-1"),
    ReserveBudget: ReserveBudget(
        tenant="acme", run_id="run-1", step_key="run-1:3:model", provider_calls=1, tokens=4096
    ),
    BudgetReserved: BudgetReserved(
        reservation_id="5f0c6a9e-0000-4000-8000-000000000001",
        run_id="run-1",
        step_key="run-1:3:model",
        status="open",
        provider_calls=1,
        tokens=4096,
        capability_calls=0,
        wall_time_left_s=812.5,
    ),
    BudgetRefused: BudgetRefused(
        run_id="run-1",
        step_key="run-1:4:model",
        budget="tokens",
        reason="tokens budget exhausted: asked 4096, 1200 left of 20000",
    ),
    SettleBudget: SettleBudget(
        tenant="acme",
        run_id="run-1",
        reservation_id="5f0c6a9e-0000-4000-8000-000000000001",
        provider_calls=1,
        tokens=5120,
    ),
    BudgetSettled: BudgetSettled(
        reservation_id="5f0c6a9e-0000-4000-8000-000000000001",
        run_id="run-1",
        status="settled",
        provider_calls=1,
        tokens=5120,
        capability_calls=0,
    ),
    AnswerDecision: AnswerDecision(
        tenant="acme",
        principal="ops@acme",
        request_id="dec-1",
        pending_id="p-1",
        answer="deny",
        reason="no",
    ),
    DecisionAnswered: DecisionAnswered(
        tenant="acme",
        pending_id="p-1",
        run_id="run-1",
        proposal_id="prop-1",
        answer="once",
        reason="",
        answered_by="ops@acme",
        decision_id="d-2",
        line=6,
        policy_version="v1",
    ),
    ListPending: ListPending(tenant="acme"),
    PendingDecisions: PendingDecisions(
        decisions=[
            PendingDecision(
                pending_id="p-1",
                run_id="run-1",
                agent="assistant",
                principal="alice@acme",
                tool="payment.charge.create",
                family="write_delete",
                first_argument="ACME-42",
                reason="no grant covers the call",
                options=["once", "always", "deny"],
                attended=False,
                deadline=None,
                created_at="2026-01-01T00:00:00Z",
            )
        ]
    ),
    ApproveProposal: ApproveProposal(
        request_id="apr-1", token="eyJ.x.y", proposal_id="prop_abc", answer="approve"
    ),
    ApprovalResult: ApprovalResult(
        request_id="apr-1",
        proposal_id="prop_abc",
        status="already_completed",
        outcome="succeeded",
        receipt="re_1",
    ),
    ProposalAnswer: ProposalAnswer(
        tenant="acme",
        request_id="apr-1",
        approver="ops@acme",
        proposal_id="prop_abc",
        answer="reject",
        reason="wrong line",
    ),
    ReadFacts: ReadFacts(tenant="acme", kind="payment", id="pay_7781"),
    FactsRead: FactsRead(found=True, facts={"payment_id": "pay_7781", "status": "captured"}),
    RecordPlanFacts: RecordPlanFacts(
        tenant="acme",
        run_id="session-1:1",
        steps=[
            PlannedStep(
                step=0,
                capability="payment.refund",
                request={"payment_id": "pay_7781", "line_id": "L2"},
            )
        ],
    ),
    PlanFactsRecorded: PlanFactsRecorded(
        steps=[PlannedStepFacts(step=0, found=True, facts={"payment_id": "pay_7781"})]
    ),
    ReplayRun: ReplayRun(tenant="acme", run_id="run-1"),
    BranchChanged: BranchChanged(tenant="acme", run_id="run-1.b2"),
    JournalCheckpoint: JournalCheckpoint(
        service="governance",
        seq=9,
        prev_seq=6,
        head="ab" * 32,
        prev_head="cd" * 32,
        key_id="governance-1",
        signature="c2ln",
        signed_at=1764633600000000,
        reanchor=ReAnchor(
            by="ops@acme.example",
            reason="the record was deleted",
            record_last=6,
            unrecorded=1,
            cut_to=12,
            junk=[41],
        ),
    ),
    StepRecorded: StepRecorded(
        tenant="acme",
        run_id="run-1",
        seq=3,
        kind="decision",
        decision="select_capability",
        target="documents.search",
    ),
    ReplayReport: ReplayReport(
        run_id="run-1",
        verdict="divergent",
        entries=6,
        divergences=[
            Divergence(
                step=2,
                expected='the run to succeed with answer "Done."',
                found='the run succeeded with answer "Refunded."',
            )
        ],
        missing=["step 1 (the tool output of step 0) was never captured"],
    ),
    ReviewAnswer: ReviewAnswer(
        tenant="acme",
        run_id="run-1",
        step=0,
        answer="approve",
        reviewer="ops@acme",
        reason="the note is right",
    ),
    ReviewTaken: ReviewTaken(run_id="run-1", status="running"),
    ReviewDecision: ReviewDecision(
        request_id="rev-1",
        token="eyJ.x.y",
        pending_id="review-run-1-0",
        answer="reject",
        comment="wrong order number",
    ),
    ReviewResult: ReviewResult(
        request_id="rev-1",
        pending_id="review-run-1-0",
        accepted=True,
        message="approved; the run is succeeded",
    ),
    ReadCapability: ReadCapability(
        tenant="acme",
        run_id="run-1",
        principal="alice@acme",
        agent="assistant",
        tool="documents.search",
        arguments={"query": "order 7781", "limit": 3},
    ),
    ReadResult: ReadResult(
        run_id="run-1",
        tool="crm.customer.get",
        decision_id="dec-1",
        truncated=False,
        items=[
            ReadItem(
                id="ACME-42",
                kind="customer_record",
                title="Acme Corporation",
                text="Prefers email.",
                fields={"owner": "Alice Martin"},
            )
        ],
    ),
    ReadRefused: ReadRefused(
        run_id="run-1",
        tool="crm.customer.get",
        code="ASK",
        reason="no grant covers the call",
        decision_id="dec-2",
        pending_id="dec-2",
        line=6,
    ),
    CancelRun: CancelRun(request_id="cancel-1", token="eyJ.x.y", run_id="run-1"),
    RunCancelRequested: RunCancelRequested(
        tenant="acme", run_id="run-1", principal="alice@acme", request_id="cancel-1"
    ),
    GetRun: GetRun(tenant="acme", run_id="run-1"),
    GetCommand: GetCommand(tenant="acme", operation_key="op-1"),
    ListProposals: ListProposals(tenant="acme", state="pending", limit=10),
    GetProposal: GetProposal(tenant="acme", proposal_id="prop-1"),
    GetRunEvents: GetRunEvents(tenant="acme", run_id="run-1", after=3),
    VerifyJournal: VerifyJournal(tenant="acme"),
    HostRead: HostRead(token="eyJ.x.y", run_id="run-1"),
    RecordListing: RecordListing(
        tenant="acme",
        server="helpdesk",
        digest="a" * 64,
        tools=[
            ListedTool(
                name="ticket.get",
                description="Read one ticket.",
                input_schema={"type": "object"},
                digest="b" * 64,
                hints={"read_only_hint": True},
            )
        ],
    ),
    ListingRecorded: ListingRecorded(
        digest="a" * 64,
        tools=[ToolStatus(name="ticket.get", digest="b" * 64, state="changed", family="read")],
    ),
    ListServer: ListServer(tenant="acme", server="helpdesk"),
    ServerListing: ServerListing(ok=True, digest="a" * 64, exposed=["ticket.get"]),
    ClassifyTool: ClassifyTool(
        tenant="acme",
        server="helpdesk",
        tool="ticket.get",
        family="read",
        classified_by="ops@acme.example",
    ),
    ToolClassified: ToolClassified(ok=True, message="classified", digest="b" * 64),
    DescribeTools: DescribeTools(tenant="acme", capabilities=["mcp:helpdesk/ticket.get"]),
    ToolDescriptions: ToolDescriptions(
        tools=[
            DescribedTool(
                capability="mcp:helpdesk/ticket.get",
                family="read",
                description="Read one ticket.",
                input_schema={"type": "object"},
            )
        ]
    ),
    TurnCancelling: TurnCancelling(tenant="acme", run_id="ses-abc-t1"),
}
# Host-sent and inbox commands, whether or not they are in MESSAGES yet.
HOST_AND_INBOX_COMMANDS = tuple(
    dict.fromkeys(
        [
            RunRequest,
            SubmitCommand,
            ProposeCommand,
            DecideRequest,
            DispatchCommand,
            HumanDecision,
            ApproveProposal,
        ]
        + [m for m in MESSAGES if issubclass(m, Command)]
    )
)
EVENTS = tuple(
    dict.fromkeys(
        [RunResult, CommandResult, CommandOutcome] + [m for m in MESSAGES if issubclass(m, Event)]
    )
)
ALL = tuple(dict.fromkeys(list(MESSAGES) + list(SAMPLES)))


def as_dict(message: Any) -> dict[str, Any]:
    return msgspec.json.decode(msgspec.json.encode(message))


def decode(cls: type, document: dict[str, Any]) -> Any:
    return msgspec.json.decode(msgspec.json.encode(document), type=cls)


def test_every_message_has_a_sample() -> None:
    assert set(MESSAGES) <= set(SAMPLES)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_round_trip(cls: type) -> None:
    sample = SAMPLES[cls]
    raw = msgspec.json.encode(sample)
    assert msgspec.json.decode(raw, type=cls) == sample
    assert msgspec.json.decode(raw, type=cls, strict=True) == sample
    assert as_dict(sample)["type"] == cls.__name__  # the tag the schema promises


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_message_is_a_command_or_an_event(cls: type) -> None:
    assert issubclass(cls, Command) != issubclass(cls, Event)


def test_a_message_of_another_type_is_refused() -> None:
    document = {**as_dict(SAMPLES[DispatchCommand]), "type": "RunRequest"}
    with pytest.raises(msgspec.ValidationError, match="type"):
        decode(DispatchCommand, document)


@pytest.mark.parametrize("cls", HOST_AND_INBOX_COMMANDS, ids=lambda c: c.__name__)
def test_commands_reject_unknown_fields(cls: type) -> None:
    assert issubclass(cls, Command)
    document = {**as_dict(SAMPLES[cls]), "sneaky": "x"}
    with pytest.raises(msgspec.ValidationError, match="sneaky"):
        decode(cls, document)


@pytest.mark.parametrize("cls", EVENTS, ids=lambda c: c.__name__)
def test_events_skip_unknown_fields(cls: type) -> None:
    document = {**as_dict(SAMPLES[cls]), "added_in_v2": {"any": ["thing"]}}
    assert decode(cls, document) == SAMPLES[cls]


def test_event_nested_structs_skip_unknown_fields() -> None:
    run_result = {**as_dict(SAMPLES[RunResult])}
    run_result["actions"][0]["added_in_v2"] = 1
    assert decode(RunResult, run_result) == SAMPLES[RunResult]
    gathered = as_dict(SAMPLES[EvidenceGathered])
    gathered["evidence"][0]["added_in_v2"] = 1
    assert decode(EvidenceGathered, gathered) == SAMPLES[EvidenceGathered]


@pytest.mark.parametrize(
    "result",
    [
        RunResult(
            request_id="req-1",
            status="rejected",
            error=ErrorInfo(code="TOO_LARGE", message="too large"),
        ),
        CommandResult(
            request_id="req-2",
            operation_key="k",
            status="rejected",
            error=ErrorInfo(code="TOO_LARGE", message="too large"),
        ),
    ],
    ids=["RunResult", "CommandResult"],
)
def test_result_error_skips_unknown_fields(result: Any) -> None:
    document = as_dict(result)
    document["error"]["retryable"] = False
    assert decode(type(result), document) == result


# -- bounds --------------------------------------------------------------------------------


def run_request(**changes: Any) -> dict[str, Any]:
    return {**as_dict(SAMPLES[RunRequest]), **changes}


@pytest.mark.parametrize(
    "changes",
    [
        {"input": "x" * 8192},
        {"input": "x"},
        {"token": "t" * 8192},
        {"request_id": "r" * 128},
        {"request_id": "tenant:req.1_a-b"},
        {"agent": "a" * 63},
    ],
    ids=[
        "input-max",
        "input-min",
        "token-max",
        "request-id-max",
        "request-id-alphabet",
        "agent-max",
    ],
)
def test_run_request_within_bounds(changes: dict[str, Any]) -> None:
    decode(RunRequest, run_request(**changes))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"input": "x" * 8193}, "input"),
        ({"input": ""}, "input"),
        ({"token": "t" * 8193}, "token"),
        ({"token": ""}, "token"),
        ({"request_id": "r" * 129}, "request_id"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": "req 1"}, "request_id"),
        ({"request_id": "req/1"}, "request_id"),
        ({"request_id": ".req"}, "request_id"),
        ({"request_id": "req>"}, "request_id"),
        ({"agent": "Assistant"}, "agent"),
        ({"agent": "a" * 64}, "agent"),
        ({"agent": "a*"}, "agent"),
        ({"input": 5}, "input"),
    ],
    ids=lambda v: repr(v)[:30] if isinstance(v, dict) else v,
)
def test_run_request_out_of_bounds(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=field):
        decode(RunRequest, run_request(**changes))


@pytest.mark.parametrize("tenant", ["acme", "a", "acme-2", "0", "a" * 63])
def test_tenant_pattern_accepts(tenant: str) -> None:
    assert msgspec.convert(tenant, Tenant) == tenant
    decode(DispatchCommand, {"tenant": tenant, "operation_id": "op-1"})


@pytest.mark.parametrize(
    "tenant",
    [
        "acme.*",
        "a>b",
        "acme.eu",
        "*",
        ">",
        "acme globex",
        "ACME",
        "-acme",
        "",
        "a" * 64,
        "acme_eu",
        "acmé",
        "acme\tx",
    ],
)
def test_tenant_pattern_refuses_subject_syntax_and_other_alphabets(tenant: str) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(tenant, Tenant)
    with pytest.raises(msgspec.ValidationError, match="tenant"):
        decode(DispatchCommand, {"tenant": tenant, "operation_id": "op-1"})


@pytest.mark.parametrize("cls", [DispatchCommand, DecideRequest])
def test_tenant_pattern_refuses_a_trailing_newline(cls: type) -> None:
    document = {**as_dict(SAMPLES[cls]), "tenant": "acme\n"}
    with pytest.raises(msgspec.ValidationError):
        decode(cls, document)


def test_propose_command_bounds() -> None:
    base = as_dict(SAMPLES[ProposeCommand])
    decode(ProposeCommand, {**base, "step": 1000, "arguments": {str(i): i for i in range(32)}})
    for changes, field in [
        ({"step": -1}, "step"),
        ({"step": 1001}, "step"),
        ({"arguments": {str(i): i for i in range(33)}}, "arguments"),
        ({"action": "a" * 513}, "action"),
        ({"tenant": "a.b"}, "tenant"),
        ({"principal": "al ice"}, "principal"),
    ]:
        with pytest.raises(msgspec.ValidationError, match=field):
            decode(ProposeCommand, {**base, **cast(dict[str, Any], changes)})


def test_event_bounds() -> None:
    result = as_dict(SAMPLES[RunResult])
    with pytest.raises(msgspec.ValidationError, match="actions"):
        decode(RunResult, {**result, "actions": result["actions"] * 65})
    with pytest.raises(msgspec.ValidationError, match="status"):
        decode(RunResult, {**result, "status": "maybe"})
    with pytest.raises(msgspec.ValidationError, match="answer"):
        decode(RunResult, {**result, "answer": "x" * 16385})
    gathered = as_dict(SAMPLES[EvidenceGathered])
    with pytest.raises(msgspec.ValidationError, match="evidence"):
        decode(EvidenceGathered, {**gathered, "evidence": gathered["evidence"] * 17})
    gathered["evidence"][0]["trust"] = "trusted"
    with pytest.raises(msgspec.ValidationError, match="trust"):
        decode(EvidenceGathered, gathered)
    decision = as_dict(SAMPLES[Decision])
    for line in (0, 7):
        with pytest.raises(msgspec.ValidationError, match="line"):
            decode(Decision, {**decision, "line": line})
    admitted = as_dict(SAMPLES[CommandAdmitted])
    with pytest.raises(msgspec.ValidationError, match="request_hash"):
        decode(CommandAdmitted, {**admitted, "request_hash": "AB" * 32})


def test_reconcile_bounds() -> None:
    base = as_dict(SAMPLES[Reconcile])
    decode(Reconcile, {**base, "evidence": "e" * 4000, "resolved_by": "r" * 128})
    for changes, field in [
        ({"evidence": ""}, "evidence"),
        ({"evidence": "e" * 4001}, "evidence"),
        ({"resolved_by": ""}, "resolved_by"),
        ({"resolved_by": "r" * 129}, "resolved_by"),
        ({"state": "unknown"}, "state"),
        ({"tenant": "acme.*"}, "tenant"),
    ]:
        with pytest.raises(msgspec.ValidationError, match=field):
            decode(Reconcile, {**base, **changes})


def test_error_code_pattern() -> None:
    for code in ("TOO_LARGE", "X"):
        decode(ErrorInfo, {"code": code, "message": "m"})
    for code in ("too_large", "_X", "A" * 65, "TOO-LARGE"):
        with pytest.raises(msgspec.ValidationError, match="code"):
            decode(ErrorInfo, {"code": code, "message": "m"})


# -- committed JSON Schemas ----------------------------------------------------------------


def test_committed_schemas_match_the_code() -> None:
    assert check_schemas() == []
    assert {p.name for p in FOLDER.glob("*.json")} == {f"{m.__name__}.json" for m in MESSAGES}


def test_schemas_forbid_what_the_decoder_forbids() -> None:
    # What the drift check compares against: hosts validating with it must agree with us.
    for cls in HOST_AND_INBOX_COMMANDS:
        schema = msgspec.json.decode(render(cls))
        assert schema["$defs"][cls.__name__]["additionalProperties"] is False
    for cls in EVENTS:
        schema = msgspec.json.decode(render(cls))
        assert "additionalProperties" not in schema["$defs"][cls.__name__]


@pytest.fixture
def copy_of_schemas(tmp_path: Path) -> Path:
    # Freshly rendered, so these tests check the checker whatever state the commit is in.
    folder = tmp_path / "json"
    write_schemas(folder)
    assert check_schemas(folder) == []
    return folder


def test_drift_when_a_schema_is_edited(copy_of_schemas: Path) -> None:
    path = copy_of_schemas / "RunRequest.json"
    path.write_text(path.read_text().replace('"maxLength": 8192', '"maxLength": 9000', 1))
    drift = check_schemas(copy_of_schemas)
    assert len(drift) == 1
    assert "RunRequest.json" in drift[0] and "differs" in drift[0]


def test_drift_when_a_schema_is_missing(copy_of_schemas: Path) -> None:
    (copy_of_schemas / "CommandOutcome.json").unlink()
    drift = check_schemas(copy_of_schemas)
    assert len(drift) == 1
    assert "CommandOutcome.json" in drift[0] and "missing" in drift[0]


def test_drift_when_a_schema_has_no_message(copy_of_schemas: Path) -> None:
    (copy_of_schemas / "Retired.json").write_text("{}\n")
    drift = check_schemas(copy_of_schemas)
    assert len(drift) == 1
    assert "Retired.json" in drift[0]


def test_drift_when_the_folder_is_missing(tmp_path: Path) -> None:
    assert len(check_schemas(tmp_path / "nowhere")) == len(MESSAGES)


def test_write_schemas_then_check_is_clean(tmp_path: Path) -> None:
    written = write_schemas(tmp_path / "out")
    assert {p.name for p in written} == {f"{m.__name__}.json" for m in MESSAGES}
    assert check_schemas(tmp_path / "out") == []
    assert (tmp_path / "out" / "RunRequest.json").read_text() == render(RunRequest)


# -- result codes as data ----------------------------------------------


def test_decision_approval_and_review_results_carry_their_code_as_a_field() -> None:
    from schemas.host import ApprovalResult, DecisionResult, ReviewResult

    for result in (
        DecisionResult(
            request_id="r",
            pending_id="p",
            accepted=False,
            message="no such pending decision",
            code="UNKNOWN_PENDING",
        ),
        ReviewResult(
            request_id="r",
            pending_id="p",
            accepted=False,
            message="no review",
            code="UNKNOWN_REVIEW",
        ),
        ApprovalResult(
            request_id="r",
            proposal_id="p",
            status="not_approvable",
            reason="no such proposal",
            code="UNKNOWN_PROPOSAL",
        ),
    ):
        raw = msgspec.json.encode(result)
        assert msgspec.json.decode(raw)["code"] == result.code
        assert msgspec.json.decode(raw, type=type(result)) == result


def test_a_result_from_before_the_code_field_still_decodes() -> None:
    """Schema evolution: the new field has a default, so old producers' results decode."""
    from schemas.host import DecisionResult

    old = (
        b'{"type":"DecisionResult","request_id":"r","pending_id":"p","accepted":true,'
        b'"message":"answered once","api_version":"1"}'
    )
    assert msgspec.json.decode(old, type=DecisionResult).code is None
