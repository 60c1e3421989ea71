"""A real model behind the `DecisionProvider` port: any OpenAI-compatible chat-completions API.

The model's input keeps its content boundaries (the decision protocol): the developer instruction
(and, in structured mode, the operator's capability catalog) is the only system text; the
principal's request and the untrusted content (evidence, observations) each go in their own user
message as a JSON document under a label (`user_input`, `untrusted`), so nothing a document or a
tool says is ever spliced into an instruction.

Two representations, one authority: structured output (the default) asks for a decision object
under a strict JSON schema; tool calling (`mode="tools"`, the host's explicit choice) offers each
capability as a function and normalises the call. Both end in the same `ModelDecision` types,
decoded strictly; the planner checks them the same way afterwards.

The capabilities shown are the model input's (the decision protocol): its agent's summary on the
first exchange (references only; in tools mode, a `request_capabilities` function), its catalog once
the model asked for it. A model input without capabilities (a run from before agent manifests) gets
the operator's static list, as before. In tools mode, `request_capabilities` and
`request_human_review` are functions too; the model is given no executor either way.

The critic (`verify`) is one more call of the same kind: its instruction is the only system
text, the objective is domain data, the answer with its evidence and observations is untrusted,
and its verdict (`accept`, or `replan` with a reason) is asked for under a strict schema in
either mode — the critic is offered no tool and runs nothing.

Bounds: each HTTP attempt has a timeout; a call makes at most `max_attempts` attempts, all
within `deadline_s`; `max_calls` caps the attempts of the whole provider instance. The per-run
caps are the planner's: a run takes at most `max_decisions` decisions, and every call first
reserves a provider call and tokens of the run's budget in governance (settled with the usage
the provider reports).

Streaming: given a `TextSink`, a decision is asked for with `stream: true` and the text of a
direct answer reaches the sink as it arrives (`_stream`); the assembled completion goes through
the same validation, and an attempt that is cut, lost or fails after showing text is reset on
the sink before it is retried. The package's modules: `_wire` (request and response shapes,
strict decoding), `_stream` (Server-Sent Events, the answer scanner), `_provider` (the exchange).
"""

from __future__ import annotations

from services.planner.openai_provider._provider import OpenAIProvider
from services.planner.openai_provider._wire import (
    MAX_CONTENT_CHARS,
    MAX_RESPONSE_BYTES,
    MAX_STREAM_BYTES,
    Capability,
    MalformedDecision,
    ModelCall,
    ModelRefused,
    ProviderCallsExhausted,
    ProviderError,
    ProviderMode,
    ProviderRejected,
    ProviderUnavailable,
    load_capabilities,
)

__all__ = [
    "MAX_CONTENT_CHARS",
    "MAX_RESPONSE_BYTES",
    "MAX_STREAM_BYTES",
    "Capability",
    "MalformedDecision",
    "ModelRefused",
    "OpenAIProvider",
    "ModelCall",
    "ProviderCallsExhausted",
    "ProviderError",
    "ProviderMode",
    "ProviderRejected",
    "ProviderUnavailable",
    "load_capabilities",
]
