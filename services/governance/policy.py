"""Organisation policy files: signed with Ed25519, checked before anything in them is believed.

A policy file is JSON: `{"policy": {...}, "signature": {"key_id", "value"}}`. The signature is
over the RFC 8785 canonical form of `policy`, so reformatting the file does not break it and
changing any value does. A file whose signature, key or schema fails is *refused*: governance
records the refusal, and every sensitive call of that tenant is denied while reads go on.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Annotated

import msgspec
import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from schemas.base import Family
from schemas.mcp import parse_capability
from services.governance.store import Policy

__all__ = ["MAX_POLICY_BYTES", "PolicyDocument", "load_keys", "load_policy", "sign_policy"]

MAX_POLICY_BYTES = 256 * 1024
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class PolicyDocument(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an organisation decides for one tenant (decide's line 1, and developer mode)."""

    tenant: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}(?!\n)$")]
    version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    refused_tools: Annotated[list[_Name], msgspec.Meta(max_length=1000)] = []
    refused_connectors: Annotated[list[_Name], msgspec.Meta(max_length=1000)] = []
    refused_families: Annotated[list[Family], msgspec.Meta(max_length=5)] = []
    developer_mode: bool = False

    def __post_init__(self) -> None:
        # An `mcp:` name decide cannot parse refuses nothing: a policy saying it does is not one.
        for name in self.refused_tools:
            if name.startswith("mcp:") and not _names_mcp(name):
                raise ValueError(
                    f"refused_tools names {name[:128]!r}, which is no MCP tool: write "
                    "mcp:<server>/<tool> or mcp:<server>/* (a server's every tool)"
                )


def _names_mcp(name: str) -> bool:
    """Is `name` an `mcp:` capability, or a server's whole source `mcp:<server>/*`?"""
    if name.endswith("/*"):
        name = f"{name[:-2]}/x"
    return parse_capability(name) is not None


class _Signature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    value: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class _SignedFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    policy: msgspec.Raw
    signature: _Signature


def load_policy(path: Path, tenant: str, keys: dict[str, Ed25519PublicKey]) -> Policy:
    """The tenant's policy from `path`, or a refused policy saying why."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return _refused(tenant, f"cannot read {path.name}: {exc.strerror}", None)
    digest = hashlib.sha256(raw).hexdigest()
    if len(raw) > MAX_POLICY_BYTES:
        return _refused(tenant, "policy file too large", digest)
    try:
        signed = msgspec.json.decode(raw, type=_SignedFile)
        body = msgspec.json.decode(signed.policy)
        key = keys.get(signed.signature.key_id)
        if key is None:
            return _refused(tenant, f"unknown signing key {signed.signature.key_id!r}", digest)
        key.verify(base64.b64decode(signed.signature.value, validate=True), rfc8785.dumps(body))
        document = msgspec.convert(body, PolicyDocument)
    except InvalidSignature:
        return _refused(tenant, "the signature does not verify", digest)
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        return _refused(tenant, f"not a valid policy file: {exc}"[:500], digest)
    if document.tenant != tenant:
        return _refused(tenant, f"the file is signed for tenant {document.tenant!r}", digest)
    return Policy(
        tenant=tenant,
        version=document.version,
        refused_tools=tuple(document.refused_tools),
        refused_connectors=tuple(document.refused_connectors),
        refused_families=tuple(document.refused_families),
        developer_mode=document.developer_mode,
        key_id=signed.signature.key_id,
        digest=digest,
    )


def sign_policy(document: PolicyDocument, key: Ed25519PrivateKey, key_id: str) -> bytes:
    """A signed policy file for `document` (what `writ policy sign` writes)."""
    body = msgspec.to_builtins(document)
    signature = base64.b64encode(key.sign(rfc8785.dumps(body))).decode()
    return msgspec.json.format(
        msgspec.json.encode({"policy": body, "signature": {"key_id": key_id, "value": signature}}),
        indent=2,
    )


def load_keys(pems: dict[str, str]) -> dict[str, Ed25519PublicKey]:
    """Policy signing keys by key id, from PEM text; anything but Ed25519 is refused."""
    keys = {}
    for key_id, pem in pems.items():
        key = load_pem_public_key(pem.encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"policy key {key_id!r} is not an Ed25519 key")
        keys[key_id] = key
    return keys


def _refused(tenant: str, why: str, digest: str | None) -> Policy:
    return Policy(
        tenant=tenant,
        version=f"refused:{(digest or 'unreadable')[:12]}",
        status="refused",
        refusal=why,
        digest=digest,
    )
