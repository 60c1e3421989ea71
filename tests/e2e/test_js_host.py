"""A host written in JavaScript from the AsyncAPI document alone (`nats` and `jose` from npm,
pinned in tests/fixtures/js-host), on its tenant's own NATS user and inbox prefix: a run to its
result, a replay that is a duplicate, `wait` for news, a command conflict, the refusal codes
(malformed JSON included), and no subscription to `writ.int.>`, as the document says. It is
configured from the tenant's credentials folder (`.writ/hosts/<tenant>/`) alone: exactly what
a host is given."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.e2e.hostcreds import read_credentials
from writ.stack import AUDIENCE, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HOST = Path(__file__).parents[1] / "fixtures" / "js-host"


def test_a_javascript_host_holds_writ_to_its_asyncapi_contract(
    stack: Stack, tmp_path: Path
) -> None:
    node = shutil.which("node")
    assert node is not None, "node is needed (make js-fixtures installs the host's packages)"
    if not (HOST / "node_modules" / ".package-lock.json").exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--prefix", str(HOST)], check=True, timeout=300
        )
    given = read_credentials(stack.host_credentials("acme"), "acme")
    # The server's address, and the host's own user and password from the URL it was given
    # (nats.js takes them as options): never the administrator's.
    address = urlsplit(given.nats_url)
    assert address.hostname is not None
    login = (
        {"user": unquote(address.username), "password": unquote(address.password or "")}
        if address.username
        else {}
    )

    config = tmp_path / "host.json"
    config.write_text(
        json.dumps(
            {
                "natsUrl": f"nats://{address.hostname}:{address.port}",
                **login,
                "inboxPrefix": given.inbox,
                "tenant": "acme",
                "issuer": given.issuer,
                "audience": AUDIENCE,
                "signingKey": str(given.folder / "signing.pem"),
            }
        )
    )
    ran = subprocess.run(
        [node, str(HOST / "host.mjs"), str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HOST,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["run"] == {
        "duplicate": False,
        "status": "succeeded",
        "version": seen["run"]["version"],
        "final": "succeeded",
    }
    assert seen["run"]["version"] >= 1
    assert seen["replay"] == {"duplicate": True}
    assert "PERMISSIONS_VIOLATION" in seen["internal"].upper().replace(" ", "_"), seen
    assert (seen["wait"]["status"], seen["wait"]["version"]) == (
        "succeeded",
        seen["run"]["version"],
    )
    assert seen["wait"]["quiet"]["error"] == "504"
    assert seen["wait"]["quiet"]["said"].startswith("TIMEOUT: no result newer than version")
    assert seen["command"] == "succeeded"
    assert seen["conflict"] == "conflict"
    assert seen["malformed"] == ["rejected", "INVALID_REQUEST"]
    assert seen["refusals"] == {
        "BAD_SIGNATURE": ["rejected", "BAD_SIGNATURE"],
        "TOKEN_EXPIRED": ["rejected", "TOKEN_EXPIRED"],
        "INVALID_REQUEST": ["rejected", "INVALID_REQUEST"],
        "UNKNOWN_AGENT": ["rejected", "UNKNOWN_AGENT"],
    }
