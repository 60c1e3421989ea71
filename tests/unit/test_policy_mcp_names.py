"""An org policy's `refused_tools` naming an MCP tool or server is spelt as `decide` parses it
(`mcp:<server>/<tool>`, `mcp:<server>/*`): one that names nothing would refuse nothing while
reading as if it did, so it is not signed, and a file holding it is refused (every sensitive
call of the tenant denied, the refusal saying why)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from services.governance.policy import load_policy
from writ.cli import main

NAMING_NOTHING = ["mcp:Helpdesk/*", "mcp:helpdesk", "mcp:helpdesk/", "mcp:cr*", "mcp:*/*"]


def _signed(path: Path, key: Ed25519PrivateKey, refused: list[str]) -> Path:
    body = {"tenant": "acme", "version": "v1", "refused_tools": refused}
    value = base64.b64encode(key.sign(rfc8785.dumps(body))).decode()
    path.write_text(json.dumps({"policy": body, "signature": {"key_id": "k1", "value": value}}))
    return path


@pytest.mark.parametrize("name", NAMING_NOTHING)
def test_a_policy_naming_no_mcp_tool_is_refused(tmp_path: Path, name: str) -> None:
    key = Ed25519PrivateKey.generate()
    path = _signed(tmp_path / "policy.json", key, ["crm.note.create", name])
    policy = load_policy(path, "acme", {"k1": key.public_key()})
    assert policy.status == "refused", policy
    assert policy.refusal is not None and "which is no MCP tool" in policy.refusal


def test_a_policy_naming_a_server_or_a_tool_is_taken(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    named = ["mcp:helpdesk/*", "mcp:helpdesk/ticket.get", "crm.note.create"]
    policy = load_policy(_signed(tmp_path / "p.json", key, named), "acme", {"k1": key.public_key()})
    assert policy.status != "refused" and policy.refused_tools == tuple(named), policy


def test_writ_policy_sign_refuses_it_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "key.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    document = tmp_path / "policy.json"
    document.write_text(
        json.dumps({"tenant": "acme", "version": "v1", "refused_tools": ["mcp:cr*"]})
    )
    output = tmp_path / "signed.json"
    argv = ["policy", "sign", str(document), "--key", str(key), "--key-id", "k1"]
    with pytest.raises(SystemExit, match="not a valid policy, nothing signed: .*which is no MCP"):
        main([*argv, "--output", str(output)])
    assert not output.exists()
