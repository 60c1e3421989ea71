"""What every route shares: the caller's token, the one verification both doors use, the
Idempotency-Key, and the bus's request/reply for reads other services answer."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import jwt
import msgspec
from litestar import Request, Response
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from libs.deadline import timed_request
from schemas.base import Id
from services.ingress.http._idempotency import Idempotency, fingerprint
from services.ingress.http._problems import ApiError
from services.ingress.http._results import Results
from services.ingress.logic import NO_TENANT, Rejection, Verified, console_proof

__all__ = ["PROOF_HEADER", "Api", "Caller", "Door"]

_ENCODER: Final = msgspec.json.Encoder()
# What each owning service's error status means to the caller.
_REPLY_CODES: Final = {"400": "INVALID_REQUEST", "404": "NOT_FOUND", "409": "CONFLICT"}
PROOF_HEADER: Final = "Writ-Console-Proof"


class Door(Protocol):
    """What the HTTP API needs of the ingress service: the NATS door's own steps."""

    def verify(
        self,
        kind: str,
        body: bytes,
        *,
        tenant: str,
        request_id: str | None,
        signed_in: bool = False,
    ) -> Verified | Rejection: ...

    def check_token(
        self, token: str, *, tenant: str, request_id: str = "", signed_in: bool = False
    ) -> tuple[str, list[str]] | Rejection: ...

    async def first_use(self, outcome: Verified) -> Verified | Rejection: ...

    async def hand_on(self, outcome: Verified) -> Any: ...


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """Whoever a request's token names."""

    tenant: str
    principal: str
    roles: frozenset[str]


def _tenant_of(token: str) -> str:
    """The tenant a bearer token claims (unverified: it picks the key that verifies it). A
    token that cannot be read, or names no tenant, is `INVALID_TOKEN` saying so, as the NATS
    door (whose subject names the tenant) says of it; a tenant Writ does not know is the
    token check's `UNKNOWN_TENANT`."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError as exc:
        raise ApiError("INVALID_TOKEN", f"invalid token: {exc}"[:500]) from exc
    tenant = claims.get("tenant") if isinstance(claims, dict) else None
    if not isinstance(tenant, str) or not tenant:
        raise ApiError("INVALID_TOKEN", NO_TENANT)
    return tenant


def _request_id(request: Request[Any, Any, Any]) -> str:
    """The Idempotency-Key, refused against its header (not the body it becomes)."""
    key = request.headers.get("idempotency-key")
    if not key:
        raise ApiError("INVALID_REQUEST", "header `Idempotency-Key`: required")
    try:
        return msgspec.convert(key, Id)
    except msgspec.ValidationError as exc:
        raise ApiError("INVALID_REQUEST", f"header `Idempotency-Key`: {exc}") from exc


def _bearer(request: Request[Any, Any, Any]) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError("UNAUTHENTICATED", "an `Authorization: Bearer <token>` header is required")
    return token.strip()


class Api:
    """The HTTP door's shared steps, over the ingress service's own."""

    def __init__(
        self,
        *,
        door: Door,
        nc: Client,
        idempotency: Idempotency,
        results: Results,
        read_timeout_s: float = 10.0,
        console_key: bytes = b"",
    ) -> None:
        self.door, self.nc, self.idempotency, self.results = door, nc, idempotency, results
        self._read_timeout = read_timeout_s
        # The key of this process's console (`console_proof`); none: no sign-in token at all.
        self._console_key = console_key

    def _credential(self, request: Request[Any, Any, Any]) -> tuple[str, bool]:
        """The bearer token, and whether it is a console session's sign-in token: only when
        this process's console vouches for it. Anyone else's sign-in token is checked as an
        API token, and refused for its audience."""
        token = _bearer(request)
        proof = request.headers.get(PROOF_HEADER, "")
        signed_in = bool(
            self._console_key
            and proof
            and hmac.compare_digest(console_proof(self._console_key, token), proof)
        )
        return token, signed_in

    def caller(self, request: Request[Any, Any, Any], *, role: str | None = None) -> Caller:
        """Authenticate a read: the token alone decides tenant, principal and roles."""
        token, signed_in = self._credential(request)
        tenant = _tenant_of(token)
        checked = self.door.check_token(token, tenant=tenant, signed_in=signed_in)
        if isinstance(checked, Rejection):
            raise ApiError(checked.code, checked.message)
        principal, roles = checked
        if role is not None and role not in roles:
            raise ApiError("FORBIDDEN", f"this needs the {role} role")
        return Caller(tenant=tenant, principal=principal, roles=frozenset(roles))

    async def post(
        self,
        request: Request[Any, Any, Any],
        *,
        kind: str,
        body: msgspec.Struct,
        build: Callable[[str, str], msgspec.Struct],
        answer: Callable[[Verified], Awaitable[tuple[int, msgspec.Struct]]],
    ) -> Response[Any]:
        """One write: rebuild the NATS message (`build(request_id, token)`), verify it as the
        NATS door does, then answer once per Idempotency-Key."""
        token, signed_in = self._credential(request)
        key = _request_id(request)
        tenant = _tenant_of(token)
        message = build(key, token)
        outcome = self.door.verify(
            kind,
            _ENCODER.encode(message),
            tenant=tenant,
            request_id=key,
            signed_in=signed_in,
        )
        if isinstance(outcome, Rejection):
            raise ApiError(outcome.code, outcome.message)
        owned = await self.door.first_use(outcome)
        if isinstance(owned, Rejection):
            raise ApiError(owned.code, owned.message)
        print_ = fingerprint(outcome.principal, f"{request.method} {request.url.path}", body)
        held = await self.idempotency.claim(outcome.tenant, key, print_)
        if held is not None:
            return Response(
                held.body,
                status_code=held.status,
                media_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        status, result = await answer(outcome)
        encoded = _ENCODER.encode(result)
        await self.idempotency.remember(outcome.tenant, key, print_, status, encoded)
        return Response(encoded, status_code=status, media_type="application/json")

    async def write(
        self,
        request: Request[Any, Any, Any],
        *,
        caller: Caller,
        body: msgspec.Struct,
        answer: Callable[[], Awaitable[tuple[int, msgspec.Struct]]],
    ) -> Response[Any]:
        """A write with no NATS host message of its own (an operator's): the caller is
        authenticated already; the Idempotency-Key gives the first answer again."""
        key = _request_id(request)
        print_ = fingerprint(caller.principal, f"{request.method} {request.url.path}", body)
        held = await self.idempotency.claim(caller.tenant, key, print_)
        if held is not None:
            return Response(
                held.body,
                status_code=held.status,
                media_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        status, result = await answer()
        encoded = _ENCODER.encode(result)
        await self.idempotency.remember(caller.tenant, key, print_, status, encoded)
        return Response(encoded, status_code=status, media_type="application/json")

    async def ask(
        self,
        subject: str,
        question: msgspec.Struct,
        reply: type[Any],
        *,
        timeout: float | None = None,
    ) -> Any:
        """Request/reply to the service that owns the answer.

        Raises:
            ApiError: `NOT_FOUND` / `INVALID_REQUEST` as the owner said, `UNAVAILABLE` when
                nobody answered.
        """
        try:
            msg = await timed_request(
                self.nc, subject, _ENCODER.encode(question), timeout=timeout or self._read_timeout
            )
        except (NatsTimeoutError, NoRespondersError) as exc:
            raise ApiError("UNAVAILABLE", f"no answer on {subject}") from exc
        code = (msg.headers or {}).get("Nats-Service-Error-Code")
        if code:
            raise ApiError(
                _REPLY_CODES.get(code, "UNAVAILABLE"),
                (msg.headers or {}).get("Nats-Service-Error", "")[:300],
            )
        return msgspec.json.decode(msg.data, type=reply)
