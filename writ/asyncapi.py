"""The NATS door's contract as an AsyncAPI 3.0 document, generated from the Structs of
`schemas/` (committed as `schemas/asyncapi.json`; `make schemas` rewrites it)."""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

from schemas import subjects
from schemas.api import RunEvents, RunView
from schemas.control import CancelRun
from schemas.governance import PendingDecisions
from schemas.host import (
    ApprovalResult,
    ApproveProposal,
    CommandResult,
    DecisionResult,
    HumanDecision,
    ReviewDecision,
    ReviewResult,
    RunRequest,
    RunResult,
    SubmitCommand,
)
from schemas.host_reads import HOST_READS, HostRead
from schemas.planner import ReplayReport, StepRecorded
from schemas.reads import ProposalDetail, Proposals
from schemas.sessions import (
    HOST_SESSION,
    CapabilitySelected,
    ChildSession,
    DecisionAsked,
    DecisionTaken,
    HostSessionOp,
    Observed,
    PlanDecided,
    PlanProposed,
    ProposalMade,
    SessionClosed,
    SessionForked,
    SessionInjected,
    SessionOpened,
    SessionPaused,
    SessionReply,
    SessionResumed,
    StepAdmitted,
    StepDispatched,
    StepOutcome,
    TextDelta,
    TextReset,
    TurnEnded,
    TurnStarted,
    UserMessage,
    WriterNote,
)

__all__ = ["asyncapi_document"]

_MSG_ID: Final = {
    "type": "object",
    "properties": {
        "Nats-Msg-Id": {
            "type": "string",
            "maxLength": 128,
            "description": "Optional, and what a host should send: the message's request_id, "
            "so JetStream drops a re-publish under the same id (a duplicate, not a second act). "
            "Without it a re-publish is deduplicated later, by request_id; with another value "
            "than request_id the message is refused unanswered (either id's answer could "
            "contradict the other's)",
        },
        "traceparent": {"type": "string", "description": "W3C trace context (optional)"},
    },
}
# (channel, its subject (the address is its pattern), what it carries, the host's action,
# message types, operation id).
_CHANNELS: Final = (
    (
        "requests",
        subjects.request,
        "Runs a host asks for",
        "send",
        (RunRequest,),
        "startRun",
    ),
    (
        "commands",
        subjects.command_request,
        "Exactly this, under the host's operation key",
        "send",
        (SubmitCommand,),
        "submitCommand",
    ),
    (
        "decisions",
        subjects.human_decision,
        "Approvers' answers to pending decisions",
        "send",
        (HumanDecision,),
        "decide",
    ),
    (
        "approvals",
        subjects.approval,
        "Approvers approve or reject a proposal by id",
        "send",
        (ApproveProposal,),
        "answerProposal",
    ),
    (
        "reviews",
        subjects.review,
        "Approvers answer a run's review",
        "send",
        (ReviewDecision,),
        "answerReview",
    ),
    ("cancels", subjects.cancel, "Cancel a run", "send", (CancelRun,), "cancelRun"),
    (
        "results",
        subjects.result,
        f"Every answer to a host, in the tenant's JetStream stream "
        f"`{subjects.out_stream('{tenant}')}` (an offline host catches up; a host reads it "
        "by sequence or as it comes, and creates no consumer)",
        "receive",
        (RunResult, CommandResult, DecisionResult, ApprovalResult, ReviewResult),
        "readResults",
    ),
    (
        "progress",
        subjects.planner_progress,
        "A run's committed steps as they happen (core NATS, progress only: not stored)",
        "receive",
        (StepRecorded,),
        "watchProgress",
    ),
    (
        "chat",
        subjects.chat_subject,
        "A chat session's numbered events (JetStream stream WRIT_CHAT, one subject per session). "
        "Listed for its messages only: a host does not subscribe to it, it reads them through "
        "`writ.api.{tenant}.session` op `events`, or over SSE",
        "receive",
        (
            SessionOpened,
            UserMessage,
            TurnStarted,
            TextDelta,
            TextReset,
            CapabilitySelected,
            Observed,
            PlanProposed,
            PlanDecided,
            DecisionAsked,
            DecisionTaken,
            ProposalMade,
            StepAdmitted,
            StepDispatched,
            StepOutcome,
            WriterNote,
            TurnEnded,
            SessionPaused,
            SessionResumed,
            SessionInjected,
            SessionClosed,
            SessionForked,
            ChildSession,
        ),
        None,
    ),
)


def _doc(kind: type) -> str:
    return " ".join((kind.__doc__ or "").split())


def _document() -> dict[str, Any]:
    kinds = [k for *_, types, _ in _CHANNELS for k in types]
    _, components = msgspec.json.schema_components(
        kinds, ref_template="#/components/schemas/{name}"
    )
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for channel, subject, description, action, types, operation in _CHANNELS:
        for kind in types:
            name = kind.__name__
            message: dict[str, Any] = {
                "name": name,
                "title": name,
                "summary": _doc(kind)[:300],
                "contentType": "application/json",
                "payload": {"$ref": f"#/components/schemas/{name}"},
            }
            if action == "send":
                message["headers"] = _MSG_ID
            messages[name] = message
        channels[channel] = {
            "address": subject.pattern,
            "description": description,
            "parameters": {
                "tenant": {"description": "The tenant (the token's `tenant` claim must name it)"}
            },
            "messages": {
                k.__name__: {"$ref": f"#/components/messages/{k.__name__}"} for k in types
            },
        }
        if operation is None:
            continue  # what a host does not do itself
        operations[operation] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": description,
            "messages": [{"$ref": f"#/channels/{channel}/messages/{k.__name__}"} for k in types],
        }
    channels["chat"]["parameters"]["session"] = {"description": "The session's id"}
    _reads(messages, channels, operations, components)
    _sessions(messages, channels, operations, components)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Writ host contract (NATS)",
            "version": subjects.HOST_API_VERSION,
            "description": "What a host publishes and reads on NATS JetStream. Every "
            "message a host sends carries an EdDSA JWT (`token`) whose "
            "`tenant` claim names the subject's tenant; unknown fields are "
            "refused. The same contract over HTTP: schemas/openapi.json.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "writ": {
                "host": "{host}:{port}",
                "protocol": "nats",
                "description": "The deployment's NATS (JetStream). A host connects as its "
                "tenant's host user, `host-{tenant}`, with the password it was given, and "
                "passes the inbox prefix `_INBOX.host-{tenant}` (nats.py `inbox_prefix`, "
                "nats.js `inboxPrefix`): replies to its requests arrive there, and it may "
                "subscribe nowhere else under `_INBOX`.",
                "variables": {
                    "host": {"default": "127.0.0.1", "description": "The NATS server's host"},
                    "port": {"default": "4222", "description": "Its client port"},
                },
                "security": [{"$ref": "#/components/securitySchemes/hostUser"}],
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": components,
            "securitySchemes": {
                "hostUser": {
                    "type": "userPassword",
                    "description": "NATS user `host-{tenant}` and its password: it may "
                    "publish the tenant's `writ.in.*` subjects, request `writ.api.{tenant}.*`, "
                    "and read `writ.out.results.{tenant}` and `writ.events.planner.{tenant}`; "
                    "nothing of another tenant, nothing under `writ.int.`",
                },
            },
        },
    }


def _reads(
    messages: dict[str, Any],
    channels: dict[str, Any],
    operations: dict[str, Any],
    components: dict[str, Any],
) -> None:
    """Host reads: request/reply on `writ.api.{tenant}.{read}`, answered on the requester's
    inbox with the Struct the HTTP GET answers."""
    replies = (
        RunView,
        RunResult,
        RunEvents,
        CommandResult,
        PendingDecisions,
        Proposals,
        ProposalDetail,
        ReplayReport,
    )
    _, extra = msgspec.json.schema_components(
        (HostRead, *replies), ref_template="#/components/schemas/{name}"
    )
    components.update(extra)
    for kind in (HostRead, *replies):
        messages.setdefault(
            kind.__name__,
            {
                "name": kind.__name__,
                "title": kind.__name__,
                "summary": _doc(kind)[:300],
                "contentType": "application/json",
                "payload": {"$ref": f"#/components/schemas/{kind.__name__}"},
            },
        )
    channels["reads"] = {
        "address": subjects.host_read.pattern,
        "description": "A host's reads, answered by ingress as the HTTP API's GETs",
        "parameters": {
            "tenant": {"description": "The tenant (the token's `tenant` claim)"},
            "read": {"enum": list(HOST_READS), "description": "What is read"},
        },
        "messages": {"HostRead": {"$ref": "#/components/messages/HostRead"}},
    }
    channels["readReplies"] = {
        "address": None,
        "description": "The requester's inbox (NATS request/reply); an "
        "error is a NATS micro error: Nats-Service-Error-Code "
        "(the HTTP status) and Nats-Service-Error "
        '("<CODE>: <detail>")',
        "messages": {k.__name__: {"$ref": f"#/components/messages/{k.__name__}"} for k in replies},
    }
    operations["read"] = {
        "action": "send",
        "channel": {"$ref": "#/channels/reads"},
        "summary": "Read a run, wait for news of it (a `RunResult` newer than `after`), its "
        "timeline, a command, pending decisions, proposals, replay",
        "messages": [{"$ref": "#/channels/reads/messages/HostRead"}],
        "reply": {
            "channel": {"$ref": "#/channels/readReplies"},
            "messages": [
                {"$ref": f"#/channels/readReplies/messages/{k.__name__}"} for k in replies
            ],
        },
    }


def _discriminators(value: Any) -> Any:
    """msgspec writes a tagged union's discriminator as OpenAPI's object; AsyncAPI's schema
    object takes the property name alone."""
    if isinstance(value, dict):
        return {
            k: (
                v["propertyName"]
                if k == "discriminator" and isinstance(v, dict)
                else _discriminators(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_discriminators(v) for v in value]
    return value


def _sessions(
    messages: dict[str, Any],
    channels: dict[str, Any],
    operations: dict[str, Any],
    components: dict[str, Any],
) -> None:
    """Chat sessions for hosts: request/reply on `writ.api.{tenant}.session`."""
    _, extra = msgspec.json.schema_components(
        (HostSessionOp, SessionReply), ref_template="#/components/schemas/{name}"
    )
    components.update(_discriminators(extra))
    for kind in (HostSessionOp, SessionReply):
        messages.setdefault(
            kind.__name__,
            {
                "name": kind.__name__,
                "title": kind.__name__,
                "summary": _doc(kind)[:300],
                "contentType": "application/json",
                "payload": {"$ref": f"#/components/schemas/{kind.__name__}"},
            },
        )
    channels["sessions"] = {
        "address": subjects.host_read.pattern.replace("{read}", HOST_SESSION),
        "description": "Open, message, pause, resume, inject, close and fork a chat session, "
        "answer its plans, read it and its events (as the HTTP routes do)",
        "parameters": {"tenant": {"description": "The tenant (the token's `tenant` claim)"}},
        "messages": {"HostSessionOp": {"$ref": "#/components/messages/HostSessionOp"}},
    }
    channels["sessionReplies"] = {
        "address": None,
        "description": "The requester's inbox; an error is a NATS micro error "
        '("<CODE>: <detail>")',
        "messages": {"SessionReply": {"$ref": "#/components/messages/SessionReply"}},
    }
    operations["session"] = {
        "action": "send",
        "channel": {"$ref": "#/channels/sessions"},
        "summary": "An operation on a chat session",
        "messages": [{"$ref": "#/channels/sessions/messages/HostSessionOp"}],
        "reply": {
            "channel": {"$ref": "#/channels/sessionReplies"},
            "messages": [{"$ref": "#/channels/sessionReplies/messages/SessionReply"}],
        },
    }


def asyncapi_document() -> str:
    """The AsyncAPI document as committed (`schemas/asyncapi.json`)."""
    return json.dumps(_document(), indent=2, sort_keys=True) + "\n"
