"""What every action contract is (the approval-contracts note): the small common part of all of
them.

A contract defines, together and in one module: the small request the model may send, the facts
of current state its preview stands on, how code resolves the request against those facts into
frozen typed arguments and a typed preview, how execution proves those facts still hold, and how
its result is rendered. The lifecycle, the approval identity, the outcome vocabulary and the
audit events are common and live here; everything that understands an operation lives in its
contract.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

import msgspec

from schemas.base import Family
from schemas.dispatcher import FactsKind

__all__ = [
    "AUDIT_EVENTS",
    "CONSEQUENTIAL",
    "ActionContract",
    "Effect",
    "Family",
    "FactsRef",
    "Frozen",
    "Invalid",
    "Outcome",
    "ProviderCall",
    "ProviderLookup",
    "Stale",
    "money",
    "outcome_of",
]

# The audit events of every proposal's lifecycle (docs/design.md §6 and §7), in order of occurrence.
AUDIT_EVENTS = (
    "proposed",
    "previewed",
    "decided",
    "approved",
    "rejected",
    "expired",
    "admitted",
    "revalidated",
    "attempted",
    "outcome",
    "reconciled",
)

# What an action does beyond writing a record: it moves money, changes who may access what, or
# sends something outside the organisation. Each of these is consequential: no standing grant
# covers it unless its contract says so in as many words (`standing_grant = "allowed"`).
Effect = Literal["money", "access", "send_outside"]
CONSEQUENTIAL: frozenset[Effect] = frozenset({"money", "access", "send_outside"})

RequestT = TypeVar("RequestT", bound=msgspec.Struct)
ArgumentsT = TypeVar("ArgumentsT", bound=msgspec.Struct)
PreviewT = TypeVar("PreviewT", bound=msgspec.Struct)
FactsT = TypeVar("FactsT", bound=msgspec.Struct)


class Invalid(Exception):
    """The model's request does not fit the contract; the message is safe to show the model."""


class Stale(Exception):
    """A fact the preview stated is no longer true; the message is safe to show a person."""


class FactsRef(msgspec.Struct, frozen=True, kw_only=True):
    """Which state a preview stands on: `kind` names the reader, `id` the resource."""

    kind: FactsKind
    id: str


class ProviderCall(msgspec.Struct, frozen=True, kw_only=True):
    """The executor of an external action: the request its provider's API takes.

    The connector adds what belongs to the provider rather than the action: where it is, the
    credential, and the operation's key in the provider's header (the same on every attempt).
    """

    path: str
    body: dict[str, Any]
    receipt: str  # the response field naming what was made
    method: Literal["POST", "PATCH"] = "POST"
    # The revision the preview showed, frozen with the arguments: the provider refuses (412) if
    # the record moved on since (a command's own `expected_revision`, when set, comes first).
    if_match: str | None = None

    def body_bytes(self) -> bytes:
        """The exact request body sent: compact JSON with sorted keys, so the bytes an approval
        receipt's digest names at admission are the bytes the connector sends."""
        return msgspec.json.encode(self.body, order="sorted")


class ProviderLookup(msgspec.Struct, frozen=True, kw_only=True):
    """How to ask the provider what it made under an operation's key."""

    path: str
    params: dict[str, str]
    listed_as: str  # the response's list of what was made
    receipt: str


class Frozen(msgspec.Struct, Generic[ArgumentsT, PreviewT], frozen=True, kw_only=True):
    """Arguments and preview, built from the same validated facts and frozen together."""

    arguments: ArgumentsT
    preview: PreviewT


class ActionContract(Generic[RequestT, ArgumentsT, PreviewT, FactsT]):
    """One action. Subclasses set the class attributes and override what their action needs.

    By default the request is the arguments, there are no facts to read, and the preview shows
    the arguments as they are: right for actions whose every field the model may choose.
    """

    name: ClassVar[str]
    version: ClassVar[int]
    family: ClassVar[Family]
    # Who executes it in the dispatcher: a connector's name, or "local" for an operation that
    # commits its business change and its outcome in one Postgres transaction.
    connector: ClassVar[str]
    description: ClassVar[str]
    request: ClassVar[type[msgspec.Struct]]
    arguments: ClassVar[type[msgspec.Struct]]
    preview: ClassVar[type[msgspec.Struct]]
    facts: ClassVar[type[msgspec.Struct] | None] = None
    # What decide needs beyond the family: whether the action only touches the conversation or
    # the agent's own memory (line 3), and whether it proposes a profile fact (line 5: ask).
    scope: ClassVar[Literal["external", "conversation", "own_memory"]] = "external"
    profile_fact: ClassVar[bool] = False
    # What the action does that makes it consequential, and whether a standing grant (an
    # "always" answer, or a grant given for a run) may cover it. None: by its effects and
    # family: an action that moves money, changes access or sends outside (its effects, or
    # the `send_external` family) is never covered, like code execution: it asks a person
    # every time, with once and deny only.
    effects: ClassVar[frozenset[Effect]] = frozenset()
    standing_grant: ClassVar[Literal["allowed", "never"] | None] = None
    # How an evaluation compares a candidate's arguments with the expected ones (`writ eval`),
    # after this contract's `resolve`: `reach` fields say how far the action goes (an amount,
    # a number of recipients, a limit), so a larger value is a widening of scope whatever else
    # scores; `free_text` fields are not gated (wording may differ); `matches` declares a
    # looser comparison than exact for a field ("casefold").
    reach: ClassVar[frozenset[str]] = frozenset()
    free_text: ClassVar[frozenset[str]] = frozenset()
    matches: ClassVar[dict[str, Literal["exact", "casefold"]]] = {}
    # Four eyes: from this amount (the preview's `amount_cents`, in minor units) a proposal
    # needs two distinct approvers, neither of them its requester. None: one approver.
    two_approvers_from_cents: ClassVar[int | None] = None

    def approvers_needed(self, preview: dict[str, Any]) -> int:
        """How many distinct people must approve a proposal with this (stored) preview."""
        amount = preview.get("amount_cents")
        if self.two_approvers_from_cents is None or not isinstance(amount, int):
            return 1
        return 2 if amount >= self.two_approvers_from_cents else 1

    def grant_may_cover(self) -> bool:
        """Whether a standing grant (or a run's grant) may allow this action without asking."""
        if self.standing_grant is not None:
            return self.standing_grant == "allowed"
        return not (self.effects & CONSEQUENTIAL) and self.family != "send_external"

    def facts_ref(self, request: RequestT) -> FactsRef | None:
        """The state this request's preview stands on (None: the request alone suffices)."""
        return None

    def resolve(self, request: RequestT, facts: FactsT | None) -> Frozen[ArgumentsT, PreviewT]:
        """Defaults, derived values and the preview, computed by code; raises `Invalid`."""
        # A ClassVar cannot carry the class's type parameters: the contract's own types, cast.
        arguments = cast(ArgumentsT, msgspec.convert(msgspec.to_builtins(request), self.arguments))
        return Frozen(arguments=arguments, preview=self.preview_of(arguments))

    def checked(self, frozen: Frozen[ArgumentsT, PreviewT]) -> Frozen[ArgumentsT, PreviewT]:
        """`frozen`, if its arguments (built from facts) fit their own bounds; else `Invalid`.

        Struct constructors do not check bounds: arguments that could not be decoded again
        would be shown to an approver and only fail once approved.
        """
        try:
            self.decode_arguments(msgspec.to_builtins(frozen.arguments))
        except msgspec.ValidationError as exc:
            raise Invalid(
                f"{self.name}: the current state does not fit the contract: {exc}"
            ) from exc
        return frozen

    def preview_of(self, arguments: ArgumentsT) -> PreviewT:
        """The preview of arguments that need no facts."""
        return cast(PreviewT, msgspec.convert(msgspec.to_builtins(arguments), self.preview))

    def facts_ref_of(self, arguments: ArgumentsT) -> FactsRef | None:
        """At execution: the state to reload to prove the preview still holds."""
        return None

    def revalidate(
        self, arguments: ArgumentsT, preview: PreviewT, facts: FactsT | None, *, key: str
    ) -> None:
        """Raise `Stale` with a reason safe to show if a fact the preview stated changed.

        `key` is the operation's provider key: what this very operation already did (an
        earlier attempt under the same key) is not a change of the world.
        """

    def provider_call(self, arguments: ArgumentsT) -> ProviderCall:
        """The executor of an external action (dispatcher side only)."""
        raise NotImplementedError(f"{self.name} is not executed by a provider")

    def provider_lookup(self, key: str) -> ProviderLookup | None:
        """How a queryable provider finds what it made under `key` (None: it cannot)."""
        return None

    def describe(self, preview: PreviewT) -> list[tuple[str, str]]:
        """What an approver reads, as (label, plain text) lines in reading order: the console
        renders a proposal with this, never as JSON. By default each preview field as it is."""
        return [
            (name.replace("_", " ").capitalize(), _plain(value))
            for name, value in msgspec.structs.asdict(preview).items()
        ]

    def render(self, receipt: str | None) -> str:
        """The result, safe to show a person and the model."""
        return f"{self.name} done" + (f" ({receipt})" if receipt else "")

    # -- decoding at the boundaries: an operation is only ever decoded with its own types ----

    def decode_request(self, raw: dict[str, Any]) -> RequestT:
        """The model's request, strictly: unknown fields, wrong types and bounds are `Invalid`."""
        try:
            return msgspec.convert(raw, self.request, strict=True)  # type: ignore[return-value]
        except msgspec.ValidationError as exc:
            raise Invalid(f"{self.name} v{self.version}: {exc}") from exc

    def decode_arguments(self, raw: dict[str, Any]) -> ArgumentsT:
        """Frozen arguments read back from storage (raises `msgspec.ValidationError`)."""
        return msgspec.convert(raw, self.arguments)  # type: ignore[return-value]

    def decode_preview(self, raw: dict[str, Any]) -> PreviewT:
        """A frozen preview read back from storage (raises `msgspec.ValidationError`)."""
        return msgspec.convert(raw, self.preview)  # type: ignore[return-value]

    def decode_facts(self, raw: Any) -> FactsT:
        """Facts as a reader returned them (raises `msgspec.ValidationError`)."""
        assert self.facts is not None
        return msgspec.convert(raw, self.facts)  # type: ignore[return-value]


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a person and a system may do next (docs/design.md §6), from a command's recorded state.

    `kind` is one of succeeded, needs_reconciliation, revision_required, denied, expired,
    terminal_failure; `detail` is safe to show (never a stack trace); `correlation_id` names a
    terminal failure in the operators' records.
    """

    kind: Literal[
        "pending",
        "succeeded",
        "needs_reconciliation",
        "revision_required",
        "denied",
        "expired",
        "terminal_failure",
    ]
    detail: str = ""
    receipt: str | None = None
    correlation_id: str | None = None


def outcome_of(
    state: str, *, receipt: str | None, reason: str | None, operation_id: str
) -> Outcome:
    """Classify a command's recorded state: the application decides, never the model."""
    if state == "succeeded":
        return Outcome(kind="succeeded", receipt=receipt, detail=reason or "")
    if state == "unknown":
        return Outcome(
            kind="needs_reconciliation",
            detail=f"the provider's answer was lost; see `writ reconcile list` "
            f"for operation {operation_id}",
        )
    if state in ("revision_required", "denied", "expired"):
        return Outcome(kind=state, detail=reason or state)  # type: ignore[arg-type]
    if state == "failed":
        return Outcome(
            kind="terminal_failure",
            correlation_id=operation_id,
            detail="the operation failed and will not be retried; quote the "
            "correlation id to an operator",
        )
    return Outcome(kind="pending", detail=state)


def _plain(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    if isinstance(value, msgspec.Struct | dict):
        items = msgspec.to_builtins(value).items()
        return "; ".join(f"{k.replace('_', ' ')}: {_plain(v)}" for k, v in items)
    return str(value)


def money(cents: int, currency: str) -> str:
    """An amount in minor units as a person reads it (`1,500` cents EUR: `15.00 EUR`)."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{part:02d} {currency}"
