"""Verifying a host's request: pure functions, no I/O."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import jwt
import msgspec

from libs.errors import ConfigError
from schemas.base import storable, unstorable_at
from schemas.control import CancelRun
from schemas.host import ApproveProposal, HumanDecision, ReviewDecision, RunRequest, SubmitCommand

__all__ = [
    "declared_agents",
    "APPROVAL_DECODER",
    "APPROVER_KINDS",
    "APPROVER_ROLE",
    "AUDITOR_ROLE",
    "LEEWAY_S",
    "MAX_JSON_DEPTH",
    "SIGN_IN_WINDOW_S",
    "MAX_TOKEN_TTL_S",
    "NO_TENANT",
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
    "console_audience",
    "console_proof",
    "hostile_json",
    "review_target",
    "review_verdict",
    "run_id_for",
    "token_tenant",
    "too_deep_at",
    "unstorable_parameter",
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
DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
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
# Said alike by both doors of a token without a `tenant` claim.
NO_TENANT: Final = "invalid token: it names no tenant (claim `tenant`)"
# The deepest a host's JSON may nest (every contract needs a handful of levels): deeper input
# is refused before a recursive decoder sees it.
MAX_JSON_DEPTH: Final = 32
# A JSON string (escapes included) or one of the punctuation marks that shape nesting.
_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")
_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))
_INNERMOST: Final = re.compile(rb"\[\]|\{\}")
_JSON_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:,]', re.DOTALL)
# How long after it was issued (`iat`) a console sign-in link may still be used: a link that
# lies in a log or a mailbox stops opening sessions within minutes.
SIGN_IN_WINDOW_S: Final = 600.0
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
    # False when no answer can be addressed safely: the message names two request ids (its
    # Nats-Msg-Id and its body's), and either may have a result already that an answer here
    # would contradict.
    answerable: bool = True


def console_audience(audience: str) -> str:
    """The audience of a console sign-in token: never the API's, so the API's bearer path
    (which checks `audience`) refuses such a token, and only the sign-in route takes it."""
    return f"{audience}/console-sign-in"


def console_proof(key: bytes, token: str) -> str:
    """What the console sends beside a session's sign-in token when it calls its own API
    (`Writ-Console-Proof`): an HMAC under a key only that ingress process holds. Without it
    the API takes no sign-in token."""
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


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
    deep = too_deep_at(body)
    if deep is not None:
        return Rejection(
            code="INVALID_REQUEST",
            message=f"`{deep}` nests deeper than {MAX_JSON_DEPTH} levels",
            request_id=storable(fallback_id),
        )
    try:
        request = decoder.decode(body)
        # msgspec checks a tag that is there; the host contract requires it there.
        tagged = _TAG_DECODER.decode(body).type is not None
    except msgspec.DecodeError as exc:
        return Rejection(
            code="INVALID_REQUEST",
            message=storable((hostile_json(body) or str(exc))[:500]),
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
            answerable=False,
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
    except jwt.InvalidAudienceError:
        # The library's words ("Audience doesn't match") leave a host to guess the right one.
        return Rejection(
            code="INVALID_TOKEN",
            request_id=request_id,
            message=f"the token's `aud` must be {audience!r}",
        )
    except jwt.InvalidIssuerError:
        return Rejection(
            code="INVALID_TOKEN",
            request_id=request_id,
            message=f"the token's `iss` is not the issuer registered for tenant {tenant!r}",
        )
    except jwt.MissingRequiredClaimError as exc:
        return Rejection(
            code="INVALID_TOKEN",
            request_id=request_id,
            message=NO_TENANT
            if exc.claim == "tenant"
            else f"invalid token: it has no `{exc.claim}` claim",
        )
    except jwt.ImmatureSignatureError:
        return Rejection(
            code="INVALID_TOKEN",
            request_id=request_id,
            message="the token is not valid yet (its `nbf` or `iat` is in the future)",
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


def too_deep_at(body: bytes, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The path (`$.arguments.a[0]`) of the first value of the JSON text `body` that opens a
    container more than `limit` levels deep, or None (also for what is not JSON at all)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return None  # the common case, at C speed
    # At C speed still: the brackets outside strings, innermost pairs removed `limit` times.
    # Anything left is nesting past the bound (or brackets that do not pair: the walk says).
    shape = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        shape = _INNERMOST.sub(b"", shape)
        if not shape:
            return None
    # Per open container: whether it is an object, and the key or index of its current value.
    frames: list[list[Any]] = []
    key: str = ""
    for match in _JSON_TOKEN.finditer(body):
        token = match.group()
        if token[:1] == b'"':
            if frames and frames[-1][0]:
                key = token[1:-1].decode("utf-8", "replace")[:64]
        elif token == b":":
            if frames and frames[-1][0]:
                frames[-1][1] = f".{key}"
        elif token == b",":
            if frames and not frames[-1][0]:
                frames[-1][1] += 1
        elif token in (b"{", b"["):
            if len(frames) >= limit:
                return "$" + "".join(
                    f"[{label}]" if isinstance(label, int) else label for _, label in frames[:8]
                )
            frames.append([token == b"{", "" if token == b"{" else 0])
        elif frames:
            frames.pop()
    return None


def hostile_json(body: bytes, *, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why the JSON text `body` cannot be taken, naming the field: nesting deeper than `limit`,
    or U+0000, a lone surrogate or bytes that are not UTF-8 in a key or a string. None when it
    has none of these (it may still be invalid JSON: its decoder says so)."""
    deep = too_deep_at(body, limit)
    if deep is not None:
        return f"`{deep}` nests deeper than {limit} levels"
    try:
        # Bytes that are not UTF-8 become lone surrogates, found below with their field.
        value = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None
    where = unstorable_at(value)
    if where is None:
        return None
    return f"`{where}` holds U+0000, a lone surrogate or bytes that are not UTF-8"


def unstorable_parameter(path: Mapping[str, Any], query: Iterable[tuple[str, str]]) -> str | None:
    """Why a path id or a query parameter cannot be taken, naming it, or None: text that
    PostgreSQL cannot store (U+0000, a lone surrogate), refused as it is in a body."""
    for name, value in path.items():
        if isinstance(value, str) and _UNSTORABLE.search(value):
            return f"the path's `{name}` holds U+0000 or a lone surrogate"
    for name, value in query:
        if _UNSTORABLE.search(name) or _UNSTORABLE.search(value):
            return f"the query parameter `{storable(name[:64])}` holds U+0000 or a lone surrogate"
    return None


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
