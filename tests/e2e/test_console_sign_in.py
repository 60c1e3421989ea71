"""The console's sign-in link against the real deployment: its token opens one session, at the
sign-in route only, once, within minutes of being made; as a bearer it is refused by the API
and by the console, before and after it was used, while the session it opened works (the
console reads the API with it, and its pages show what the API holds)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from services.ingress.logic import SIGN_IN_WINDOW_S
from tests.e2e.conftest import Host
from tests.e2e.test_proposals import _propose_refund
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def _token(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


def _bearer_refused(stack: Stack, token: str) -> list[tuple[str, int]]:
    """Where the token, as `Authorization: Bearer`, was not refused with 401."""
    base = stack.api_url.removesuffix("/api/v1")
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=40) as client:
        answers = {
            "/api/v1/pending-decisions": client.get("/api/v1/pending-decisions", headers=bearer),
            "/api/v1/proposals": client.get("/api/v1/proposals", headers=bearer),
            "/api/v1/audit/verify": client.get("/api/v1/audit/verify", headers=bearer),
            "/api/v1/runs (POST)": client.post(
                "/api/v1/runs",
                json={"agent": "crm-assistant", "input": "Note the call"},
                headers={**bearer, "Idempotency-Key": "sign-in-token-as-bearer"},
            ),
            "/console/": client.get("/console/", headers=bearer),
            "/console/runs/x1": client.get("/console/runs/x1", headers=bearer),
            # A proof nobody but the console's own process can make, guessed.
            "/api/v1/proposals (a guessed proof)": client.get(
                "/api/v1/proposals", headers={**bearer, "Writ-Console-Proof": "0" * 64}
            ),
        }
    return [(where, a.status_code) for where, a in answers.items() if a.status_code != 401]


async def test_a_sign_in_token_signs_in_once_and_is_refused_as_a_bearer_everywhere(
    stack: Stack, host: Host, payments: httpx.Client
) -> None:
    _, waiting = await _propose_refund(host, payments)
    assert waiting.proposal is not None
    link = stack.console_link()
    token = _token(link)
    assert _bearer_refused(stack, token) == []

    with httpx.Client(timeout=40) as browser:
        signed_in = browser.get(link)
        assert signed_in.status_code == 303, signed_in.text
        assert signed_in.headers["location"] == "/console/"
        assert browser.cookies.get("writ_console")
        # The session works: its inbox lists the proposal, read from the API as the viewer.
        inbox = browser.get(link.split("/console/")[0] + "/console/")
        assert inbox.status_code == 200, inbox.text
        assert waiting.proposal.proposal_id in inbox.text
        assert "INVALID_TOKEN" not in inbox.text and "UNAUTHENTICATED" not in inbox.text

        # The same link again, in the same browser or another: refused, no new session.
        again = browser.get(link)
        assert again.status_code == 401 and "used already" in again.text
    with httpx.Client(timeout=40) as other:
        assert other.get(link).status_code == 401
        assert "writ_console" not in other.cookies
    # And the used token is still no bearer anywhere.
    assert _bearer_refused(stack, token) == []


async def test_an_expired_link_is_refused(stack: Stack) -> None:
    made = datetime.now(UTC) - timedelta(seconds=SIGN_IN_WINDOW_S + 60)
    with httpx.Client(timeout=40) as browser:
        late = browser.get(stack.console_link(now=made))
        assert late.status_code == 401 and "expired" in late.text
        assert "set-cookie" not in late.headers
        gone = browser.get(
            stack.console_link(now=datetime.now(UTC) - timedelta(seconds=120), ttl_s=60)
        )
        assert gone.status_code == 401 and "TOKEN_EXPIRED" in gone.text
        # An ordinary API token is no sign-in link either.
        api_token = stack.token("acme", "ops@acme.example", roles=["approver"])
        base = stack.api_url.removesuffix("/api/v1")
        refused = browser.get(f"{base}/console/sign-in", params={"token": api_token})
        assert refused.status_code == 401 and "INVALID_TOKEN" in refused.text
        assert not browser.cookies
