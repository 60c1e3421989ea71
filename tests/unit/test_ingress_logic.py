"""`services.ingress.logic`: bounding, decoding and authenticating a host's `RunRequest`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from schemas.host import ErrorInfo, RunRequest, RunResult
from services.ingress.logic import Rejection, TenantKey, Verified, run_id_for, verify_request

AUDIENCE = "writ"
MAX_BYTES = 64 * 1024


def _keypair() -> tuple[bytes, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


ACME_PRIVATE, ACME_PUBLIC = _keypair()
GLOBEX_PRIVATE, GLOBEX_PUBLIC = _keypair()
STRANGER_PRIVATE, _ = _keypair()
KEYS = {
    "acme": TenantKey(issuer="https://idp.acme.example", public_key=ACME_PUBLIC),
    "globex": TenantKey(issuer="https://idp.globex.example", public_key=GLOBEX_PUBLIC),
}


def claims_for(tenant: str = "acme", **overrides: Any) -> dict[str, Any]:
    """The claims a well-behaved host of `tenant` signs; `None` overrides drop a claim."""
    now = datetime.now(timezone.utc)
    claims: dict[str, Any] = {
        "iss": KEYS[tenant].issuer, "aud": AUDIENCE, "sub": "alice@acme", "tenant": tenant,
        "iat": now, "exp": now + timedelta(minutes=5), "jti": uuid.uuid4().hex,
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def token(claims: dict[str, Any] | None = None, key: bytes = ACME_PRIVATE) -> str:
    return jwt.encode(claims_for() if claims is None else claims, key, algorithm="EdDSA")


def body(tok: str | None = None, **fields: Any) -> bytes:
    document = {"request_id": "req-1", "token": token() if tok is None else tok,
                "agent": "assistant", "input": "Summarise ACME-42's last ticket."}
    document.update(fields)
    return json.dumps(document).encode()


def verify(raw: bytes, *, tenant: str = "acme", header: str | None = "req-1",
           max_bytes: int = MAX_BYTES) -> Verified | Rejection:
    return verify_request(raw, subject_tenant=tenant, header_request_id=header, keys=KEYS,
                          audience=AUDIENCE, max_bytes=max_bytes)


def rejected(outcome: Verified | Rejection, code: str) -> Rejection:
    """Assert a rejection with `code` that the host contract can carry."""
    assert isinstance(outcome, Rejection), outcome
    assert outcome.code == code, outcome
    # The service copies the rejection into a RunResult: it must decode on the host's side.
    result = RunResult(request_id=outcome.request_id, status="rejected",
                       error=ErrorInfo(code=outcome.code, message=outcome.message))
    assert msgspec.json.decode(msgspec.json.encode(result), type=RunResult) == result
    return outcome


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned_jwt(header: dict[str, Any], claims: dict[str, Any], signature: bytes) -> str:
    encoded = {k: int(v.timestamp()) if isinstance(v, datetime) else v for k, v in claims.items()}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(encoded).encode())}"
    return f"{signing_input}.{_b64(signature)}"


# -- accepted ------------------------------------------------------------------------------


def test_valid_token_is_verified_with_tenant_and_principal_from_the_token() -> None:
    outcome = verify(body(token(claims_for(sub="bob.smith@acme"))))
    assert isinstance(outcome, Verified)
    assert outcome.tenant == "acme"
    assert outcome.principal == "bob.smith@acme"
    assert outcome.run_id == run_id_for("acme", "req-1")
    assert outcome.request == RunRequest(request_id="req-1", token=outcome.request.token,
                                         agent="assistant",
                                         input="Summarise ACME-42's last ticket.")


def test_each_tenant_is_verified_with_its_own_key() -> None:
    outcome = verify(body(token(claims_for("globex", sub="carol"), GLOBEX_PRIVATE)),
                     tenant="globex")
    assert isinstance(outcome, Verified)
    assert (outcome.tenant, outcome.principal) == ("globex", "carol")
    assert outcome.run_id == run_id_for("globex", "req-1")


def test_missing_header_is_not_a_mismatch() -> None:
    assert isinstance(verify(body(), header=None), Verified)


def test_body_of_exactly_the_limit_is_accepted() -> None:
    raw = body()
    assert isinstance(verify(raw, max_bytes=len(raw)), Verified)


def test_expiry_within_leeway_is_accepted() -> None:
    now = datetime.now(timezone.utc)
    outcome = verify(body(token(claims_for(exp=now - timedelta(seconds=1)))))
    assert isinstance(outcome, Verified)


@pytest.mark.parametrize("field", ["principal", "tenant"])
def test_principal_or_tenant_in_the_body_is_impossible(field: str) -> None:
    outcome = rejected(verify(body(**{field: "mallory"})), "INVALID_REQUEST")
    assert field in outcome.message


# -- signatures and tokens -----------------------------------------------------------------


def test_token_signed_by_another_key_is_a_bad_signature() -> None:
    rejected(verify(body(token(key=STRANGER_PRIVATE))), "BAD_SIGNATURE")


def test_another_tenants_token_on_this_tenants_subject_is_a_bad_signature() -> None:
    # globex's host, publishing on acme's subject with a token globex's key signed.
    for claims in (claims_for("globex"), claims_for("acme")):
        rejected(verify(body(token(claims, GLOBEX_PRIVATE)), tenant="acme"), "BAD_SIGNATURE")


def test_expired_token() -> None:
    now = datetime.now(timezone.utc)
    claims = claims_for(iat=now - timedelta(hours=1), exp=now - timedelta(minutes=1))
    rejected(verify(body(token(claims))), "TOKEN_EXPIRED")


def test_tenant_claim_other_than_the_subject_tenant() -> None:
    # Signed by acme's key, so the signature holds; the claim names globex.
    claims = claims_for("acme", tenant="globex")
    rejected(verify(body(token(claims))), "WRONG_TENANT")


@pytest.mark.parametrize("overrides", [
    pytest.param({"aud": "someone-else"}, id="wrong-audience"),
    pytest.param({"iss": "https://idp.globex.example"}, id="wrong-issuer"),
    pytest.param({"jti": None}, id="missing-jti"),
    pytest.param({"exp": None}, id="missing-exp"),
    pytest.param({"aud": None}, id="missing-aud"),
    pytest.param({"sub": None}, id="missing-sub"),
    pytest.param({"tenant": None}, id="missing-tenant"),
    pytest.param({"sub": "alice smith"}, id="sub-not-a-principal-id"),
    pytest.param({"sub": "alice\n"}, id="sub-with-trailing-newline"),
    pytest.param({"sub": "x" * 129}, id="sub-too-long"),
])
def test_invalid_claims(overrides: dict[str, Any]) -> None:
    rejected(verify(body(token(claims_for(**overrides)))), "INVALID_TOKEN")


def test_garbage_token() -> None:
    rejected(verify(body("not-a-jwt")), "INVALID_TOKEN")


def test_alg_none_token_is_rejected() -> None:
    tok = _unsigned_jwt({"alg": "none", "typ": "JWT"}, claims_for(), b"")
    outcome = verify(body(tok))
    assert isinstance(outcome, Rejection)
    assert outcome.code in {"INVALID_TOKEN", "BAD_SIGNATURE"}


def test_hs256_token_keyed_with_the_public_key_is_rejected() -> None:
    # The classic algorithm-confusion attack: HMAC keyed with the tenant's public PEM.
    header = {"alg": "HS256", "typ": "JWT"}
    unsigned = _unsigned_jwt(header, claims_for(), b"").rsplit(".", 1)[0]
    mac = hmac.new(ACME_PUBLIC.encode(), unsigned.encode(), hashlib.sha256).digest()
    outcome = verify(body(f"{unsigned}.{_b64(mac)}"))
    assert isinstance(outcome, Rejection)
    assert outcome.code in {"INVALID_TOKEN", "BAD_SIGNATURE"}


def test_unknown_tenant() -> None:
    outcome = rejected(verify(body(), tenant="initech"), "UNKNOWN_TENANT")
    assert outcome.request_id == "req-1"


@pytest.mark.xfail(strict=True, reason=(
    "UNKNOWN_TENANT's message embeds the subject's tenant token unbounded, so a long subject "
    "yields a RunResult whose error.message exceeds ShortText (512) and cannot be decoded"))
def test_unknown_tenant_message_fits_the_host_contract_whatever_the_subject() -> None:
    rejected(verify(body(), tenant="t" * 600), "UNKNOWN_TENANT")


# -- request bounds and shape --------------------------------------------------------------


def test_unknown_field_is_named() -> None:
    outcome = rejected(verify(body(priority=5)), "INVALID_REQUEST")
    assert "priority" in outcome.message
    assert outcome.request_id == "req-1"  # taken from the header: the body did not decode


def test_oversized_body() -> None:
    raw = body()
    outcome = rejected(verify(raw, max_bytes=len(raw) - 1), "TOO_LARGE")
    assert str(len(raw)) in outcome.message
    assert outcome.request_id == "req-1"


def test_oversized_body_is_refused_before_decoding() -> None:
    outcome = rejected(verify(b"x" * 100, max_bytes=99, header="h" * 300), "TOO_LARGE")
    assert outcome.request_id == "h" * 128


@pytest.mark.parametrize(("length", "accepted"), [(8192, True), (8193, False), (0, False)])
def test_input_length_bounds(length: int, accepted: bool) -> None:
    outcome = verify(body(input="a" * length))
    if accepted:
        assert isinstance(outcome, Verified)
    else:
        assert "input" in rejected(outcome, "INVALID_REQUEST").message


@pytest.mark.parametrize("raw", [b"", b"not json", b"[]", b'{"request_id": "req-1"}',
                                 b'{"request_id": 5, "token": "t", "agent": "a", "input": "i"}'])
def test_undecodable_or_incomplete_body(raw: bytes) -> None:
    rejected(verify(raw), "INVALID_REQUEST")


def test_bad_request_id_pattern() -> None:
    rejected(verify(body(request_id="req 1"), header=None), "INVALID_REQUEST")


def test_msg_id_header_must_equal_request_id() -> None:
    outcome = rejected(verify(body(), header="req-2"), "INVALID_REQUEST")
    assert outcome.request_id == "req-1"
    assert "Nats-Msg-Id" in outcome.message


def test_body_shape_is_checked_before_the_token() -> None:
    # A forged token in a malformed body is reported as a malformed body, not parsed.
    rejected(verify(body(token(key=STRANGER_PRIVATE), extra=1)), "INVALID_REQUEST")


# -- run ids -------------------------------------------------------------------------------


def test_run_id_is_deterministic_and_tenant_scoped() -> None:
    assert run_id_for("acme", "req-1") == run_id_for("acme", "req-1")
    assert run_id_for("acme", "req-1") != run_id_for("globex", "req-1")
    assert run_id_for("acme", "req-1") != run_id_for("acme", "req-2")
    assert uuid.UUID(run_id_for("acme", "req-1")).version == 5


def test_resent_request_names_the_same_run() -> None:
    first, second = verify(body()), verify(body())  # fresh tokens, fresh jti
    assert isinstance(first, Verified) and isinstance(second, Verified)
    assert first.request.token != second.request.token
    assert first.run_id == second.run_id
