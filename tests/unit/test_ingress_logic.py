"""`services.ingress.logic`: bounding, decoding and authenticating a host's `RunRequest`, and
the approver's role and review ids of a `ReviewDecision`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from schemas.base import Id
from schemas.host import ErrorInfo, ReviewDecision, RunRequest, RunResult, SubmitCommand
from services.ingress.logic import (
    APPROVER_KINDS,
    COMMAND_DECODER,
    DECODERS,
    NO_REVIEW,
    Rejection,
    TenantKey,
    Verified,
    authorize,
    command_run_id,
    review_target,
    review_verdict,
    run_id_for,
    verify_request,
)

AUDIENCE = "writ"
MAX_BYTES = 64 * 1024


def _keypair() -> tuple[bytes, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public.decode()


ACME_PRIVATE, ACME_PUBLIC = _keypair()
GLOBEX_PRIVATE, GLOBEX_PUBLIC = _keypair()
STRANGER_PRIVATE, _ = _keypair()
KEYS = {
    "acme": TenantKey(issuer="https://idp.acme.example", public_key=ACME_PUBLIC),
    "globex": TenantKey(issuer="https://idp.globex.example", public_key=GLOBEX_PUBLIC),
}


def claims_for(host: str = "acme", /, **overrides: Any) -> dict[str, Any]:
    """The claims a well-behaved host of tenant `host` signs; `None` overrides drop a claim."""
    now = datetime.now(UTC)
    claims: dict[str, Any] = {
        "iss": KEYS[host].issuer,
        "aud": AUDIENCE,
        "sub": "alice@acme",
        "tenant": host,
        "iat": now,
        "exp": now + timedelta(minutes=5),
        "jti": uuid.uuid4().hex,
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def token(claims: dict[str, Any] | None = None, key: bytes = ACME_PRIVATE) -> str:
    return jwt.encode(claims_for() if claims is None else claims, key, algorithm="EdDSA")


def body(tok: str | None = None, **fields: Any) -> bytes:
    document = {
        "type": "RunRequest",
        "request_id": "req-1",
        "token": token() if tok is None else tok,
        "agent": "assistant",
        "input": "Summarise ACME-42's last ticket.",
    }
    document.update(fields)
    return json.dumps(document).encode()


def verify(
    raw: bytes,
    *,
    tenant: str = "acme",
    header: str | None = "req-1",
    max_bytes: int = MAX_BYTES,
    **options: Any,
) -> Verified | Rejection:
    return verify_request(
        raw,
        subject_tenant=tenant,
        header_request_id=header,
        keys=KEYS,
        audience=AUDIENCE,
        max_bytes=max_bytes,
        **options,
    )


def rejected(outcome: Verified | Rejection, code: str) -> Rejection:
    """Assert a rejection with `code` that the host contract can carry."""
    assert isinstance(outcome, Rejection), outcome
    assert outcome.code == code, outcome
    # The service copies the rejection into a RunResult: it must decode on the host's side.
    result = RunResult(
        request_id=outcome.request_id,
        status="rejected",
        error=ErrorInfo(code=outcome.code, message=outcome.message),
    )
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
    assert outcome.request == RunRequest(
        request_id="req-1",
        token=outcome.request.token,
        agent="assistant",
        input="Summarise ACME-42's last ticket.",
    )


def test_each_tenant_is_verified_with_its_own_key() -> None:
    outcome = verify(
        body(token(claims_for("globex", sub="carol"), GLOBEX_PRIVATE)), tenant="globex"
    )
    assert isinstance(outcome, Verified)
    assert (outcome.tenant, outcome.principal) == ("globex", "carol")
    assert outcome.run_id == run_id_for("globex", "req-1")


def test_missing_header_is_not_a_mismatch() -> None:
    assert isinstance(verify(body(), header=None), Verified)


def test_body_of_exactly_the_limit_is_accepted() -> None:
    raw = body()
    assert isinstance(verify(raw, max_bytes=len(raw)), Verified)


def test_expiry_within_leeway_is_accepted() -> None:
    now = datetime.now(UTC)
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
    now = datetime.now(UTC)
    claims = claims_for(iat=now - timedelta(hours=1), exp=now - timedelta(minutes=1))
    rejected(verify(body(token(claims))), "TOKEN_EXPIRED")


def test_tenant_claim_other_than_the_subject_tenant() -> None:
    # Signed by acme's key, so the signature holds; the claim names globex.
    claims = claims_for("acme", tenant="globex")
    rejected(verify(body(token(claims))), "WRONG_TENANT")


@pytest.mark.parametrize(
    "overrides",
    [
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
    ],
)
def test_invalid_claims(overrides: dict[str, Any]) -> None:
    rejected(verify(body(token(claims_for(**overrides)))), "INVALID_TOKEN")


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        pytest.param({"aud": "someone-else"}, "the token's `aud` must be 'writ'", id="audience"),
        pytest.param(
            {"iss": "https://idp.globex.example"},
            "the token's `iss` is not the issuer registered for tenant 'acme'",
            id="issuer",
        ),
        pytest.param({"jti": None}, "invalid token: it has no `jti` claim", id="no-jti"),
        pytest.param(
            {"tenant": None}, "invalid token: it names no tenant (claim `tenant`)", id="no-tenant"
        ),
        pytest.param(
            {"nbf": datetime.now(UTC) + timedelta(minutes=2)},
            "the token is not valid yet (its `nbf` or `iat` is in the future)",
            id="not-yet",
        ),
    ],
)
def test_a_token_refusal_says_what_is_wrong(overrides: dict[str, Any], said: str) -> None:
    # A host reading the refusal learns what to change, not only that something is off.
    assert rejected(verify(body(token(claims_for(**overrides)))), "INVALID_TOKEN").message == said


def test_garbage_token() -> None:
    rejected(verify(body("not-a-jwt")), "INVALID_TOKEN")


def test_alg_none_token_is_rejected() -> None:
    tok = _unsigned_jwt({"alg": "none", "typ": "JWT"}, claims_for(), b"")
    assert "alg" in rejected(verify(body(tok)), "INVALID_TOKEN").message


def test_hs256_token_keyed_with_the_public_key_is_rejected() -> None:
    # The classic algorithm-confusion attack: HMAC keyed with the tenant's public PEM.
    header = {"alg": "HS256", "typ": "JWT"}
    unsigned = _unsigned_jwt(header, claims_for(), b"").rsplit(".", 1)[0]
    mac = hmac.new(ACME_PUBLIC.encode(), unsigned.encode(), hashlib.sha256).digest()
    outcome = rejected(verify(body(f"{unsigned}.{_b64(mac)}")), "INVALID_TOKEN")
    assert "alg" in outcome.message


def test_unknown_tenant() -> None:
    outcome = rejected(verify(body(), tenant="initech"), "UNKNOWN_TENANT")
    assert outcome.request_id == "req-1"


@pytest.mark.parametrize("tenant", ["t" * 600, "ACME", "acme\n", "acme.eu", "*", ""])
def test_unknown_tenant_message_fits_the_host_contract_whatever_the_subject(tenant: str) -> None:
    # The subject's last token is host-controlled; the rejection must still be a valid RunResult.
    rejected(verify(body(), tenant=tenant), "UNKNOWN_TENANT")


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


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"request_id": "req-1"}',
        b'{"request_id": 5, "token": "t", "agent": "a", "input": "i"}',
    ],
)
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


# -- host commands (`SubmitCommand` on writ.in.commands.<tenant>) --------------------------


def command_body(tok: str | None = None, **fields: Any) -> bytes:
    document = {
        "type": "SubmitCommand",
        "request_id": "req-1",
        "token": token() if tok is None else tok,
        "agent": "assistant",
        "operation_key": "invoice-7-note",
        "action": "crm.note.create",
        "arguments": {"customer_id": "ACME-42", "body": "Paid."},
    }
    document.update(fields)
    return json.dumps(document).encode()


def test_host_command_is_verified_like_a_request() -> None:
    outcome = verify(command_body(), decoder=COMMAND_DECODER)
    assert isinstance(outcome, Verified)
    assert isinstance(outcome.request, SubmitCommand)
    assert (outcome.tenant, outcome.principal) == ("acme", "alice@acme")
    assert outcome.request.operation_key == "invoice-7-note"


@pytest.mark.parametrize("field", ["principal", "tenant", "operation_id"])
def test_host_command_rejects_unknown_fields(field: str) -> None:
    outcome = rejected(
        verify(command_body(**{field: "x"}), decoder=COMMAND_DECODER), "INVALID_REQUEST"
    )
    assert field in outcome.message


def test_host_command_token_is_checked() -> None:
    rejected(
        verify(command_body(token(key=STRANGER_PRIVATE)), decoder=COMMAND_DECODER), "BAD_SIGNATURE"
    )
    rejected(
        verify(command_body(token(claims_for(tenant="globex"))), decoder=COMMAND_DECODER),
        "WRONG_TENANT",
    )


def test_a_run_request_is_not_a_host_command() -> None:
    rejected(verify(body(), decoder=COMMAND_DECODER), "INVALID_REQUEST")
    rejected(verify(command_body()), "INVALID_REQUEST")


def test_command_run_id_is_deterministic_and_tenant_scoped() -> None:
    assert command_run_id("acme", "k1") == command_run_id("acme", "k1")
    assert command_run_id("acme", "k1") != command_run_id("globex", "k1")
    assert command_run_id("acme", "k1") != command_run_id("acme", "k2")
    assert command_run_id("acme", "k1") != run_id_for("acme", "k1")
    assert msgspec.convert(command_run_id("acme", "k" * 128), Id)  # usable as a run id


def test_run_ids_are_valid_ids() -> None:
    assert msgspec.convert(run_id_for("acme", "r" * 128), Id)


# -- review answers (`ReviewDecision` on writ.in.reviews.<tenant>) ------------------------------


def review_body(tok: str | None = None, **fields: Any) -> bytes:
    document = {
        "type": "ReviewDecision",
        "request_id": "req-1",
        "token": token(claims_for(roles=["approver"])) if tok is None else tok,
        "pending_id": "review-6f1d8a52-3b8e-4c1e-9a57-2f0c9b7e4d10-3",
        "answer": "approve",
        "comment": "The order number is right.",
    }
    document.update(fields)
    return json.dumps(document).encode()


def verify_review(raw: bytes, **options: Any) -> Verified | Rejection:
    return authorize(verify(raw, decoder=DECODERS["reviews"], **options), "reviews")


def test_review_answer_is_verified_with_tenant_and_reviewer_from_the_token() -> None:
    outcome = verify_review(review_body())
    assert isinstance(outcome, Verified)
    assert isinstance(outcome.request, ReviewDecision)
    assert (outcome.tenant, outcome.principal) == ("acme", "alice@acme")
    assert outcome.request.comment == "The order number is right."


def test_review_comment_is_optional() -> None:
    document = json.loads(review_body())
    del document["comment"]
    outcome = verify_review(json.dumps(document).encode())
    assert isinstance(outcome, Verified) and isinstance(outcome.request, ReviewDecision)
    assert outcome.request.comment == ""


@pytest.mark.parametrize("field", ["tenant", "reviewer", "run_id", "step", "reason"])
def test_review_answer_rejects_unknown_fields(field: str) -> None:
    # Who reviews, for which tenant and which run, is never the body's to say.
    outcome = rejected(verify_review(review_body(**{field: "x"})), "INVALID_REQUEST")
    assert field in outcome.message


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"answer": "once"}, "answer"),
        ({"answer": "always"}, "answer"),
        ({"comment": "c" * 513}, "comment"),
        ({"pending_id": "p" * 129}, "pending_id"),
        ({"pending_id": "review run 1"}, "pending_id"),
        ({"pending_id": ""}, "pending_id"),
    ],
)
def test_review_answer_bounds(changes: dict[str, Any], field: str) -> None:
    outcome = rejected(verify_review(review_body(**changes)), "INVALID_REQUEST")
    assert field in outcome.message


def test_review_comment_of_exactly_the_limit_is_accepted() -> None:
    assert isinstance(verify_review(review_body(comment="c" * 512)), Verified)


def test_oversized_review_answer_is_refused_before_decoding() -> None:
    raw = review_body(comment="c" * 600)
    rejected(verify_review(raw, max_bytes=len(raw) - 1), "TOO_LARGE")


@pytest.mark.parametrize("roles", [None, [], ["viewer"], ["Approver"], ["approvers"]])
def test_review_answer_needs_the_approver_role(roles: list[str] | None) -> None:
    outcome = rejected(verify_review(review_body(token(claims_for(roles=roles)))), "FORBIDDEN")
    assert outcome.request_id == "req-1"
    assert "approver" in outcome.message


def test_another_tenants_approver_is_refused_before_the_role_counts() -> None:
    globex = token(claims_for("globex", roles=["approver"]), key=GLOBEX_PRIVATE)
    rejected(verify_review(review_body(globex)), "BAD_SIGNATURE")  # on acme's subject
    rejected(
        verify_review(review_body(token(claims_for(tenant="globex", roles=["approver"])))),
        "WRONG_TENANT",
    )


@pytest.mark.parametrize("kind", sorted(APPROVER_KINDS))
def test_every_approver_kind_needs_the_role(kind: str) -> None:
    outcome = Verified(
        request=msgspec.json.decode(review_body(), type=ReviewDecision),
        tenant="acme",
        principal="alice@acme",
        run_id="r",
        roles=frozenset(),
    )
    rejected(authorize(outcome, kind), "FORBIDDEN")
    approver = msgspec.structs.replace(outcome, roles=frozenset({"approver", "viewer"}))
    assert authorize(approver, kind) is approver


@pytest.mark.parametrize("kind", ["requests", "commands"])
def test_host_kinds_need_no_role(kind: str) -> None:
    outcome = Verified(
        request=msgspec.json.decode(body(), type=RunRequest),
        tenant="acme",
        principal="alice@acme",
        run_id="r",
    )
    assert authorize(outcome, kind) is outcome


def test_a_rejection_passes_authorize_unchanged() -> None:
    rejection = Rejection(code="BAD_SIGNATURE", message="m", request_id="req-1")
    assert authorize(rejection, "reviews") is rejection


def test_every_host_subject_kind_has_a_decoder() -> None:
    assert set(DECODERS) == {"requests", "commands", "decisions", "approvals", "reviews", "cancels"}
    assert APPROVER_KINDS < set(DECODERS)


@pytest.mark.parametrize(
    ("pending_id", "target"),
    [
        (
            "review-6f1d8a52-3b8e-4c1e-9a57-2f0c9b7e4d10-0",
            ("6f1d8a52-3b8e-4c1e-9a57-2f0c9b7e4d10", 0),
        ),
        ("review-run-1-12", ("run-1", 12)),
        ("review-r-1000", ("r", 1000)),
        ("review-cmd-x.y:z-7", ("cmd-x.y:z", 7)),
    ],
)
def test_review_target_names_the_run_and_step(pending_id: str, target: tuple[str, int]) -> None:
    assert review_target(pending_id) == target


@pytest.mark.parametrize(
    "pending_id",
    [
        "review-1",
        "review--3",
        "review-run-1-1001",
        "review-run-1-12345",
        "prop_abc",
        "pd-1",
        "review-run-1-x",
        "Review-run-1-0",
        "review-run-1-0\n",
        "xreview-run-1-0",
    ],
)
def test_review_target_of_an_id_that_names_no_review(pending_id: str) -> None:
    assert review_target(pending_id) is None


def test_review_verdicts() -> None:
    assert review_verdict(None, answer="approve", run_status="succeeded") == (
        True,
        "approved; the run is succeeded",
    )
    assert review_verdict(None, answer="reject", run_status="failed") == (
        True,
        "rejected; the run is failed",
    )
    assert review_verdict("404", "no such run") == (False, NO_REVIEW)
    assert "no such run" not in NO_REVIEW  # another tenant's run looks like no run at all
    accepted, message = review_verdict("400", "x" * 600) or (True, "")
    assert not accepted and len(message) <= 512


@pytest.mark.parametrize("code", ["500", "503", "409"])
def test_a_failed_planner_is_no_verdict_so_the_answer_is_retried(code: str) -> None:
    assert review_verdict(code, "review answer failed") is None


# -- NumericDates, lifetime and leeway ---------------------------------


def _raw_token(claims: dict[str, Any]) -> str:
    """A token signed over exactly these JSON claims (no datetime conversion by PyJWT)."""
    return jwt.encode(claims, ACME_PRIVATE, algorithm="EdDSA")


def _epoch_claims(**overrides: Any) -> dict[str, Any]:
    now = int(datetime.now(UTC).timestamp())
    claims = {
        k: (int(v.timestamp()) if isinstance(v, datetime) else v) for k, v in claims_for().items()
    }
    claims.update({"iat": now, "exp": now + 300}, **overrides)
    return {k: v for k, v in claims.items() if v is not None}


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
def test_a_numeric_string_date_is_refused(claim: str) -> None:
    now = int(datetime.now(UTC).timestamp())
    value = {"exp": now + 300, "nbf": now - 10, "iat": now - 10}[claim]
    outcome = rejected(
        verify(body(_raw_token(_epoch_claims(**{claim: str(value)})))), "INVALID_TOKEN"
    )
    assert claim in outcome.message


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
def test_a_numeric_date_of_each_kind_is_accepted(claim: str) -> None:
    now = int(datetime.now(UTC).timestamp())
    value = {"exp": now + 300.5, "nbf": now - 10, "iat": now - 10}[claim]
    assert isinstance(verify(body(_raw_token(_epoch_claims(**{claim: value})))), Verified)


def test_a_boolean_date_is_refused() -> None:
    rejected(verify(body(_raw_token(_epoch_claims(nbf=True)))), "INVALID_TOKEN")


def test_a_token_living_longer_than_the_maximum_is_refused() -> None:
    now = int(datetime.now(UTC).timestamp())
    long_lived = _raw_token(_epoch_claims(iat=now, exp=now + 3600 + 60))
    assert "at most 3600" in rejected(verify(body(long_lived)), "INVALID_TOKEN").message
    # Without iat, the lifetime left counts.
    rejected(verify(body(_raw_token(_epoch_claims(iat=None, exp=now + 7200)))), "INVALID_TOKEN")
    # An old iat with a far exp is as long-lived, whatever is left.
    rejected(
        verify(body(_raw_token(_epoch_claims(iat=now - 3000, exp=now + 1000)))), "INVALID_TOKEN"
    )


def test_the_maximum_lifetime_is_a_setting_and_an_hour_is_accepted() -> None:
    now = int(datetime.now(UTC).timestamp())
    hour = _raw_token(_epoch_claims(iat=now, exp=now + 3600))
    assert isinstance(verify(body(hour)), Verified)
    rejected(verify(body(hour), max_ttl_s=600), "INVALID_TOKEN")


def test_clock_skew_within_the_leeway_is_accepted_beyond_it_refused() -> None:
    now = int(datetime.now(UTC).timestamp())
    # A host clock 3 s ahead: iat and nbf slightly in the future.
    ahead = _raw_token(_epoch_claims(iat=now + 3, nbf=now + 3, exp=now + 300))
    assert isinstance(verify(body(ahead)), Verified)
    rejected(verify(body(_raw_token(_epoch_claims(nbf=now + 60)))), "INVALID_TOKEN")


# -- the required `type` field -----------------------------------------


def test_a_message_without_its_type_is_refused() -> None:
    document = json.loads(body())
    del document["type"]
    outcome = rejected(verify(json.dumps(document).encode()), "INVALID_REQUEST")
    assert "`type`" in outcome.message


def test_a_message_of_another_type_on_the_subject_is_refused() -> None:
    rejected(verify(body(type="SubmitCommand")), "INVALID_REQUEST")


@pytest.mark.parametrize("field", ["input", "agent", "request_id"])
def test_a_nul_in_a_request_field_is_an_invalid_request_naming_it(field: str) -> None:
    outcome = rejected(verify(body(**{field: "ok\u0000"})), "INVALID_REQUEST")
    assert field in outcome.message
    assert "\x00" not in outcome.message  # the refusal itself is storable text


def test_the_maximum_token_lifetime_is_read_from_writ_max_token_ttl_s() -> None:
    from libs.settings import load_settings
    from services.ingress.__main__ import IngressSettings

    base = {"WRIT_NATS_URL": "nats://x", "WRIT_TENANT_KEYS_FILE": "keys.json"}
    assert load_settings(IngressSettings, base).max_token_ttl_s == 3600.0
    assert (
        load_settings(IngressSettings, {**base, "WRIT_MAX_TOKEN_TTL_S": "600"}).max_token_ttl_s
        == 600.0
    )


def test_an_issuer_of_email_principals_gets_one_identity_whatever_the_case() -> None:
    email = {**KEYS, "acme": msgspec.structs.replace(KEYS["acme"], principals="email")}
    for sub in ("Alice@ACME.example", "alice@acme.example", "ALICE@acme.EXAMPLE"):
        outcome = verify_request(
            body(token(claims_for(sub=sub))),
            subject_tenant="acme",
            header_request_id="req-1",
            keys=email,
            audience=AUDIENCE,
            max_bytes=MAX_BYTES,
        )
        assert isinstance(outcome, Verified) and outcome.principal == "alice@acme.example"


def test_an_issuer_of_exact_principals_keeps_them_as_they_are() -> None:
    outcome = verify(body(token(claims_for(sub="Alice@acme"))))
    assert isinstance(outcome, Verified) and outcome.principal == "Alice@acme"
