"""Who first used a request id (and a command's operation key) in a tenant, on either door.

A run's id and a command's pseudo-run are derived from the tenant and the request id or the
operation key, so whoever re-sends an id names the same work. Ingress therefore remembers, in
the owners' bucket (`WRIT_OWNERS`), the principal who first used each id: the same principal
again goes on (a retry changes nothing twice downstream); another principal of the tenant is
refused `CONFLICT`, an answer that says nothing of the first request, and nothing is handed on
for it. An owner is kept as long as the run or command its id names, which is to say with no
expiry: a day later, a year later, the id is still its first principal's (the HTTP door's
Idempotency-Key answers expire after 24 hours; who owns the id does not).
"""

from __future__ import annotations

import hashlib
from typing import Final

import anyio
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from libs.errors import RetryableError
from libs.provision import IDEMPOTENCY_BUCKET, OWNERS_BUCKET, bind_bucket
from schemas.host import RunRequest, SubmitCommand
from services.ingress.logic import Rejection, Verified

__all__ = ["CONFLICT_MESSAGE", "Owners"]

CONFLICT_MESSAGE: Final = (
    "this request id was used by another principal; the first request is untouched "
    "(an id answers again only the principal who first used it)"
)
_MAX_PRINCIPAL: Final = 512


class Owners:
    """The first principal of each request id and operation key, per tenant."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        bucket: str = OWNERS_BUCKET.bucket,
        legacy: str = IDEMPOTENCY_BUCKET.bucket,
    ) -> None:
        self._js, self._bucket, self._legacy = js, bucket, legacy
        self._kv: KeyValue | None = None
        self._old: KeyValue | None = None

    async def _open(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await bind_bucket(self._js, self._bucket)
                self._old = await bind_bucket(self._js, self._legacy)
            except Exception as exc:  # not provisioned, or the bus busy: fail closed
                self._kv = None
                raise RetryableError(f"the request-id owners cannot be read: {exc!r}") from exc
        return self._kv

    @staticmethod
    def _key(tenant: str, space: str, name: str) -> str:
        return f"{tenant}.{space}.{hashlib.sha256(name.encode()).hexdigest()[:40]}"

    async def _first(self, key: str, principal: str) -> bool:
        """Whether `principal` is the first (or only) one to use `key`."""
        kv = await self._open()
        mine = principal.encode()[:_MAX_PRINCIPAL]
        # The claim and the earlier versions' record (`_kept_before`) are asked at once: no
        # version writes owners in the old bucket any more, so reading it before the claim
        # answers as reading it after, and a first use waits for one round trip, not two.
        claimed: list[Exception] = []
        kept: list[KeyValue.Entry | Exception | None] = []

        async def claim() -> None:
            try:
                await kv.create(key, mine)
            except Exception as exc:
                claimed.append(exc)

        async def look() -> None:
            kept.append(await self._kept(key))

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim)
            tg.start_soon(look)
        if not claimed:
            return await self._kept_before(kv, key, mine, kept[0])
        if not isinstance(claimed[0], KeyWrongLastSequenceError):
            exc = claimed[0]
            raise RetryableError(f"the request-id owners cannot be written: {exc!r}") from exc
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            return await self._first(key, principal)  # purged in between: a first use again
        except Exception as exc:
            raise RetryableError(f"the request-id owners cannot be read: {exc!r}") from exc
        return (entry.value or b"") == mine

    async def _kept(self, key: str) -> KeyValue.Entry | Exception | None:
        """What earlier versions recorded for `key` in the old bucket (None: nothing), or why
        it cannot be read."""
        assert self._old is not None
        try:
            return await self._old.get(key)
        except KeyNotFoundError:
            return None
        except Exception as exc:
            return exc

    async def _kept_before(
        self, kv: KeyValue, key: str, mine: bytes, kept: KeyValue.Entry | Exception | None
    ) -> bool:
        """A first use here, unless earlier versions, which kept owners in the Idempotency-Key
        bucket for 24 hours, recorded another principal (`kept`): then that one is the owner,
        kept here from now on, and `mine` is not."""
        if kept is None:
            return True
        if isinstance(kept, Exception):  # undo the claim: the same request asks again
            await kv.delete(key)
            raise RetryableError(f"the request-id owners cannot be read: {kept!r}") from kept
        if not kept.value or kept.value == mine:
            return True
        await kv.put(key, kept.value)
        return False

    async def check(self, outcome: Verified) -> Rejection | None:
        """`CONFLICT` if another principal used this run request's or command's id first.

        Raises:
            RetryableError: the bucket did not answer; nothing was handed on.
        """
        request = outcome.request
        if not isinstance(request, RunRequest | SubmitCommand):
            return None
        names = [("id", request.request_id)]
        if isinstance(request, SubmitCommand):
            names.append(("op", request.operation_key))
        for space, name in names:
            if not await self._first(self._key(outcome.tenant, space, name), outcome.principal):
                return Rejection(
                    code="CONFLICT", message=CONFLICT_MESSAGE, request_id=request.request_id
                )
        return None
