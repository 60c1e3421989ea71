"""Check a host's own endpoint that claims an idempotency contract, before trusting it: every
trial sends one write, then sends it again under the same key (what Writ does after a lost
response or a killed dispatcher), and compares what the two answers say was done."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

__all__ = ["EndpointReport", "probe_endpoint"]

MAX_CREDENTIAL_BYTES: Final = 8192
MAX_BODY_BYTES: Final = 64 * 1024
MAX_TRIALS: Final = 10_000


@dataclass
class EndpointReport:
    """What the endpoint did with each repeated key."""

    url: str
    trials: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # one detail per verdict

    @property
    def conforms(self) -> bool:
        return self.trials > 0 and set(self.verdicts) == {"replayed"}


def read_credential(path: Path) -> str:
    data = path.read_bytes()
    if len(data) > MAX_CREDENTIAL_BYTES:
        raise ValueError(f"{path}: a credential longer than {MAX_CREDENTIAL_BYTES} bytes")
    secret = data.decode().strip()
    if not secret or any(c.isspace() for c in secret):
        raise ValueError(f"{path}: the credential must be one token without spaces")
    return secret


def _identity(response: httpx.Response, id_field: str | None) -> Any:
    body = response.json()
    if id_field is None:
        return body
    if not isinstance(body, dict) or id_field not in body:
        raise ValueError(f"the answer has no {id_field!r}")
    return body[id_field]


def _verdict(first: httpx.Response, second: httpx.Response, id_field: str | None) -> str:
    if not first.is_success:
        return "refused"
    if not second.is_success:
        return "retry refused"  # the caller cannot learn what its first request did
    try:
        same = _identity(first, id_field) == _identity(second, id_field)
    except (ValueError, json.JSONDecodeError):
        return "unreadable"
    return "replayed" if same else "double-applied"


def probe_endpoint(
    url: str,
    credential: str,
    body_template: str,
    *,
    trials: int,
    id_field: str | None = None,
    key_header: str = "Idempotency-Key",
    timeout_s: float = 10.0,
) -> EndpointReport:
    """`trials` writes, each sent twice under one fresh key; `{trial}` in the body template
    is replaced by the trial's number so that no two trials send the same request."""
    if not 0 < trials <= MAX_TRIALS:
        raise ValueError(f"trials must be 1..{MAX_TRIALS}")
    if len(body_template.encode()) > MAX_BODY_BYTES:
        raise ValueError(f"a body longer than {MAX_BODY_BYTES} bytes")
    report = EndpointReport(url)
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
        for trial in range(trials):
            content = body_template.replace("{trial}", str(trial)).encode()
            key = {key_header: f"writ-conformance-{uuid.uuid4().hex}"}
            first = client.post(url, content=content, headers={**headers, **key})
            second = client.post(url, content=content, headers={**headers, **key})
            verdict = _verdict(first, second, id_field)
            report.trials += 1
            report.verdicts[verdict] += 1
            report.examples.setdefault(
                verdict, f"{first.status_code} then {second.status_code}: {second.text[:200]}"
            )
    return report
