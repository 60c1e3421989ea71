"""Approval receipts: what admission signs, what the SDK's verifier accepts and refuses."""

from __future__ import annotations

import base64
import hashlib
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from actions import ACTIONS
from libs.journal import SigningKey
from services.admission.receipts import ReceiptSigner, claims_for
from writ import receipt_keys
from writ_client.receipts import KeySet, ReceiptRefused, body_digest, verify

OPERATION = "0b7c1a52-6a55-4a8f-9a52-3f0d1c2b9e11"
ARGUMENTS = {"customer_id": "ACME-42", "body": "Called back about order 7781."}


def _row(**changes: Any) -> dict[str, Any]:
    row = {
        "tenant": "acme",
        "operation_id": OPERATION,
        "request_hash": b"\x01" * 32,
        "action": "crm.note.create",
        "action_version": ACTIONS["crm.note.create"].version,
        "arguments": ARGUMENTS,
        "principal": "alice@acme.example",
        "run_id": "run-1",
        "decision_id": "5f1e8c9a-0000-4000-8000-000000000001",
        "decision_line": 12,
        "policy_version": "v7",
        "expires_at": datetime.now(UTC) + timedelta(hours=1),
        "approved_by": None,
    }
    return {**row, **changes}


def _body() -> bytes:
    contract = ACTIONS["crm.note.create"]
    return contract.provider_call(contract.decode_arguments(ARGUMENTS)).body_bytes()


def _signed(key: SigningKey, **changes: Any) -> str:
    claims = claims_for(_row(**changes), now=datetime.now(UTC), grace=timedelta(minutes=10))
    assert claims is not None
    return ReceiptSigner(key).sign(claims)


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate("receipts-1")


@pytest.fixture
def keys(key: SigningKey) -> KeySet:
    return KeySet.from_jwks({"keys": [receipt_keys.jwk(key)]})


def test_the_approved_bytes_verify_and_name_who_authorised_them(
    key: SigningKey, keys: KeySet
) -> None:
    receipt = verify(
        _signed(key, approved_by="alice@acme.example"),
        _body(),
        keys,
        tenant="acme",
        operation_id=OPERATION,
    )
    assert (receipt.tenant, receipt.operation_id, receipt.action) == (
        "acme",
        OPERATION,
        "crm.note.create",
    )
    assert receipt.authorized_by.kind == "person"
    assert receipt.authorized_by.principal == "alice@acme.example"
    assert receipt.body_sha256 == body_digest(_body())
    assert receipt.request_hash == (b"\x01" * 32).hex()
    assert (receipt.method, receipt.path) == ("POST", "/v1/customers/ACME-42/notes")


def test_without_a_person_the_policy_line_is_the_authority(key: SigningKey, keys: KeySet) -> None:
    receipt = verify(_signed(key), _body(), keys)
    assert receipt.authorized_by.kind == "policy"
    assert (receipt.authorized_by.line, receipt.authorized_by.policy_version) == (12, "v7")
    assert receipt.authorized_by.principal is None


def _refused(receipt: str | None, body: bytes, keys: KeySet, **kwargs: Any) -> str:
    with pytest.raises(ReceiptRefused) as caught:
        verify(receipt, body, keys, **kwargs)
    return caught.value.reason


def test_each_bad_receipt_is_refused_with_its_reason(key: SigningKey, keys: KeySet) -> None:
    good = _signed(key)
    header, payload, signature = good.split(".")
    assert _refused(None, _body(), keys) == "missing"
    assert _refused("", _body(), keys) == "missing"
    assert _refused("not-a-jws", _body(), keys) == "malformed"
    assert _refused("a.b.c", _body(), keys) == "malformed"
    # Signed by a key Writ never published.
    assert _refused(_signed(SigningKey.generate("receipts-9")), _body(), keys) == "unknown_key"
    # Signed by another key under Writ's key id: forged.
    assert _refused(_signed(SigningKey.generate("receipts-1")), _body(), keys) == "forged"
    # Claims changed after signing (another operation id, say): forged.
    other = _signed(key, operation_id="11111111-2222-4333-8444-555555555555").split(".")[1]
    assert _refused(f"{header}.{other}.{signature}", _body(), keys) == "forged"
    past = datetime.now(UTC) - timedelta(hours=2)
    assert _refused(_signed(key, expires_at=past), _body(), keys) == "expired"
    assert _refused(good, _body(), keys, tenant="globex") == "tenant_mismatch"
    assert (
        _refused(good, _body(), keys, operation_id="11111111-2222-4333-8444-555555555555")
        == "operation_mismatch"
    )
    assert _refused(good, _body().replace(b"7781", b"7782"), keys) == "body_mismatch"
    assert _refused(good, _body() + b" ", keys) == "body_mismatch"
    assert _refused(good + "x" * 9000, _body(), keys) == "malformed"


def test_expiry_is_the_commands_own_plus_the_grace(key: SigningKey, keys: KeySet) -> None:
    expires = datetime.now(UTC) + timedelta(minutes=5)
    receipt = verify(_signed(key, expires_at=expires), _body(), keys)
    assert receipt.exp == int((expires + timedelta(minutes=10)).timestamp())
    assert _refused(_signed(key, expires_at=expires), _body(), keys, now=receipt.exp) == "expired"
    assert verify(_signed(key, expires_at=expires), _body(), keys, now=time.time())


def test_an_action_writ_performs_itself_gets_no_receipt() -> None:
    for action in ("email.draft.apply", "writ.noop"):
        row = _row(action=action, arguments={"draft_id": "d-1"})
        assert claims_for(row, now=datetime.now(UTC), grace=timedelta(0)) is None, action


def test_rotation_keeps_the_old_key_until_it_is_retired(tmp_path: Path) -> None:
    secrets, config = tmp_path / "secrets", tmp_path / "config"
    secrets.mkdir()
    config.mkdir()
    first = receipt_keys.ensure(secrets, config)
    old = SigningKey.from_json((secrets / receipt_keys.SIGNING).read_text())
    in_flight = _signed(old)
    second = receipt_keys.rotate(secrets, config)
    new = SigningKey.from_json((secrets / receipt_keys.SIGNING).read_text())
    assert (first, second, new.key_id) == ("receipts-1", "receipts-2", "receipts-2")
    both = KeySet.from_jwks((config / receipt_keys.PUBLIC).read_text())
    assert sorted(both.keys) == ["receipts-1", "receipts-2"]
    verify(in_flight, _body(), both)  # signed before the rotation: still valid
    verify(_signed(new), _body(), both)
    receipt_keys.retire(config, first)
    after = KeySet.from_jwks((config / receipt_keys.PUBLIC).read_text())
    assert _refused(in_flight, _body(), after) == "unknown_key"
    verify(_signed(new), _body(), after)


def test_the_body_digest_is_of_the_exact_bytes() -> None:
    assert body_digest(b"{}") != body_digest(b"{ }")
    digest = hashlib.sha256(_body()).digest()
    assert body_digest(_body()) == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_writ_receipts_rotates_and_retires_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from writ.cli import main

    (tmp_path / "secrets").mkdir()
    (tmp_path / "config").mkdir()
    receipt_keys.ensure(tmp_path / "secrets", tmp_path / "config")

    def run(*argv: str) -> int:
        with pytest.raises(SystemExit) as done:
            main(["receipts", *argv, "--home", str(tmp_path)])
        return int(done.value.code or 0)

    assert run("rotate") == 0
    assert (
        "signing key now receipts-2; published: receipts-1, receipts-2" in capsys.readouterr().out
    )
    with pytest.raises(SystemExit, match="is the signing key"):
        main(["receipts", "retire", "receipts-2", "--home", str(tmp_path)])
    # Whether its receipts have all expired is the database's to say; with none, it is refused.
    with pytest.raises(SystemExit, match="cannot tell whether receipts signed by receipts-1"):
        main(["receipts", "retire", "receipts-1", "--home", str(tmp_path)])
    assert run("retire", "receipts-1", "--force") == 0
    capsys.readouterr()
    assert run("keys") == 0
    listed = KeySet.from_jwks(capsys.readouterr().out)
    assert sorted(listed.keys) == ["receipts-2"]
