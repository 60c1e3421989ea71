"""Approval receipts: admission signs each command's authority before the command is relayed.

A receipt is a compact JWS (EdDSA) over the tenant, the operation id, the frozen command's
request hash, the exact request body's SHA-256 (with its method and path), the action and its
contract version, who authorised it (the approver's principal as their verified credential named
them, or the `decide` line and policy version) and when, until an expiry. Admission alone holds
the signing key; the dispatcher reads the stored receipt and forwards it in `Writ-Authorization`.
The journal records which key signed each one (`command.authorized`). docs/receipts.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from actions import ACTIONS
from libs.journal import Journal, SigningKey

__all__ = ["ReceiptSigner", "Authorizer"]

_HEADER_TYPE = "writ-receipt+jws"

# Each command's facts a receipt is made of, with the approver if a person approved it.
_COMMANDS = """
SELECT c.tenant, c.operation_id::text AS operation_id, c.request_hash, c.action,
       c.action_version, c.arguments, c.principal, c.run_id, c.decision_id::text AS decision_id,
       c.decision_line, c.policy_version, c.expires_at, p.approved_by
FROM unnest($1::text[], $2::uuid[]) AS k(tenant, operation_id)
JOIN admission.commands c ON c.tenant = k.tenant AND c.operation_id = k.operation_id
LEFT JOIN admission.proposals p ON p.tenant = c.tenant AND p.proposal_id = c.proposal_id
WHERE NOT EXISTS (SELECT 1 FROM admission.authorizations a
                  WHERE a.tenant = c.tenant AND a.operation_id = c.operation_id)
"""

_INSERT = """
WITH signed AS (
    INSERT INTO admission.authorizations (tenant, operation_id, kid, token, expires_at)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING 1
){journal}
SELECT count(*) FROM signed
"""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class ReceiptSigner:
    """Admission's receipt signing key (the journal key file's format: key id + PKCS8 PEM)."""

    def __init__(self, key: SigningKey) -> None:
        self._key = key

    @classmethod
    def from_file(cls, path: str) -> ReceiptSigner:
        """Load the signing key file.

        Raises:
            ConfigError: it is not an Ed25519 key file.
        """
        with open(path, encoding="utf-8") as f:
            return cls(SigningKey.from_json(f.read()))

    @property
    def kid(self) -> str:
        return self._key.key_id

    def sign(self, claims: dict[str, Any]) -> str:
        """The compact JWS of `claims`."""
        header = {"alg": "EdDSA", "typ": _HEADER_TYPE, "kid": self._key.key_id}
        signing_input = (
            _b64(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
        )
        return signing_input + "." + _b64(self._key.sign(signing_input.encode("ascii")))

    def jwk(self) -> dict[str, str]:
        """The public half as a JWK (what the JWKS publishes)."""
        raw = self._key.public_key().public_bytes_raw()
        return {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": _b64(raw),
            "kid": self._key.key_id,
            "use": "sig",
            "alg": "EdDSA",
        }


def claims_for(row: Any, *, now: datetime, grace: timedelta) -> dict[str, Any] | None:
    """A command row's receipt claims; None for an action with no provider request to sign
    (one Writ performs itself, e.g. a local draft)."""
    contract = ACTIONS.get(row["action"])
    if contract is None:
        return None
    arguments = row["arguments"]
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    try:
        call = contract.provider_call(contract.decode_arguments(arguments))
    except (NotImplementedError, msgspec.ValidationError):
        return None
    if row["approved_by"] is not None:
        authority: dict[str, Any] = {"kind": "person", "principal": row["approved_by"]}
    else:
        authority = {
            "kind": "policy",
            "decision_id": row["decision_id"],
            "line": row["decision_line"],
            "policy_version": row["policy_version"],
        }
    return {
        "iss": "writ",
        "tenant": row["tenant"],
        "operation_id": row["operation_id"],
        "request_hash": bytes(row["request_hash"]).hex(),
        "body_sha256": _b64(hashlib.sha256(call.body_bytes()).digest()),
        "method": call.method,
        "path": call.path,
        "action": row["action"],
        "version": row["action_version"],
        "on_behalf_of": row["principal"],
        "authorized_by": authority,
        "iat": int(now.timestamp()),
        "exp": int((row["expires_at"] + grace).timestamp()),
    }


class Authorizer:
    """Signs and stores the receipts of relayed commands, each journaled with its key id."""

    def __init__(self, signer: ReceiptSigner, journal: Journal | None, *, grace: timedelta) -> None:
        self._signer, self._journal, self._grace = signer, journal, grace
        row = "" if journal is None else ", " + journal.cte_if(6, "signed")
        self._insert = _INSERT.replace("{journal}", row)

    async def signed(self, row: Mapping[str, Any], *, now: datetime) -> tuple[Any, ...] | None:
        """A command's receipt as the parameters of its insert: (kid, token, expiry, then its
        `command.authorized` journal row's, with a journal); None for an action with no
        provider request to sign. `row` holds `_COMMANDS`' columns."""
        claims = claims_for(row, now=now, grace=self._grace)
        if claims is None:
            return None
        token = self._signer.sign(claims)
        expires_at = datetime.fromtimestamp(claims["exp"], UTC)
        entry: tuple[Any, ...] = ()
        if self._journal is not None:
            await self._journal.prepare(row["tenant"], row["run_id"])
            entry = msgspec.structs.astuple(
                self._journal.entry(
                    tenant=row["tenant"],
                    kind="command.authorized",
                    subject=row["operation_id"],
                    run_id=row["run_id"],
                    payload={
                        "operation_id": row["operation_id"],
                        "kid": self._signer.kid,
                        "body_sha256": claims["body_sha256"],
                        "authorized_by": claims["authorized_by"],
                        "expires_at": expires_at,
                    },
                )
            )
        return (self._signer.kid, token, expires_at, *entry)

    async def authorize(self, conn: asyncpg.Connection, keys: list[tuple[str, str]]) -> int:
        """Sign a receipt for each (tenant, operation_id) that has none yet; how many signed.

        Run (and committed) before the commands are relayed, so a dispatcher never claims a
        command whose receipt is not there yet. A command admitted on a decision's allow has
        its receipt from its admission's own statement (`AdmissionStore`): this signs the
        others (a person's approval, a command admitted without a signer).
        """
        if not keys:
            return 0
        rows = await conn.fetch(_COMMANDS, [k[0] for k in keys], [k[1] for k in keys])
        now = datetime.now(UTC)
        signed = 0
        for row in rows:
            params = await self.signed(row, now=now)
            if params is not None:
                signed += await conn.fetchval(
                    self._insert, row["tenant"], row["operation_id"], *params
                )
        return signed
