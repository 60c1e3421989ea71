"""What a plan step freezes for a selection, and the facts it stands on.

For an action, a step holds what the action's contract resolves from the model's request, as
admission will resolve it: the request decoded strictly and NFC-normalised (`request`: what is
sent to admission when the step is taken, whatever the model writes then), the frozen
arguments, and the preview. An action whose preview stands on facts (a refund's payment, a
host ticket, a mail draft) has them read by admission as the plan is proposed (`PlanFacts.keep`,
`writ.int.admission.plan_facts`): admission reads them as it reads a proposal's, from the only
services holding the credentials to read them, keeps them for evaluation, and answers with
them; the planner holds no credential, and the facts are shown to the user in the plan, never
to the model. When the step is taken they are read again here (`ReadFacts` on
`writ.int.dispatcher.facts`, or `writ.int.retrieval.facts` for a host record). For a read or
an agent call, the step holds its arguments NFC-normalised, and no preview.

When an approved plan's facts-bound step is taken, its facts are read again and resolved again:
a step whose arguments or preview now differ from the approved ones is refused (`PLAN_STALE`,
`_plans.py`): an approval consents to what it was shown, not to what the facts became since.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from actions import ACTIONS
from actions.base import ActionContract, FactsRef, Invalid
from libs.deadline import timed_request
from libs.errors import RetryableError
from libs.facts import read_facts
from schemas.admission import PlanFactsRecorded, PlannedStep, RecordPlanFacts
from schemas.subjects import PLAN_FACTS

__all__ = [
    "FactsReader",
    "PlanFacts",
    "Resolution",
    "canonical",
    "changed",
    "contract_of",
    "nfc",
    "request_of",
    "resolve",
]

FactsReader = Callable[[FactsRef], Awaitable[dict[str, Any] | None]]
_MAX_CHANGED: Final = 6  # preview fields named in a stale step's reason


def nfc(value: Any) -> Any:
    """NFC, as admission normalises a request before freezing it: "é" typed two ways is one."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        return {nfc(k): nfc(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nfc(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """`value` as JSON with sorted keys: how two resolutions are compared."""
    return msgspec.json.encode(value, order="sorted")


def contract_of(capability: str) -> ActionContract[Any, Any, Any, Any] | None:
    """The action contract a selection names (by its name or its `action:` reference)."""
    return ACTIONS.get(capability.removeprefix("action:"))


class Resolution(msgspec.Struct, frozen=True, kw_only=True):
    """What a plan step freezes: the request sent when it is taken, the arguments and the
    preview the contract resolves (empty for what is not an action, or what the contract
    refuses: admission refuses it too), and why it did not resolve, if it did not."""

    request: dict[str, Any]
    arguments: dict[str, Any]
    preview: dict[str, Any] = {}
    facts: FactsRef | None = None
    unresolved: str = ""


def request_of(capability: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(the request a selection's arguments are, NFC-normalised and, for an action, decoded
    strictly with its defaults filled in; the typed request, None if there is none)."""
    contract = contract_of(capability)
    written = nfc(dict(arguments))
    if contract is None:
        return written, None
    try:
        typed = contract.decode_request(written)
    except (Invalid, msgspec.ValidationError):
        return written, None
    return nfc(msgspec.to_builtins(typed)), typed


async def resolve(
    capability: str, arguments: dict[str, Any], read: FactsReader | None = None
) -> Resolution:
    """What a plan step freezes for this selection; `read` gives the facts a facts-bound
    action's preview stands on (None: such an action's preview is left empty).

    Raises:
        RetryableError: the facts could not be read now (from `read`).
    """
    request, typed = request_of(capability, arguments)
    contract = contract_of(capability)
    if contract is None or typed is None:
        return Resolution(request=request, arguments=request)
    ref = contract.facts_ref(typed)
    facts = None
    try:
        if ref is not None:
            if read is None:
                return Resolution(request=request, arguments=request, facts=ref)
            raw = await read(ref)
            facts = None if raw is None else contract.decode_facts(raw)
        frozen = contract.checked(contract.resolve(typed, facts))
    except (Invalid, msgspec.ValidationError) as exc:
        return Resolution(request=request, arguments=request, facts=ref, unresolved=str(exc)[:256])
    # The preview as admission keeps it (not normalised: it is compared with admission's).
    return Resolution(
        request=request,
        arguments=nfc(msgspec.to_builtins(frozen.arguments)),
        preview=msgspec.to_builtins(frozen.preview),
        facts=ref,
    )


def changed(
    planned_arguments: dict[str, Any], planned_preview: dict[str, Any], now: Resolution
) -> str | None:
    """What differs between an approved step and its resolution now (None: nothing)."""
    if now.unresolved:
        return f"it no longer resolves: {now.unresolved}"
    if canonical(planned_arguments) == canonical(now.arguments) and (
        canonical(planned_preview) == canonical(now.preview)
    ):
        return None
    fields = sorted(
        k
        for k in {*planned_preview, *now.preview}
        if canonical(planned_preview.get(k)) != canonical(now.preview.get(k))
    )
    shown = ", ".join(fields[:_MAX_CHANGED]) or "its arguments"
    return f"{shown} changed since the plan was approved"


class PlanFacts:
    """Reads the facts a plan step's preview stands on, as admission reads them."""

    def __init__(self, *, nc: Client, timeout_s: float = 5.0) -> None:
        self._nc, self._timeout = nc, timeout_s

    def reader(
        self, tenant: str, kept: dict[int, Any] | None = None, step: int = -1
    ) -> FactsReader:
        """A `FactsReader` of this tenant's resources (`kept`: what `keep` answered; a step it
        holds is given the facts admission read for it, found or not, and read no more)."""

        async def read(ref: FactsRef) -> dict[str, Any] | None:
            if kept is not None and step in kept:
                return kept[step]
            return await self.read(tenant, ref)

        return read

    async def read(self, tenant: str, ref: FactsRef) -> dict[str, Any] | None:
        """The resource's state now (None: no such resource).

        Raises:
            RetryableError: nobody answered, or the reader could not read it now.
        """
        return await read_facts(self._nc, tenant, ref.kind, ref.id, timeout=self._timeout)

    async def keep(
        self, tenant: str, run_id: str, planned: list[tuple[int, str, dict[str, Any]]]
    ) -> dict[int, dict[str, Any] | None]:
        """Admission reads the facts of a proposed plan's steps (`(step, capability,
        arguments)`) and keeps them for evaluation (`services/admission/_plan_facts.py`):
        what it read, by step (a step standing on no facts is absent; no step standing on any
        asks nothing).

        Raises:
            RetryableError: admission did not keep them now (no plan is shown before).
        """
        steps = []
        for step, capability, arguments in planned:
            request, typed = request_of(capability, arguments)
            contract = contract_of(capability)
            if contract is not None and typed is not None and contract.facts_ref(typed):
                steps.append(PlannedStep(step=step, capability=capability, request=request))
        if not steps:
            return {}
        ask = RecordPlanFacts(tenant=tenant, run_id=run_id, steps=steps)
        try:
            reply = await timed_request(
                self._nc, PLAN_FACTS, msgspec.json.encode(ask), timeout=2 * self._timeout
            )
        except (NatsTimeoutError, NoRespondersError) as exc:
            raise RetryableError(f"admission did not keep the plan's facts: {exc!r}") from exc
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            said = reply.headers.get("Nats-Service-Error")
            raise RetryableError(f"admission did not keep the plan's facts: {said}")
        kept = msgspec.json.decode(reply.data, type=PlanFactsRecorded)
        return {s.step: s.facts for s in kept.steps}
