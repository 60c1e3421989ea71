"""Approval receipt keys of a deployment: admission's signing key and the public key set.

The signing key (`secrets/receipts-signing.json`, the journal key file's format) is admission's
alone. The public half of every key whose receipts may still be in flight is in
`config/receipt-keys.json`, a JWKS: ingress publishes it (`GET /v1/receipts/keys`) and the
systems of record verify with it. Rotation keeps the old key in the set (`rotate`) until every
receipt it signed has expired, then drops it (`retire`). docs/receipts.md.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from libs.journal import SigningKey

__all__ = ["PUBLIC", "SIGNING", "ensure", "jwk", "retire", "rotate"]

SIGNING = "receipts-signing.json"
PUBLIC = "receipt-keys.json"


def jwk(key: SigningKey) -> dict[str, str]:
    """The public half of `key` as a JWK."""
    raw = key.public_key().public_bytes_raw()
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii"),
        "kid": key.key_id,
        "use": "sig",
        "alg": "EdDSA",
    }


def _read(config: Path) -> dict[str, Any]:
    path = config / PUBLIC
    return json.loads(path.read_text()) if path.exists() else {"keys": []}


def _write(config: Path, jwks: dict[str, Any]) -> None:
    tmp = config / f".{PUBLIC}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(jwks, indent=2))
    os.replace(tmp, config / PUBLIC)  # a verifier reloading it never reads half a file


def _write_signing(secrets: Path, key: SigningKey) -> None:
    path = secrets / SIGNING
    tmp = secrets / f".{SIGNING}.{os.getpid()}.tmp"
    tmp.write_text(key.to_json())
    tmp.chmod(0o600)
    os.replace(tmp, path)


def _publish(config: Path, key: SigningKey) -> None:
    jwks = _read(config)
    jwks["keys"] = [k for k in jwks["keys"] if k.get("kid") != key.key_id] + [jwk(key)]
    _write(config, jwks)


def ensure(secrets: Path, config: Path) -> str:
    """A signing key (made once) whose public half is in the key set; its key id."""
    path = secrets / SIGNING
    if not path.exists():
        _write_signing(secrets, SigningKey.generate("receipts-1"))
    key = SigningKey.from_json(path.read_text())
    if key.key_id not in {k.get("kid") for k in _read(config)["keys"]}:
        _publish(config, key)
    return key.key_id


def rotate(secrets: Path, config: Path) -> str:
    """A new signing key, published beside the old one (which keeps verifying the receipts it
    signed); its key id. Admission signs with it once restarted."""
    old = SigningKey.from_json((secrets / SIGNING).read_text()).key_id
    prefix, _, number = old.rpartition("-")
    new_id = f"{prefix}-{int(number) + 1}" if number.isdigit() else f"{old}-2"
    key = SigningKey.generate(new_id)
    _publish(config, key)  # published before it signs anything
    _write_signing(secrets, key)
    return key.key_id


def retire(config: Path, kid: str) -> None:
    """Drop `kid` from the key set: receipts it signed no longer verify."""
    jwks = _read(config)
    jwks["keys"] = [k for k in jwks["keys"] if k.get("kid") != kid]
    _write(config, jwks)
