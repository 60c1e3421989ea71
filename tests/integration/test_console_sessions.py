"""The console's sign-in links and sessions, in a real JetStream key-value bucket, with tokens
checked by the same verification as both doors (`verify_token`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client

from libs.provision import CONSOLE_BUCKET, ensure_bucket
from services.ingress.console._session import COOKIE, ConsoleRefused, Sessions, _digest, _Session
from services.ingress.http._api import Door
from services.ingress.logic import (
    SIGN_IN_WINDOW_S,
    Rejection,
    TenantKey,
    console_audience,
    verify_token,
)
from writ.stack import mint_token

pytestmark = pytest.mark.anyio

_KEY = Ed25519PrivateKey.generate()
_PRIVATE = _KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
_PUBLIC = (
    _KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)
_ISSUER = "https://idp.acme.example"


class _Door:
    """The ingress door's token check, over one tenant's real key."""

    def check_token(
        self, token: str, *, tenant: str, request_id: str = "", signed_in: bool = False
    ) -> tuple[str, list[str]] | Rejection:
        return verify_token(
            token,
            tenant=tenant,
            audience=console_audience("writ") if signed_in else "writ",
            request_id=request_id,
            keys={"acme": TenantKey(issuer=_ISSUER, public_key=_PUBLIC)},
        )


class _Request:
    """What the console reads of a request: its headers and cookies."""

    def __init__(self, *, cookie: str = "", bearer: str = "") -> None:
        self.cookies = {COOKIE: cookie} if cookie else {}
        self.headers = {"authorization": f"Bearer {bearer}"} if bearer else {}


def _token(principal: str = "ops@acme.example", **claims: Any) -> str:
    """An API token, as a fronting proxy sets it."""
    return mint_token(
        _PRIVATE, issuer=_ISSUER, tenant="acme", principal=principal, ttl_s=600, **claims
    )


def _link(principal: str = "ops@acme.example", **claims: Any) -> str:
    """A sign-in link's token: the console's audience."""
    return _token(principal, audience=console_audience("writ"), **claims)


@pytest.fixture
async def sessions(nc: Client, unique: str) -> AsyncIterator[Sessions]:
    """Sessions in a bucket of the test's own (provisioned like the console's), deleted
    after it."""
    config = dataclasses.replace(CONSOLE_BUCKET, bucket=f"CONSOLE_{unique}")
    await ensure_bucket(nc.jetstream(), config, replicas=1)
    door = cast("Door", _Door())  # the door's token check alone, over a real key
    yield await Sessions.open(nc.jetstream(), door, bucket=f"CONSOLE_{unique}")
    await nc.jetstream().delete_key_value(f"CONSOLE_{unique}")


async def test_a_sign_in_link_opens_one_session_and_is_refused_the_second_time(
    sessions: Sessions,
) -> None:
    token = _link(roles=["approver"])
    session_id, viewer = await sessions.sign_in(token)
    assert (viewer.tenant, viewer.principal, viewer.roles) == (
        "acme",
        "ops@acme.example",
        frozenset({"approver"}),
    )
    assert abs(viewer.expires - (time.time() + 600)) < 10
    seen = await sessions.viewer(_Request(cookie=session_id))  # type: ignore[arg-type]
    assert seen == viewer
    with pytest.raises(ConsoleRefused, match="used already"):
        await sessions.sign_in(token)
    await sessions.sign_out(_Request(cookie=session_id))  # type: ignore[arg-type]
    with pytest.raises(ConsoleRefused, match="session ended"):
        await sessions.viewer(_Request(cookie=session_id))  # type: ignore[arg-type]


async def test_a_session_ends_with_its_token(sessions: Sessions, nc: Client, unique: str) -> None:
    session_id, _ = await sessions.sign_in(_link(roles=["approver"]))
    kv = await nc.jetstream().key_value(f"CONSOLE_{unique}")
    entry = await kv.get(f"session.{_digest(session_id)}")
    held = msgspec.json.decode(entry.value or b"", type=_Session)
    # The token's hour passes.
    await kv.put(
        f"session.{_digest(session_id)}",
        msgspec.json.encode(_Session(token=held.token, expires=datetime.now(UTC).timestamp() - 1)),
    )
    with pytest.raises(ConsoleRefused, match="ended with its token"):
        await sessions.viewer(_Request(cookie=session_id))  # type: ignore[arg-type]


async def test_only_approvers_and_auditors_of_a_known_issuer_get_in(sessions: Sessions) -> None:
    with pytest.raises(ConsoleRefused, match="approvers and auditors") as no_role:
        await sessions.sign_in(_link())
    assert no_role.value.status == 403
    other = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    forged = mint_token(
        other,
        issuer=_ISSUER,
        tenant="acme",
        principal="ops@acme.example",
        roles=["approver"],
        audience=console_audience("writ"),
    )
    with pytest.raises(ConsoleRefused) as bad:
        await sessions.sign_in(forged)
    assert bad.value.status == 401 and "BAD_SIGNATURE" in bad.value.reason
    with pytest.raises(ConsoleRefused, match="session ended"):
        await sessions.viewer(_Request(cookie="no-such-session"))  # type: ignore[arg-type]
    with pytest.raises(ConsoleRefused, match="not signed in"):
        await sessions.viewer(_Request())  # type: ignore[arg-type]
    # A proxy's bearer token needs no session; a forged one is refused like a link.
    auditor = await sessions.viewer(_Request(bearer=_token(roles=["auditor"])))  # type: ignore[arg-type]
    assert auditor.roles == frozenset({"auditor"})
    with pytest.raises(ConsoleRefused):
        await sessions.viewer(_Request(bearer=forged))  # type: ignore[arg-type]


async def test_a_sign_in_token_signs_in_once_and_is_no_bearer(sessions: Sessions) -> None:
    link = _link(roles=["approver", "auditor"])
    # As a proxy's bearer it is refused (its audience is not the API's), before and after use.
    with pytest.raises(ConsoleRefused, match="INVALID_TOKEN") as before:
        await sessions.viewer(_Request(bearer=link))  # type: ignore[arg-type]
    assert before.value.status == 401
    session_id, viewer = await sessions.sign_in(link)
    assert viewer.signed_in
    assert (await sessions.viewer(_Request(cookie=session_id))).signed_in  # type: ignore[arg-type]
    with pytest.raises(ConsoleRefused, match="INVALID_TOKEN"):
        await sessions.viewer(_Request(bearer=link))  # type: ignore[arg-type]
    # An API token is no sign-in link, and opens no session.
    with pytest.raises(ConsoleRefused, match="INVALID_TOKEN"):
        await sessions.sign_in(_token(roles=["approver"]))


async def test_a_link_expires_minutes_after_it_was_made(sessions: Sessions) -> None:
    made = datetime.now(UTC) - timedelta(seconds=SIGN_IN_WINDOW_S + 60)
    with pytest.raises(ConsoleRefused, match="expired") as late:
        await sessions.sign_in(_link(roles=["approver"], now=made))
    assert late.value.status == 401
    with pytest.raises(ConsoleRefused, match="TOKEN_EXPIRED"):
        await sessions.sign_in(
            _link(roles=["approver"], now=datetime.now(UTC) - timedelta(seconds=700))
        )
    # A link used in time, burnt, is still refused later for being used.
    fresh = _link(roles=["approver"], now=datetime.now(UTC) - timedelta(seconds=60))
    await sessions.sign_in(fresh)
    with pytest.raises(ConsoleRefused, match="used already"):
        await sessions.sign_in(fresh)
