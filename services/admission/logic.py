"""Turning a proposal into a contract: validation, canonical hash, operation id. No I/O."""

from __future__ import annotations

import hashlib
import unicodedata
import uuid
from datetime import datetime
from typing import Any, Final

import msgspec
import rfc8785

from actions import ACTIONS, ActionContract
from actions.base import Invalid
from schemas.planner import ProposeCommand, preview_digest
from services.admission._rows import ResolvedFacts

__all__ = [
    "Invalid",
    "Resolved",
    "Validated",
    "canonical_hash",
    "operation_id_for",
    "plan_refusal",
    "plan_step_id_for",
    "proposal_id_for",
    "resolve",
    "decode_request",
    "resolved_facts",
    "validate",
]

_OPERATION_NAMESPACE: Final = uuid.UUID("0b7e3c2a-6d51-4f0e-8c1a-93a5d2f4b6e8")
# Host keys get their own namespace, so no run/step pair can ever name a host's operation.
_HOST_KEY_NAMESPACE: Final = uuid.UUID("d2a4f6c8-1e3b-4d5f-a7c9-0b2d4f6a8c1e")
_PROPOSAL_NAMESPACE: Final = uuid.UUID("5c9a1e47-2b3d-4a6f-9e08-71d4c3b2a195")
_PLAN_STEP_NAMESPACE: Final = uuid.UUID("8e1f0b6d-4c2a-4f57-b3d9-2a6c7e05f1b4")


class Validated(msgspec.Struct, frozen=True, kw_only=True):
    """A proposal whose request fits the action's contract, with the request's canonical hash.

    `arguments` is the validated request as plain data (normalised); `request` the same, typed.
    The hash is over what the caller asked for: resolving it against the state of the moment
    comes after, so a replay of the same request is recognised whatever the state is now.
    """

    contract: ActionContract[Any, Any, Any, Any]
    arguments: dict[str, Any]
    request: Any
    request_hash: bytes


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    """The frozen arguments and the preview, as plain data to store together."""

    arguments: dict[str, Any]
    preview: dict[str, Any]


def _normalise(value: Any) -> Any:
    # NFC so that "é" typed two ways hashes the same; numbers are left to RFC 8785's form.
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        normal = {_normalise(k): _normalise(v) for k, v in value.items()}
        if len(normal) != len(value):
            # Two keys that are one key after NFC: which value wins would depend on order.
            raise Invalid("two argument names differ only in their unicode form")
        return normal
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    return value


def canonical_hash(
    *,
    tenant: str,
    principal: str,
    action: str,
    version: int,
    arguments: dict[str, Any],
    target: str | None = None,
    expected_revision: str | None = None,
    agent: str | None = None,
) -> bytes:
    """SHA-256 over the RFC 8785 canonical JSON of the validated fields (the reference
    architecture).

    It binds everything an operation key names: tenant, principal, agent, action, the
    validated arguments and the expected revision; any of them changed under the same key is
    a conflict. Key order, unicode normal form and number spelling cannot change it.
    """
    document = _normalise(
        {
            "tenant": tenant,
            "principal": principal,
            "action": action,
            "version": version,
            "arguments": arguments,
            "target": target,
            "expected_revision": expected_revision,
            **({"agent": agent} if agent is not None else {}),
        }
    )
    return hashlib.sha256(rfc8785.dumps(document)).digest()


def decode_request(action: str, arguments: dict[str, Any]) -> tuple[Any, Any]:
    """(the action's contract, the arguments as its typed request), normalised first so the
    contract's bounds are checked on what will be frozen.

    Raises:
        Invalid: no such action, or the arguments do not fit it.
    """
    contract = ACTIONS.get(action)
    if contract is None:
        raise Invalid(f"unknown action {action!r}")
    return contract, contract.decode_request(_normalise(arguments))


def validate(proposal: ProposeCommand) -> Validated:
    """Convert the model's arguments into the action's typed, closed arguments."""
    contract, typed = decode_request(proposal.action, proposal.arguments)
    arguments = _normalise(msgspec.to_builtins(typed))
    return Validated(
        contract=contract,
        arguments=arguments,
        request=typed,
        request_hash=canonical_hash(
            tenant=proposal.tenant,
            principal=proposal.principal,
            action=contract.name,
            version=contract.version,
            arguments=arguments,
            agent=proposal.agent,
            expected_revision=proposal.expected_revision,
        ),
    )


def plan_refusal(proposal: ProposeCommand, resolved: Resolved) -> str | None:
    """Why a plan's step may not be admitted: the preview resolved now is not the one the
    approved plan showed (None: it is, or the proposal is no plan's step)."""
    if proposal.plan_preview is None or preview_digest(resolved.preview) == (proposal.plan_preview):
        return None
    return (
        "the facts its preview stands on changed since the user approved the plan; "
        "a revised plan is needed"
    )


def resolve(validated: Validated, facts: Any) -> Resolved:
    """Resolve the request against the facts read for it (None: none needed, or not found):
    defaults, derived values and the preview, computed by the contract's code."""
    contract = validated.contract
    typed_facts = None
    if facts is not None:
        try:
            typed_facts = contract.decode_facts(facts)
        except msgspec.ValidationError as exc:
            raise Invalid(f"the state {contract.name} depends on is unreadable: {exc}") from exc
    frozen = contract.resolve(validated.request, typed_facts)
    return Resolved(
        arguments=_normalise(msgspec.to_builtins(frozen.arguments)),
        preview=msgspec.to_builtins(frozen.preview),
    )


def operation_id_for(tenant: str, run_id: str, step: int, operation_key: str | None = None) -> str:
    """The durable id of one business intent: chosen once, the same on every retry.

    A host's own operation key names its intent; otherwise the run's step does. Either way the
    id is scoped to the tenant.
    """
    if operation_key is not None:
        return str(uuid.uuid5(_HOST_KEY_NAMESPACE, f"{tenant}\x00{operation_key}"))
    return str(uuid.uuid5(_OPERATION_NAMESPACE, f"{tenant}\x00{run_id}\x00{step}"))


def proposal_id_for(tenant: str, run_id: str, step: int) -> str:
    """The proposal's opaque id, stable across redeliveries of the same model step."""
    return str(uuid.uuid5(_PROPOSAL_NAMESPACE, f"{tenant}\x00{run_id}\x00{step}"))


def plan_step_id_for(tenant: str, run_id: str, step: int) -> str:
    """The id `admission.resolved_facts` keeps a proposed plan's step under: of its own
    namespace, so a plan's step never takes (or overwrites) a proposal's row."""
    return str(uuid.uuid5(_PLAN_STEP_NAMESPACE, f"{tenant}\x00{run_id}\x00{step}"))


def resolved_facts(
    p: ProposeCommand,
    proposal_id: str,
    valid: Validated,
    facts: Any,
    read_at: datetime | None,
) -> ResolvedFacts | None:
    """The facts this proposal was resolved against, as `admission.resolved_facts` keeps them
    (None: it stands on none, or none were found)."""
    ref = valid.contract.facts_ref(valid.request)
    if ref is None or facts is None or read_at is None:
        return None
    return ResolvedFacts(
        tenant=p.tenant,
        proposal_id=proposal_id,
        run_id=p.run_id,
        step=p.step,
        action=valid.contract.name,
        kind=ref.kind,
        ref=ref.id,
        facts=facts,
        read_at=read_at,
    )
