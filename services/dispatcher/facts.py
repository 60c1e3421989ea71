"""The facts a preview stands on, read from the system of record by the only process that holds
its credentials: for admission before a proposal is shown (request/reply on
`writ.int.dispatcher.facts`, `ReadFacts` -> `FactsRead`), and for the dispatcher's own
revalidation before it acts."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from nats.micro.request import Request

from actions import ACTIONS
from actions.email_draft_apply import EmailDraftApply
from libs.errors import PermanentError
from schemas.dispatcher import FactsRead, ReadFacts
from services.dispatcher.connectors import Connector
from services.dispatcher.store import DispatcherStore

__all__ = ["FactsReader"]

log = logging.getLogger("writ.dispatcher")


class FactsReader:
    """Reads a resource's state now: a mail draft from Postgres, a payment from its provider."""

    def __init__(self, *, store: DispatcherStore, connectors: dict[str, Connector]) -> None:
        self._store, self._connectors = store, connectors
        self._encoder = msgspec.json.Encoder()

    async def read(self, tenant: str, kind: str, resource: str) -> dict[str, Any] | None:
        """The system of record's state now (None: no such resource).

        Raises:
            PermanentError: nothing here reads this kind of resource.
            RetryableError: it cannot be read now.
        """
        if kind == "mail_draft":
            contract = ACTIONS["email.draft.apply"]
            assert isinstance(contract, EmailDraftApply)
            async with self._store.transaction() as conn:
                draft = await contract.read_local(conn, tenant, resource)
            return None if draft is None else msgspec.to_builtins(draft)
        connector = self._connectors.get("payments")
        if kind != "payment" or connector is None:
            raise PermanentError(f"no reader for {kind}")
        return await connector.read_payment(resource)  # type: ignore[attr-defined]

    async def serve(self, request: Request) -> None:
        """`writ.int.dispatcher.facts`: 400 undecodable, 404 nothing reads it, 503 not now."""
        try:
            ask = msgspec.json.decode(request.data, type=ReadFacts)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ReadFacts: {exc}")
            return
        try:
            facts = await self.read(ask.tenant, ask.kind, ask.id)
        except PermanentError as exc:
            await request.respond_error("404", str(exc)[:500])
            return
        except Exception as exc:
            log.warning("reading %s %s failed: %r", ask.kind, ask.id, exc)
            await request.respond_error("503", f"cannot read the {ask.kind} now")
            return
        await request.respond(self._encoder.encode(FactsRead(found=facts is not None, facts=facts)))
