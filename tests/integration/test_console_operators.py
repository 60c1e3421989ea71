"""Operators at the console: an identity the deployment's operators' key gives, which no
host's token can claim (sessions in a real JetStream key-value bucket, tokens checked by the
doors' own verification)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import cast

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client

from libs.provision import CONSOLE_BUCKET, ensure_bucket
from services.ingress.console._operators import (
    OperatorKey,
    OperatorRefused,
    mint_operator_token,
)
from services.ingress.console._session import ConsoleRefused, Sessions
from services.ingress.http._api import Door
from tests.integration.test_console_sessions import _PRIVATE, _Door, _link, _Request, _token

pytestmark = pytest.mark.anyio


def _pem(key: Ed25519PrivateKey) -> tuple[bytes, bytes]:
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


_OPERATORS, _OPERATORS_PUBLIC = _pem(Ed25519PrivateKey.generate())


async def _sessions(nc: Client, unique: str, operators: OperatorKey | None) -> Sessions:
    config = dataclasses.replace(CONSOLE_BUCKET, bucket=f"CONSOLE_{unique}")
    await ensure_bucket(nc.jetstream(), config, replicas=1)
    door = cast("Door", _Door())
    return await Sessions.open(
        nc.jetstream(), door, bucket=f"CONSOLE_{unique}", operators=operators
    )


@pytest.fixture
async def sessions(nc: Client, unique: str) -> AsyncIterator[Sessions]:
    yield await _sessions(nc, unique, OperatorKey(_OPERATORS_PUBLIC))
    await nc.jetstream().delete_key_value(f"CONSOLE_{unique}")


async def test_an_operators_link_opens_one_operator_session(sessions: Sessions) -> None:
    token = mint_operator_token(_OPERATORS, tenant="acme", principal="ops@acme.example")
    session_id, viewer = await sessions.sign_in(token)
    assert (viewer.tenant, viewer.principal, viewer.roles) == (
        "acme",
        "ops@acme.example",
        frozenset({"operator"}),
    )
    assert await sessions.viewer(_Request(cookie=session_id)) == viewer  # type: ignore[arg-type]
    with pytest.raises(ConsoleRefused, match="used already"):
        await sessions.sign_in(token)


async def test_a_hosts_token_claiming_the_operator_role_is_refused(sessions: Sessions) -> None:
    # A host signs what it likes with its own key: a sign-in link and a proxy's token.
    with pytest.raises(ConsoleRefused, match="Writ's to give") as link:
        await sessions.sign_in(_link(roles=["approver", "operator"]))
    assert link.value.status == 403
    with pytest.raises(ConsoleRefused, match="Writ's to give"):
        await sessions.viewer(_Request(bearer=_token(roles=["operator"])))  # type: ignore[arg-type]
    # Nor does it help to say it is the operators' issuer: the operators' key checks it.
    forged = mint_operator_token(_PRIVATE, tenant="acme", principal="ops@acme.example")
    with pytest.raises(ConsoleRefused, match="not an operator's token of this deployment"):
        await sessions.sign_in(forged)


async def test_an_operators_token_opens_nothing_but_its_sign_in(sessions: Sessions) -> None:
    token = mint_operator_token(_OPERATORS, tenant="acme", principal="ops@acme.example")
    with pytest.raises(ConsoleRefused, match="signs in with a link"):
        await sessions.viewer(_Request(bearer=token))  # type: ignore[arg-type]


async def test_without_the_operators_key_nobody_is_an_operator(nc: Client, unique: str) -> None:
    sessions = await _sessions(nc, unique, None)
    try:
        token = mint_operator_token(_OPERATORS, tenant="acme", principal="ops@acme.example")
        with pytest.raises(ConsoleRefused, match="no operators' key"):
            await sessions.sign_in(token)
    finally:
        await nc.jetstream().delete_key_value(f"CONSOLE_{unique}")


def test_an_operators_token_is_bounded() -> None:
    with pytest.raises(OperatorRefused, match="at most"):
        mint_operator_token(_OPERATORS, tenant="acme", principal="ops", ttl_s=9 * 3600)
    with pytest.raises(OperatorRefused):
        mint_operator_token(_OPERATORS, tenant="Acme Corp", principal="ops")
