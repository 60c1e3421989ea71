"""`Idempotency-Key` over HTTP, kept in a JetStream key-value bucket (ingress has no database).

An entry per (tenant, key) holds the request's fingerprint (the principal who sent it, the
route and the canonical JSON of its body) and, once there is one, the first answer. The same
principal, key and body again returns that answer; another body, or another principal of the
tenant under the same key, is `CONFLICT`, which says nothing of the first request. An entry
without an answer (the first try failed, or is in flight) lets the retry hand the request on
again: everything downstream is keyed by the request id, so that changes nothing twice.
"""

from __future__ import annotations

import hashlib
from typing import Final

import msgspec
import rfc8785
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from libs.bus import until_answered
from libs.provision import IDEMPOTENCY_BUCKET, bind_bucket
from services.ingress.http._problems import ApiError

__all__ = ["BUCKET", "KeptAnswer", "Idempotency", "fingerprint"]

BUCKET: Final = IDEMPOTENCY_BUCKET.bucket
# How long a request waits out the bucket's leader election before it is answered
# `503 UNAVAILABLE` (a retry under the same key is safe: nothing was handed on).
PATIENCE_S: Final = 5.0


class KeptAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What is kept under one key."""

    fingerprint: str
    status: int = 0
    body: bytes = b""


def fingerprint(principal: str, route: str, body: msgspec.Struct) -> str:
    """Who asked, the route and the canonical JSON (RFC 8785) of a decoded body: key order
    and spacing do not make two bodies different; another principal does."""
    canonical = rfc8785.dumps(msgspec.to_builtins(body))
    return hashlib.sha256(
        principal.encode() + b"\x00" + route.encode() + b"\x00" + canonical
    ).hexdigest()


class Idempotency:
    """The first answer under each key, for 24 hours."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._decoder = msgspec.json.Decoder(KeptAnswer)
        self._encoder = msgspec.json.Encoder()

    @classmethod
    async def open(cls, js: JetStreamContext, *, bucket: str = BUCKET) -> Idempotency:
        """The bucket, as provisioned (libs/provision.py): ingress never creates it."""
        return cls(await bind_bucket(js, bucket))

    @staticmethod
    def _key(tenant: str, key: str) -> str:
        return f"{tenant}.{hashlib.sha256(key.encode()).hexdigest()[:40]}"

    async def claim(self, tenant: str, key: str, print_: str) -> KeptAnswer | None:
        """The first answer under the key (None if there is none yet: go on).

        Raises:
            ApiError: `CONFLICT`, the key was used with another request.
            BusUnavailable: the bucket met an election and did not answer in time.
        """
        name = self._key(tenant, key)
        claim = self._encoder.encode(KeptAnswer(fingerprint=print_))
        try:
            # A create that timed out may have been stored: tried again, it finds the key,
            # whose fingerprint is this request's own.
            await until_answered(
                lambda: self._kv.create(name, claim), what="claiming a key", patience_s=PATIENCE_S
            )
            return None
        except KeyWrongLastSequenceError:
            pass
        try:
            entry = await until_answered(
                lambda: self._kv.get(name), what="reading a key", patience_s=PATIENCE_S
            )
        except KeyNotFoundError:
            return None  # expired in between: a new first use
        held = self._decoder.decode(entry.value or b"")
        if held.fingerprint != print_:
            raise ApiError(
                "CONFLICT",
                "this Idempotency-Key was used with another request; the first one is "
                "untouched (a key answers again only the principal who first used it)",
            )
        return held if held.status else None

    async def remember(self, tenant: str, key: str, print_: str, status: int, body: bytes) -> None:
        """Keep the first answer under the key.

        Raises:
            BusUnavailable: the bucket met an election and did not answer in time.
        """
        name = self._key(tenant, key)
        kept = self._encoder.encode(KeptAnswer(fingerprint=print_, status=status, body=body))
        await until_answered(
            lambda: self._kv.put(name, kept), what="keeping an answer", patience_s=PATIENCE_S
        )
