"""The journal's pure parts: canonical hashing, AES-GCM with its associated data, checkpoint
signatures across a key rotation, and key files."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from cryptography.exceptions import InvalidSignature

from libs.errors import ConfigError
from libs.journal import (
    DataKeys,
    Journal,
    JournalError,
    SigningKey,
    checkpoint_message,
    entry_hash,
    genesis_hash,
    load_verify_keys,
)

ROW: dict[str, Any] = {
    "id": 7,
    "xid": "745",
    "tenant": "acme",
    "kind": "decision",
    "subject": "d-1",
    "run_id": "run-1",
    "recorded_at": datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    "key_id": "d1",
    "nonce": bytes(range(12)),
    "ciphertext": b"\x00\xffsecret",
}


def journal(active: str = "d1", existing: str | None = None) -> tuple[Journal, str]:
    text = DataKeys.generate(active, existing=existing)
    return Journal(service="governance", keys=DataKeys.from_json(text)), text


# -- canonical hashing ------------------------------------------------------------------------


def test_the_entry_hash_is_sha256_over_the_rfc8785_encoding() -> None:
    # Pinned: a verifier written from the README alone must get the same bytes.
    canonical = (
        '{"ciphertext":"AP9zZWNyZXQ=","id":"7","key_id":"d1","kind":"decision",'
        '"nonce":"AAECAwQFBgcICQoL","recorded_at":"1735787045678901","run_id":"run-1",'
        '"seq":"3","service":"governance","subject":"d-1","tenant":"acme","v":1,"xid":"745"}'
    )
    prev = b"\x01" * 32
    assert (
        entry_hash(prev, service="governance", seq=3, row=ROW)
        == hashlib.sha256(prev + canonical.encode()).digest()
    )
    assert genesis_hash("governance") == hashlib.sha256(b"writ-journal/1:governance").digest()


@pytest.mark.parametrize(
    "field,value",
    [
        ("id", 8),
        ("xid", "746"),
        ("tenant", "globex"),
        ("kind", "x"),
        ("subject", "d-2"),
        ("run_id", ""),
        ("recorded_at", datetime(2025, 1, 2, 3, 4, 5, 678902, tzinfo=UTC)),
        ("key_id", "d2"),
        ("nonce", bytes(12)),
        ("ciphertext", b"\x01\xffsecret"),
    ],
)
def test_every_stored_column_is_in_the_hash(field: str, value: object) -> None:
    before = entry_hash(bytes(32), service="governance", seq=1, row=ROW)
    assert entry_hash(bytes(32), service="governance", seq=1, row={**ROW, field: value}) != before


def test_a_rejection_is_in_the_hash_and_an_accepted_row_hashes_as_before() -> None:
    base = entry_hash(bytes(32), service="governance", seq=1, row=ROW)
    assert entry_hash(bytes(32), service="governance", seq=1, row={**ROW, "rejected": None}) == base
    assert (
        entry_hash(
            bytes(32), service="governance", seq=1, row={**ROW, "rejected": "unauthentic: forged"}
        )
        != base
    )


def test_the_place_in_the_chain_and_the_service_are_in_the_hash() -> None:
    base = entry_hash(bytes(32), service="governance", seq=1, row=ROW)
    assert entry_hash(bytes(32), service="governance", seq=2, row=ROW) != base
    assert entry_hash(b"\x01" * 32, service="governance", seq=1, row=ROW) != base
    assert entry_hash(bytes(32), service="admission", seq=1, row=ROW) != base
    assert genesis_hash("governance") != genesis_hash("admission")


def test_the_hash_does_not_depend_on_the_timestamp_zone() -> None:
    from datetime import timedelta, timezone

    paris = ROW["recorded_at"].astimezone(timezone(timedelta(hours=1)))
    assert entry_hash(
        bytes(32), service="g", seq=1, row={**ROW, "recorded_at": paris}
    ) == entry_hash(bytes(32), service="g", seq=1, row=ROW)


# -- encryption -------------------------------------------------------------------------------


def stored(j: Journal, **kwargs: Any) -> dict[str, Any]:
    entry = j.entry(
        tenant="acme",
        kind="decision",
        subject="d-1",
        run_id="run-1",
        payload={"verdict": "allow", "reason": "standing grant"},
    )
    return {"id": 1, **msgspec.structs.asdict(entry), **kwargs}


def test_payloads_round_trip_and_are_not_stored_in_clear() -> None:
    j, _ = journal()
    row = stored(j)
    assert b"standing grant" not in row["ciphertext"]
    assert msgspec.json.decode(j.open(row)) == {"verdict": "allow", "reason": "standing grant"}
    assert len(row["nonce"]) == 12 and row["key_id"] == "d1"
    assert stored(j)["nonce"] != row["nonce"]  # a fresh nonce every time


@pytest.mark.parametrize(
    "field,value",
    [
        ("tenant", "globex"),
        ("kind", "grant.standing"),
        ("subject", "d-2"),
        ("run_id", "run-2"),
        ("recorded_at", datetime(2025, 1, 2, 3, 4, 5, 678902, tzinfo=UTC)),
    ],
)
def test_the_associated_data_binds_the_row_to_its_identifiers(field: str, value: object) -> None:
    j, _ = journal()
    with pytest.raises(JournalError, match="not authentic"):
        j.open(stored(j, **{field: value}))


def test_a_flipped_byte_or_a_row_of_another_service_does_not_open() -> None:
    j, text = journal()
    row = stored(j)
    flipped = bytearray(row["ciphertext"])
    flipped[0] ^= 1
    with pytest.raises(JournalError, match="not authentic"):
        j.open({**row, "ciphertext": bytes(flipped)})
    other = Journal(service="admission", keys=DataKeys.from_json(text))
    with pytest.raises(JournalError):
        other.open(row)


def test_rotated_data_keys_still_open_old_rows_and_unknown_keys_do_not() -> None:
    old, text = journal("d1")
    row = stored(old)
    new, _ = journal("d2", existing=text)
    assert stored(new)["key_id"] == "d2"
    assert msgspec.json.decode(new.open(row))["verdict"] == "allow"
    stranger, _ = journal("d1")  # same id, other key material
    with pytest.raises(JournalError):
        stranger.open(row)
    with pytest.raises(JournalError, match="unknown"):
        new.open({**row, "key_id": "d9"})


# -- signatures -------------------------------------------------------------------------------


def test_checkpoints_verify_across_a_signing_key_rotation() -> None:
    first, second = SigningKey.generate("governance-1"), SigningKey.generate("governance-2")
    keys = load_verify_keys(
        json.dumps(
            {
                "governance": {
                    "governance-1": first.public_pem(),
                    "governance-2": second.public_pem(),
                }
            }
        )
    )["governance"]
    old = checkpoint_message("governance", 10, 0, b"\x01" * 32, "governance-1")
    new = checkpoint_message("governance", 20, 10, b"\x02" * 32, "governance-2")
    old_sig, new_sig = first.sign(old), second.sign(new)
    keys["governance-1"].verify(old_sig, old)  # the old checkpoint still verifies
    keys["governance-2"].verify(new_sig, new)
    with pytest.raises(InvalidSignature):
        keys["governance-2"].verify(old_sig, old)


def test_a_checkpoint_signature_covers_service_seq_head_and_key() -> None:
    key = SigningKey.generate("k")
    public = load_verify_keys(json.dumps({"g": {"k": key.public_pem()}}))["g"]["k"]
    signature = key.sign(checkpoint_message("g", 5, 4, b"\x01" * 32, "k"))
    for other in (
        checkpoint_message("a", 5, 4, b"\x01" * 32, "k"),
        checkpoint_message("g", 6, 4, b"\x01" * 32, "k"),
        checkpoint_message("g", 5, 3, b"\x01" * 32, "k"),
        checkpoint_message("g", 5, 4, b"\x02" * 32, "k"),
        checkpoint_message("g", 5, 4, b"\x01" * 32, "k2"),
    ):
        with pytest.raises(InvalidSignature):
            public.verify(signature, other)


# -- key files --------------------------------------------------------------------------------


def test_key_files_round_trip() -> None:
    key = SigningKey.generate("governance-7")
    again = SigningKey.from_json(key.to_json())
    assert again.key_id == "governance-7" and again.public_pem() == key.public_pem()
    doc = json.loads(DataKeys.generate("d2", existing=DataKeys.generate("d1")))
    assert doc["active"] == "d2" and set(doc["keys"]) == {"d1", "d2"}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"active": "d1", "keys": {}}',
        json.dumps({"active": "d1", "keys": {"d1": base64.b64encode(b"short").decode()}}),
    ],
)
def test_bad_data_key_files_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        DataKeys.from_json(text)


def test_bad_signing_and_verification_key_files_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        SigningKey.from_json('{"key_id": "k"}')
    with pytest.raises(ConfigError):
        load_verify_keys('{"governance": {"k": "not a pem"}}')
