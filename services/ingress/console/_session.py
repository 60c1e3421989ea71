"""Who is looking at the console: the token, from a fronting proxy or a one-time sign-in.

Production puts an identity-aware proxy in front of ingress; it authenticates the person and
sets `Authorization: Bearer <token>` (the tenant issuer's EdDSA token, with the `approver` or
`auditor` role) on every request it forwards. Locally, `writ console` mints a sign-in token
into a one-time link: a token for the console's own audience (`console_audience`), which the
API and every bearer path refuse. Its first use, within `SIGN_IN_WINDOW_S` of its issue, opens
a session (an opaque id in an HttpOnly, SameSite=Strict cookie that lives as long as the
token) and burns its `jti`; a second use is refused. Sessions and burnt ids are kept in a
JetStream key-value bucket, so every ingress replica knows them. The console calls the API
with a session's token and a proof only its own process can make (`console_proof`).

Every form carries a CSRF token derived from the caller's token (HMAC): a page of another site
can neither read it nor compute it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import TYPE_CHECKING, Any, Final

import jwt
import msgspec
from litestar import Request
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from libs.provision import CONSOLE_BUCKET, bind_bucket
from services.ingress.console._i18n import CATALOG, t
from services.ingress.console._operators import (
    OPERATOR_ROLE,
    OperatorKey,
    OperatorRefused,
    is_operator_token,
)
from services.ingress.logic import (
    APPROVER_ROLE,
    AUDITOR_ROLE,
    LEEWAY_S,
    SIGN_IN_WINDOW_S,
    Rejection,
    token_tenant,
)

if TYPE_CHECKING:  # the HTTP door imports the console: only its type is needed here
    from services.ingress.http._api import Door

__all__ = ["BUCKET", "COOKIE", "ConsoleRefused", "Sessions", "Viewer"]

BUCKET: Final = CONSOLE_BUCKET.bucket
COOKIE: Final = "writ_console"
CONSOLE_ROLES: Final = frozenset({APPROVER_ROLE, AUDITOR_ROLE})
_CSRF_LABEL: Final = b"writ-console-csrf-v1"


class Viewer(msgspec.Struct, frozen=True, kw_only=True):
    """A verified person at the console."""

    tenant: str
    principal: str
    roles: frozenset[str]
    token: str
    expires: float
    # A session opened with a sign-in link (its token is for the console's audience), not a
    # proxy's API token.
    signed_in: bool = False

    @property
    def csrf(self) -> str:
        """The CSRF token of this viewer's forms."""
        return hmac.new(self.token.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()

    def csrf_ok(self, sent: str) -> bool:
        """Whether a form's CSRF token is this viewer's."""
        return hmac.compare_digest(self.csrf.encode(), sent.encode())


class ConsoleRefused(Exception):
    """Nobody may see the console with this request; `reason` is safe to show, in the locale of
    the page that shows it (the catalog's message `key`, its `fields` filled)."""

    def __init__(self, key: str, *, status: int = 401, **fields: object) -> None:
        super().__init__(CATALOG[key].en.format(**fields))  # a log's words: English
        self.key, self.fields, self.status = key, fields, status

    @property
    def reason(self) -> str:
        return t(self.key, **self.fields)


class _Session(msgspec.Struct, frozen=True):
    token: str
    expires: float


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class Sessions:
    """Sign-in links used, and sessions open."""

    def __init__(self, kv: KeyValue, door: Door, operators: OperatorKey | None = None) -> None:
        self._kv, self._door, self._operators = kv, door, operators
        self._decoder = msgspec.json.Decoder(_Session)

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        door: Door,
        *,
        bucket: str = BUCKET,
        operators: OperatorKey | None = None,
    ) -> Sessions:
        """The bucket, as provisioned (libs/provision.py): ingress never creates it.
        `operators` is the operators' public key (none: nobody signs in as an operator)."""
        return cls(await bind_bucket(js, bucket), door, operators)

    def _operator(self, token: str, *, signed_in: bool) -> Viewer:
        """An operator, from a token of the operators' key (`_operators.py`)."""
        if not signed_in:
            raise ConsoleRefused("refused_operator_link")
        if self._operators is None:
            raise ConsoleRefused("refused_no_operator_key", status=403)
        try:
            tenant, principal, expires = self._operators.verify(token)
        except OperatorRefused as exc:
            raise ConsoleRefused("refused_operator_token", why=str(exc)[:300]) from None
        return Viewer(
            tenant=tenant,
            principal=principal,
            roles=frozenset({OPERATOR_ROLE}),
            token=token,
            expires=expires,
            signed_in=True,
        )

    def verify(self, token: str, *, signed_in: bool = False) -> Viewer:
        """The viewer a token names (signature, audience, expiry and lifetime checked as the
        API does), if it holds a console role: an API token (a proxy's), or with `signed_in`
        a sign-in token (a session's). The role `operator` comes from the operators' key
        alone: a host's token that claims it is refused."""
        if is_operator_token(token):
            return self._operator(token, signed_in=signed_in)
        tenant = token_tenant(token)
        checked = self._door.check_token(token, tenant=tenant, signed_in=signed_in)
        if isinstance(checked, Rejection):
            raise ConsoleRefused("refused_token", code=checked.code, why=checked.message[:280])
        principal, roles = checked
        if OPERATOR_ROLE in roles:
            raise ConsoleRefused("refused_operator_role", status=403)
        if not CONSOLE_ROLES & set(roles):
            raise ConsoleRefused("refused_no_role", status=403)
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        return Viewer(
            tenant=tenant,
            principal=principal,
            roles=frozenset(roles),
            token=token,
            expires=float(claims["exp"]),
            signed_in=signed_in,
        )

    async def sign_in(self, token: str) -> tuple[str, Viewer]:
        """Use a one-time sign-in link: a new session's id and its viewer.

        Raises:
            ConsoleRefused: the token does not check out, or the link was used already.
        """
        viewer = self.verify(token, signed_in=True)
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
        issued = claims.get("iat")
        if not isinstance(issued, (int, float)) or isinstance(issued, bool):
            raise ConsoleRefused("refused_no_iat")
        if time.time() - issued > SIGN_IN_WINDOW_S + LEEWAY_S:
            raise ConsoleRefused("refused_link_expired", minutes=f"{SIGN_IN_WINDOW_S / 60:.0f}")
        burnt = _digest(f"{viewer.tenant}:{claims['jti']}")
        try:
            await self._kv.create(f"used.{burnt}", b"1")
        except KeyWrongLastSequenceError:
            raise ConsoleRefused("refused_link_used") from None
        session_id = secrets.token_urlsafe(32)
        await self._kv.put(
            f"session.{_digest(session_id)}",
            msgspec.json.encode(_Session(token=token, expires=viewer.expires)),
        )
        return session_id, viewer

    async def viewer(self, request: Request[Any, Any, Any]) -> Viewer:
        """Who sent this request: the proxy's bearer token, else the session's.

        Raises:
            ConsoleRefused: neither, or what they name does not check out (any more).
        """
        header = request.headers.get("authorization", "")
        scheme, _, bearer = header.partition(" ")
        if scheme.lower() == "bearer" and bearer.strip():
            return self.verify(bearer.strip())
        session_id = request.cookies.get(COOKIE, "")
        if not session_id or len(session_id) > 128:
            raise ConsoleRefused("refused_not_signed_in")
        try:
            entry = await self._kv.get(f"session.{_digest(session_id)}")
        except KeyNotFoundError:
            raise ConsoleRefused("refused_session_ended") from None
        session = self._decoder.decode(entry.value or b"")
        if session.expires <= time.time():
            raise ConsoleRefused("refused_session_token")
        return self.verify(session.token, signed_in=True)

    async def sign_out(self, request: Request[Any, Any, Any]) -> None:
        """End the request's session (a proxy's identity is the proxy's to end)."""
        session_id = request.cookies.get(COOKIE, "")
        if session_id and len(session_id) <= 128:
            await self._kv.delete(f"session.{_digest(session_id)}")
