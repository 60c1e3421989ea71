"""Decision providers: where the model's next decision comes from.

The decision protocol: `answer_directly`, `request_capabilities`, `select_capability`,
`request_human_review`; and the critic's verdict on an answer (the agent-OS runtime view's scenario
A): `accept` or
`replan` with a reason. The scripted provider reads decisions and verdicts from a file, so demos
and tests need no network; a real model provider plugs in behind the same `DecisionProvider`
port. Each call also says how many tokens it used, which the planner settles its budget with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Protocol

import msgspec

from schemas.base import refuse_unstorable
from services.planner.memory import message_now

__all__ = [
    "Accept",
    "AnswerDirectly",
    "CriticInput",
    "CriticVerdict",
    "ModelDecision",
    "ModelInput",
    "RequestCapabilities",
    "Replan",
    "RequestHumanReview",
    "ScriptedProvider",
    "SelectCapability",
    "TextSink",
]

SCRIPT_CHUNK_CHARS = 12  # about what a model streams per chunk: a few words at a time


class _Decision(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="decision"
):
    """What a model may answer; anything else is an error, never a guess (text the store
    cannot hold included: a `ValidationError`, so a malformed decision)."""

    def __post_init__(self) -> None:
        refuse_unstorable(self)


class SelectCapability(_Decision, tag="select_capability", omit_defaults=True, frozen=True):
    """Call a capability (its reference or its name: the target) with these arguments.

    `consequential`: the model asks, in a chat session's turn, that the user approve a plan
    before this call and the turn's later ones run (plan-mode, `sessions/_plans.py`). It can
    only add a plan: `false` (the default, omitted when encoded so earlier decisions keep their
    bytes) never skips one the session or the manifest asks for, and a run that is no chat
    turn ignores it (nobody is there to approve a plan; its calls are governed as ever).
    """

    capability: Annotated[str, msgspec.Meta(max_length=128)]
    arguments: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
    consequential: bool = False


class AnswerDirectly(_Decision, tag="answer_directly", frozen=True):
    """Finish the run with this answer."""

    answer: Annotated[str, msgspec.Meta(max_length=16384)]


class RequestCapabilities(_Decision, tag="request_capabilities", frozen=True):
    """Send the full catalog (signatures, types, grants needed) before the next decision."""

    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""


class RequestHumanReview(_Decision, tag="request_human_review", frozen=True):
    """Suspend the run until a person explicitly answers `review_prompt`."""

    review_prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""


ModelDecision = SelectCapability | AnswerDirectly | RequestCapabilities | RequestHumanReview


class ModelInput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The model's input, with its content boundaries kept apart (the decision protocol).

    `developer` is the only instruction (Writ's and the agent's responsibility), `user` is the
    principal's request (domain data), `untrusted` and `observations` are external content,
    `history` a chat session's memory before the turn.
    `capabilities` is the summary (count, references, input keys) until the model asked for the
    catalog, then the catalog. Defaults are omitted when encoded, so the digest of a model input
    from before a field existed is unchanged.
    """

    developer: str
    user: str
    untrusted: list[dict[str, Any]]
    observations: list[dict[str, Any]]
    turn: int
    agent: str = ""
    capabilities: dict[str, Any] | None = None
    # Operator text: an approver sent the command the model proposed back with a reason
    # (`inputs.revision_of`), composed by Writ and bounded; empty otherwise.
    revision: str = ""
    # A chat turn's session memory read back entry by entry (`memory.split_memory`): the user's
    # words, the agent's own selections and answers, Writ's records; `user` is then the
    # message now. A provider shows each as who said it, never the agent's words as the user's.
    history: list[dict[str, Any]] = []


class _Verdict(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="verdict"
):
    """What a critic may answer; anything else is an error, never a guess."""

    def __post_init__(self) -> None:
        refuse_unstorable(self)


class Accept(_Verdict, tag="accept", frozen=True):
    """The answer meets the objective: the run ends with it."""


class Replan(_Verdict, tag="replan", frozen=True):
    """The answer does not meet the objective: the agent plans again, told `reason`."""

    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


CriticVerdict = Accept | Replan


class CriticInput(msgspec.Struct, frozen=True, kw_only=True):
    """The critic's input: its instruction, the objective (the principal's request, domain
    data), and the answer to verify with the evidence and observations it rests on (external
    content: none of it instructs the critic). `round` counts the critic's earlier verdicts."""

    developer: str
    objective: str
    answer: str
    untrusted: list[dict[str, Any]]
    observations: list[dict[str, Any]]
    round: int
    agent: str


class TextSink(Protocol):
    """Where a provider streams the user-visible text of an answer as it arrives.

    `reset(reason)` says the text passed since the last reset belongs to an attempt that was
    abandoned (cut, lost, malformed or not an answer after all): a client discards it. After a
    decision returns, the text passed since the last reset is exactly its answer.
    """

    async def delta(self, text: str) -> None: ...

    async def reset(self, reason: str) -> None: ...


class DecisionProvider(Protocol):
    """A model, or something standing in for one.

    `decide_with_usage` and `verify` also return the tokens the call used (what the planner
    settles the run's token budget with).
    """

    async def decide(self, model_input: ModelInput) -> ModelDecision: ...

    async def decide_with_usage(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, int]: ...

    async def verify(self, critic_input: CriticInput) -> tuple[CriticVerdict, int]: ...


_Decisions = Annotated[list[ModelDecision], msgspec.Meta(min_length=1, max_length=100)]
_Verdicts = Annotated[list[CriticVerdict], msgspec.Meta(min_length=1, max_length=100)]


class ScriptCase(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One of an agent's scripts, taken when every word of `when` occurs in the user's
    request (case-insensitive; for a chat turn, the message now); no `when`: any request."""

    decisions: _Decisions
    when: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]],
        msgspec.Meta(max_length=16),
    ] = []


class _Script(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    decisions: _Decisions
    agents: Annotated[dict[str, _Decisions], msgspec.Meta(max_length=100)] = {}
    critics: Annotated[dict[str, _Verdicts], msgspec.Meta(max_length=100)] = {}
    cases: Annotated[
        dict[str, Annotated[list[ScriptCase], msgspec.Meta(min_length=1, max_length=16)]],
        msgspec.Meta(max_length=100),
    ] = {}


class ScriptedProvider:
    """Answers turn n with the n-th decision of a script; past the end, it answers done.

    A script may give some agents their own decisions; the others follow `decisions`. An
    agent with `cases` follows the first case whose words all occur in the request (a script
    that tells a request to write from a question apart, and says it is a script). A
    critic's round n gets the n-th verdict of its agent's `critics`; past the end, or for an
    agent without any, it accepts.
    """

    def __init__(
        self,
        decisions: list[ModelDecision],
        by_agent: dict[str, list[ModelDecision]] | None = None,
        critics: dict[str, list[CriticVerdict]] | None = None,
        cases: dict[str, list[ScriptCase]] | None = None,
    ) -> None:
        self._decisions = decisions
        # What a spend cap's price table calls this model.
        self.priced_as = "scripted/scripted"
        self._by_agent = by_agent or {}
        self._critics = critics or {}
        self._cases = cases or {}

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedProvider:
        """Load and validate a script: `{"decisions": [...], "agents": {"<agent>": [...]},
        "critics": {"<agent>": [{"verdict": "replan", "reason": "..."}, ...]}}`."""
        script = msgspec.json.decode(Path(path).read_bytes(), type=_Script)
        return cls(
            list(script.decisions),
            {k: list(v) for k, v in script.agents.items()},
            {k: list(v) for k, v in script.critics.items()},
            {k: list(v) for k, v in script.cases.items()},
        )

    def _script_for(self, model_input: ModelInput) -> list[ModelDecision]:
        cases = self._cases.get(model_input.agent)
        if cases:
            asked = message_now(model_input.user).casefold()
            for case in cases:
                if all(word.casefold() in asked for word in case.when):
                    return case.decisions
        return self._by_agent.get(model_input.agent, self._decisions)

    async def decide(self, model_input: ModelInput) -> ModelDecision:
        """The scripted decision for this agent and turn."""
        decisions = self._script_for(model_input)
        if model_input.revision:
            # A script cannot revise what it proposed: it says so rather than go on as if.
            return AnswerDirectly(
                answer="This agent's decisions are a script: it cannot revise the command it "
                "proposed, so nothing was done. " + model_input.revision
            )
        if model_input.turn < len(decisions):
            return decisions[model_input.turn]
        return AnswerDirectly(answer="The script has no further steps.")

    async def decide_with_usage(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, int]:
        """The scripted decision, and 0 tokens: reading a script spends none, and the planner
        settles what was really used rather than a made-up count. With `text`, a direct
        answer is streamed to it in chunks of a few words, as a model would."""
        decision = await self.decide(model_input)
        if text is not None and isinstance(decision, AnswerDirectly):
            for chunk in text_chunks(decision.answer):
                await text.delta(chunk)
        return decision, 0

    async def verify(self, critic_input: CriticInput) -> tuple[CriticVerdict, int]:
        """The scripted verdict for this agent and round (accept by default), and 0 tokens."""
        verdicts = self._critics.get(critic_input.agent, [])
        if critic_input.round < len(verdicts):
            return verdicts[critic_input.round], 0
        return Accept(), 0


def text_chunks(text: str, size: int = SCRIPT_CHUNK_CHARS) -> list[str]:
    """`text` cut into pieces of about `size` characters, at spaces where it can be."""
    chunks: list[str] = []
    while text:
        cut = text.rfind(" ", 1, size) + 1 if len(text) > size else len(text)
        cut = cut or size
        chunks.append(text[:cut])
        text = text[cut:]
    return chunks
