"""Action contracts: every operation a model may propose, one module each (the approval-contracts
note).

Adding an action means adding one module here (its request, facts, arguments, preview,
revalidation, result rendering and, for a local operation, its executor), registering it below,
and its tests. Admission resolves and freezes it, the dispatcher revalidates and executes it.
"""

from __future__ import annotations

from typing import Any, Final

from actions.base import ActionContract, Family
from actions.crm_note_create import CrmNoteCreate
from actions.email_draft_apply import EmailDraftApply
from actions.host_ticket_comment_create import HostTicketCommentCreate
from actions.host_ticket_update import HostTicketUpdate
from actions.payment_charge_create import PaymentChargeCreate
from actions.payment_refund import PaymentRefund
from actions.writ_noop import WritNoop

__all__ = ["ACTIONS", "ActionContract", "Family"]

ACTIONS: Final[dict[str, ActionContract[Any, Any, Any, Any]]] = {
    contract.name: contract
    for contract in (
        CrmNoteCreate(),
        PaymentChargeCreate(),
        PaymentRefund(),
        EmailDraftApply(),
        WritNoop(),
        HostTicketCommentCreate(),
        HostTicketUpdate(),
    )
}
