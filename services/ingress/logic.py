"""Verifying a host's request: pure functions, no I/O."""

from __future__ import annotations

import math
import re
import time
import uuid
from pathlib import Path
from typing import Any, Final, Literal

import jwt
import msgspec

from libs.errors import ConfigError
from schemas.base import storable
from schemas.control import CancelRun
from schemas.host import ApproveProposal, HumanDecision, ReviewDecision, RunRequest, SubmitCommand

__all__ = [
    "declared_agents",
    "APPROVAL_DECODER",
    "APPROVER_KINDS",
    "APPROVER_ROLE",
    "AUDITOR_ROLE",
    "LEEWAY_S",
    "MAX_TOKEN_TTL_S",
    "COMMAND_DECODER",
    "DECISION_DECODER",
    "DECODERS",
    "NO_REVIEW",
    "REQUEST_DECODER",
    "REVIEW_DECODER",
    "Rejection",
    "TenantKey",
    "Verified",
    "authorize",
    "command_run_id",
    "review_target",
    "review_verdict",
    "run_id_for",
    "token_tenant",
    "verify_request",
    "verify_token",
]

_RUN_NAMESPACE: Final = uuid.UUID("6f1d8a52-3b8e-4c1e-9a57-2f0c9b7e4d10")
_TENANT: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_PRINCIPAL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}")
REQUEST_DECODER: Final = msgspec.json.Decoder(RunRequest)
COMMAND_DECODER: Final = msgspec.json.Decoder(SubmitCommand)
DECISION_DECODER: Final = msgspec.json.Decoder(HumanDecision)
APPROVAL_DECODER: Final = msgspec.json.Decoder(ApproveProposal)
REVIEW_DECODER: Final = msgspec.json.Decoder(ReviewDecision)
CANCEL_DECODER: Final = msgspec.json.Decoder(CancelRun)
# The message type of each host subject, by its kind (`writ.in.<kind>.<tenant>`).
DECODERS: Final = {
    "requests": REQUEST_DECODER,
    "commands": COMMAND_DECODER,
    "decisions": DECISION_DECODER,
    "approvals": APPROVAL_DECODER,
    "reviews": REVIEW_DECODER,
    "cancels": CANCEL_DECODER,
}
APPROVER_ROLE: Final = "approver"
# Reads of the audit journal (replay, verify) need this role.
AUDITOR_ROLE: Final = "auditor"
# Clock skew tolerated between a host's clock and ingress's, on exp, nbf and iat.
LEEWAY_S: Final = 5.0
# The longest a token may live (WRIT_MAX_TOKEN_TTL_S): a stolen token is worth an hour.
MAX_TOKEN_TTL_S: Final = 3600.0
_DATES: Final = ("exp", "nbf", "iat")
# Only approvers answer decisions, approve or reject proposals, and answer reviews.
APPROVER_KINDS: Final = frozenset({"decisions", "approvals", "reviews"})
# The planner's `review-<run>-<step>` (`step` bounded like `ReviewAnswer.step`).
_REVIEW_ID: Final = re.compile(r"review-([A-Za-z0-9][A-Za-z0-9_.:-]*)-(\d{1,4})")
# One answer for an id that names no waiting review, whatever the reason (malformed, another
# tenant's run, answered already): the answer must not tell which runs exist.
NO_REVIEW: Final = "no review is waiting under this id (unknown, or answered already)"


class TenantKey(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The issuer and EdDSA public key (PEM) a tenant's hosts sign their tokens with."""

    issuer: str
    public_key: str
    # What the issuer's principals are: `email` addresses are one person whatever their case
    # (case-folded once, here, so maker-checker, grants and the journal see one identity);
    # `exact` ids are compared as they are.
    principals: Literal["exact", "email"] = "exact"


class Verified(msgspec.Struct, frozen=True, kw_only=True):
    """A request whose token checked out; tenant and principal come from the token."""

    request: (
        RunRequest | SubmitCommand | HumanDecision | ApproveProposal | ReviewDecision | CancelRun
    )
    tenant: str
    principal: str
    run_id: str
    roles: frozenset[str] = frozenset()


class _Tag(msgspec.Struct):
    type: Any = None


_TAG_DECODER: Final = msgspec.json.Decoder(_Tag)


class Rejection(msgspec.Struct, frozen=True, kw_only=True):
    """Why a request is refused; `code` is part of the host contract."""

    code: str
    message: str
    request_id: str


def run_id_for(tenant: str, request_id: str) -> str:
    """The run's id, derived from (tenant, request id): a re-sent request names the same run."""
    return str(uuid.uuid5(_RUN_NAMESPACE, f"{tenant}\x00{request_id}"))


def command_run_id(tenant: str, operation_key: str) -> str:
    """The pseudo-run a host's command belongs to: one per operation key, so retries share it."""
    return "cmd-" + str(uuid.uuid5(_RUN_NAMESPACE, f"{tenant}\x00key\x00{operation_key}"))


def verify_request(
    body: bytes,
    *,
    subject_tenant: str,
    header_request_id: str | None,
    keys: dict[str, TenantKey],
    audience: str,
    max_bytes: int,
    leeway_s: float = LEEWAY_S,
    max_ttl_s: float = MAX_TOKEN_TTL_S,
    now: float | None = None,
    decoder: msgspec.json.Decoder[Any] = REQUEST_DECODER,
) -> Verified | Rejection:
    """Bound, decode and authenticate one host message published on a tenant's subject.

    `decoder` decodes the message type of the subject (`RunRequest` by default, or
    `SubmitCommand`); both carry `request_id` and `token`. The token is checked by
    `verify_token`.
    """
    fallback_id = (header_request_id or "")[:128]
    if len(body) > max_bytes:
        return Rejection(
            code="TOO_LARGE",
            request_id=fallback_id,
            message=f"request is {len(body)} bytes; the limit is {max_bytes}",
        )
    try:
        request = decoder.decode(body)
        # msgspec checks a tag that is there; the host contract requires it there.
        tagged = _TAG_DECODER.decode(body).type is not None
    except msgspec.DecodeError as exc:
        return Rejection(
            code="INVALID_REQUEST",
            message=storable(str(exc)[:500]),
            request_id=storable(fallback_id),
        )
    if not tagged:
        return Rejection(
            code="INVALID_REQUEST",
            request_id=request.request_id,
            message=f'Object missing required field `type` ("{type(request).__name__}" here)',
        )
    if header_request_id is not None and header_request_id != request.request_id:
        return Rejection(
            code="INVALID_REQUEST",
            request_id=request.request_id,
            message="Nats-Msg-Id must equal request_id",
        )
    checked = verify_token(
        request.token,
        tenant=subject_tenant,
        keys=keys,
        audience=audience,
        request_id=request.request_id,
        leeway_s=leeway_s,
        max_ttl_s=max_ttl_s,
        now=now,
    )
    if isinstance(checked, Rejection):
        return checked
    principal, roles = checked
    return Verified(
        request=request,
        tenant=subject_tenant,
        principal=principal,
        run_id=run_id_for(subject_tenant, request.request_id),
        roles=frozenset(roles),
    )


def verify_token(
    token: str,
    *,
    tenant: str,
    keys: dict[str, TenantKey],
    audience: str,
    request_id: str,
    leeway_s: float = LEEWAY_S,
    max_ttl_s: float = MAX_TOKEN_TTL_S,
    now: float | None = None,
) -> tuple[str, list[str]] | Rejection:
    """Check a host token for `tenant` (both doors): its (principal, roles), or why not.

    `exp`, `nbf` and `iat` must be NumericDates (JSON numbers, RFC 7519 §2; a numeric string is
    refused), and the token may live at most `max_ttl_s` (from `iat`, and from now); clocks may
    differ by `leeway_s`.
    """
    if _TENANT.fullmatch(tenant) is None:
        return Rejection(
            code="UNKNOWN_TENANT",
            request_id=request_id,
            message="the request names no valid tenant",
        )
    key = keys.get(tenant)
    if key is None:
        return Rejection(
            code="UNKNOWN_TENANT",
            request_id=request_id,
            message=f"no issuer is configured for tenant {tenant!r}",
        )
    try:
        claims = jwt.decode(
            token,
            key.public_key,
            algorithms=["EdDSA"],
            audience=audience,
            issuer=key.issuer,
            leeway=leeway_s,
            options={"require": ["exp", "iss", "aud", "sub", "tenant", "jti"]},
        )
    except jwt.ExpiredSignatureError:
        return Rejection(
            code="TOKEN_EXPIRED", message="the token has expired", request_id=request_id
        )
    except jwt.InvalidSignatureError:
        return Rejection(
            code="BAD_SIGNATURE",
            request_id=request_id,
            message="the token's signature does not verify with the tenant's key",
        )
    except jwt.InvalidTokenError as exc:
        return Rejection(
            code="INVALID_TOKEN", message=f"invalid token: {exc}"[:500], request_id=request_id
        )
    wrong = next((c for c in _DATES if c in claims and not _numeric_date(claims[c])), None)
    if wrong is not None:
        return Rejection(
            code="INVALID_TOKEN",
            request_id=request_id,
            message=f"the token's {wrong} is not a NumericDate (a JSON number)",
        )
    clock = time.time() if now is None else now
    lifetime = max(claims["exp"] - clock, claims["exp"] - claims.get("iat", claims["exp"]))
    if lifetime > max_ttl_s + leeway_s:
        return Rejection(
            code="INVALID_TOKEN",
            request_id=request_id,
            message=f"the token lives {lifetime:.0f} s; at most {max_ttl_s:.0f} s is accepted",
        )
    if claims["tenant"] != tenant:
        return Rejection(
            code="WRONG_TENANT",
            request_id=request_id,
            message="the token was issued for another tenant",
        )
    principal = claims["sub"]
    if not isinstance(principal, str) or _PRINCIPAL.fullmatch(principal) is None:
        return Rejection(
            code="INVALID_TOKEN",
            message="the token's subject is not a principal id",
            request_id=request_id,
        )
    if key.principals == "email":
        principal = principal.casefold()
    roles = claims.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        return Rejection(
            code="INVALID_TOKEN",
            message="the token's roles are not a list of names",
            request_id=request_id,
        )
    return principal, roles


def token_tenant(token: str) -> str:
    """The tenant a token claims, unverified: only to pick the key that then verifies it
    (an HTTP request names its tenant nowhere else). "" when the token cannot be read."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return ""
    tenant = claims.get("tenant") if isinstance(claims, dict) else None
    return tenant if isinstance(tenant, str) else ""


def _numeric_date(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def authorize(outcome: Verified | Rejection, kind: str) -> Verified | Rejection:
    """Refuse (`FORBIDDEN`) a verified answer of an approver kind whose token lacks the role."""
    if (
        isinstance(outcome, Verified)
        and kind in APPROVER_KINDS
        and APPROVER_ROLE not in outcome.roles
    ):
        return Rejection(
            code="FORBIDDEN",
            request_id=outcome.request.request_id,
            message=f"answering {kind} needs the {APPROVER_ROLE} role",
        )
    return outcome


def review_target(pending_id: str) -> tuple[str, int] | None:
    """The (run id, step) a review's pending id names, or None if it names no review."""
    match = _REVIEW_ID.fullmatch(pending_id)
    if match is None or int(match[2]) > 1000:
        return None
    return match[1], int(match[2])


def review_verdict(
    error_code: str | None,
    description: str = "",
    *,
    answer: str = "approve",
    run_status: str | None = None,
) -> tuple[bool, str] | None:
    """What the planner's reply to a `ReviewAnswer` means for the approver: (accepted,
    message), or None when the planner failed and the answer must be retried.

    No error: the run took the answer (`run_status` is where it stands now). 404: no such
    review waits for this tenant. 400: the planner cannot read the answer, and will not the
    next time either.
    """
    if error_code is None:
        done = "approved" if answer == "approve" else "rejected"
        return True, f"{done}; the run is {run_status or 'resumed'}"
    if error_code == "404":
        return False, NO_REVIEW
    if error_code == "400":
        return False, f"the planner refused the answer: {description}"[:512]
    return None


class _Named(msgspec.Struct):
    """The one field of an agent's manifest ingress reads (the planner checks the rest)."""

    name: str


def declared_agents(folder: Path) -> frozenset[str]:
    """The names the agents' manifests in `folder` declare (`<name>.json`)."""
    names = set()
    for path in sorted(folder.glob("*.json")):
        try:
            names.add(msgspec.json.decode(path.read_bytes(), type=_Named).name)
        except (OSError, msgspec.DecodeError) as exc:
            raise ConfigError(f"cannot read agent manifest {path}: {exc}") from exc
    return frozenset(names)
