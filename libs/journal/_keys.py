"""Keys: the AES-GCM data keys of payloads, the Ed25519 checkpoint key, the verifiers' keys."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Mapping
from datetime import datetime

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from libs.errors import ConfigError, WritError


class JournalError(WritError):
    """A journal row cannot be opened: unknown key, or not authentic (edited or forged)."""

    def __init__(self, msg: str, *, entry_id: int | None = None) -> None:
        super().__init__(msg)
        self.entry_id = entry_id


# -- keys -------------------------------------------------------------------------------------


class DataKeys:
    """AES-256-GCM keys of one journal's payloads by key id: `active` encrypts, all decrypt.

    The key file is JSON: `{"active": "<id>", "keys": {"<id>": "<base64 of 32 bytes>"}}`. Keep
    retired keys in it for as long as their rows must be read.
    """

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if active not in keys:
            raise ConfigError(f"journal data key {active!r} is not among the keys")
        bad = [k for k, v in keys.items() if len(v) != 32]
        if bad:
            raise ConfigError(f"journal data keys must be 32 bytes: {bad}")
        self.active = active
        self._aead = {key_id: AESGCM(key) for key_id, key in keys.items()}

    @classmethod
    def from_json(cls, text: str | bytes) -> DataKeys:
        """Parse a data key file."""
        try:
            doc = json.loads(text)
            return cls(
                {k: base64.b64decode(v, validate=True) for k, v in doc["keys"].items()},
                doc["active"],
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid journal data key file: {exc!r}") from None

    @staticmethod
    def generate(key_id: str, existing: str | None = None) -> str:
        """A key file whose active key is a new one; `existing` keys are kept to decrypt."""
        doc = json.loads(existing) if existing else {"keys": {}}
        doc["keys"][key_id] = base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()
        doc["active"] = key_id
        return json.dumps(doc, indent=2)

    def key_for(self, tenant: str, at: datetime, run_id: str = "") -> str:
        """The key id a row of `tenant` recorded at `at` is encrypted under: the active one."""
        return self.active

    def encrypt(
        self, plaintext: bytes, aad: bytes, key_id: str | None = None
    ) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext) under `key_id`, by default the active key."""
        key_id = key_id or self.active
        aead = self._aead.get(key_id)
        if aead is None:
            raise JournalError(f"unknown journal data key {key_id!r}")
        nonce = secrets.token_bytes(12)
        return key_id, nonce, aead.encrypt(nonce, plaintext, aad)

    def decrypt(self, key_id: str, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
        """The plaintext, or JournalError if the key is unknown or the row is not authentic."""
        aead = self._aead.get(key_id)
        if aead is None:
            raise JournalError(f"unknown journal data key {key_id!r}")
        try:
            return aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise JournalError("not authentic (edited, moved or forged)") from None


class SigningKey:
    """A service's Ed25519 checkpoint signing key and its id.

    The key file is JSON: `{"key_id": "<id>", "private_key": "<PKCS8 PEM>"}`. To rotate, give the
    service a new file and add the new public key to the verifiers' key file, keeping the old one:
    checkpoints record the key id they were signed with.
    """

    def __init__(self, key_id: str, private_key: Ed25519PrivateKey) -> None:
        self.key_id, self._key = key_id, private_key

    @classmethod
    def from_json(cls, text: str | bytes) -> SigningKey:
        """Parse a signing key file."""
        try:
            doc = json.loads(text)
            key = serialization.load_pem_private_key(doc["private_key"].encode(), password=None)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid journal signing key file: {exc!r}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError("the journal signing key must be an Ed25519 private key")
        return cls(str(doc["key_id"]), key)

    @classmethod
    def generate(cls, key_id: str) -> SigningKey:
        """A new key."""
        return cls(key_id, Ed25519PrivateKey.generate())

    def to_json(self) -> str:
        """The key file's contents (a secret)."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        return json.dumps({"key_id": self.key_id, "private_key": pem}, indent=2)

    def public_pem(self) -> str:
        """The public half, for verifiers."""
        return (
            self._key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )

    def public_key(self) -> Ed25519PublicKey:
        """The public half, to check what this key signed."""
        return self._key.public_key()

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature."""
        return self._key.sign(message)


def load_verify_keys(text: str | bytes) -> dict[str, dict[str, Ed25519PublicKey]]:
    """Parse `{"<service>": {"<key id>": "<public key PEM>"}}`: each service's own keys only."""
    try:
        doc = json.loads(text)
        out: dict[str, dict[str, Ed25519PublicKey]] = {}
        for service, keys in doc.items():
            out[service] = {}
            for key_id, pem in keys.items():
                key = serialization.load_pem_public_key(pem.encode())
                if not isinstance(key, Ed25519PublicKey):
                    raise ValueError(f"{service}/{key_id} is not an Ed25519 public key")
                out[service][key_id] = key
        return out
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(f"invalid journal verification key file: {exc!r}") from None
