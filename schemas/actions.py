"""Action contracts: the closed, versioned schema of each action a model may propose.

The model writes an action name and arguments; admission converts the arguments into the
contract's `arguments` type (unknown fields and over-long values are errors) before anything else
looks at them. The dispatcher maps each action to a connector by `connector`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = [
    "ACTIONS",
    "ActionContract",
    "CrmNoteCreate",
    "Family",
    "PaymentChargeCreate",
    "WritNoop",
]

Family = Literal["read", "read_personal", "write_delete", "send_external", "execute_code"]


class CrmNoteCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Add a note to a customer record in the CRM."""

    customer_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9][A-Z0-9-]{0,63}(?!\n)$")]
    body: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]


class PaymentChargeCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Charge a customer through the payment provider."""

    customer_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9][A-Z0-9-]{0,63}(?!\n)$")]
    amount_cents: Annotated[int, msgspec.Meta(ge=1, le=100_000_000)]
    currency: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{3}(?!\n)$")]
    description: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


class WritNoop(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Do nothing, through the whole governed path: a canary, and the benchmark's action."""

    marker: Annotated[str, msgspec.Meta(max_length=128)] = ""


class ActionContract(msgspec.Struct, frozen=True, kw_only=True):
    """What Writ knows about an action: its family, version, arguments and connector."""

    name: str
    version: int
    family: Family
    connector: str
    arguments: type
    description: str
    # What decide needs beyond the family: whether the action only touches the conversation or
    # the agent's own memory (line 3), and whether it proposes a profile fact (line 5: ask).
    scope: Literal["external", "conversation", "own_memory"] = "external"
    profile_fact: bool = False


ACTIONS: Final[dict[str, ActionContract]] = {
    contract.name: contract
    for contract in (
        ActionContract(
            name="crm.note.create", version=1, family="write_delete", connector="crm",
            arguments=CrmNoteCreate, description="Add a note to a customer record.",
        ),
        ActionContract(
            name="payment.charge.create", version=1, family="write_delete",
            connector="payments", arguments=PaymentChargeCreate,
            description="Charge a customer.",
        ),
        ActionContract(
            name="writ.noop", version=1, family="write_delete", connector="noop",
            arguments=WritNoop, description="Do nothing, governed like any other write.",
        ),
    )
}
