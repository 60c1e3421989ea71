"""What ingress makes of the operators' key file the chart mounts from an optional Secret: the
public half lets operators in, no file lets nobody in, and the signing half (or anything else)
stops ingress with a message saying what belongs there."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from libs.errors import ConfigError
from services.ingress.__main__ import operators_key
from services.ingress.console._operators import mint_operator_token

_SIGNING = Ed25519PrivateKey.generate()
_PRIVATE = _SIGNING.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
_PUBLIC = _SIGNING.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)


def test_the_public_half_lets_an_operator_in(tmp_path: Path) -> None:
    (tmp_path / "operators-key.pem").write_bytes(_PUBLIC)
    key = operators_key(str(tmp_path / "operators-key.pem"))
    assert key is not None
    token = mint_operator_token(_PRIVATE, tenant="acme", principal="ops@acme.example")
    assert key.verify(token)[:2] == ("acme", "ops@acme.example")


def test_no_file_where_the_optional_secret_would_be_lets_nobody_in(tmp_path: Path) -> None:
    assert operators_key(str(tmp_path / "operators-key.pem")) is None
    assert operators_key("") is None


@pytest.mark.parametrize(
    "content",
    [_PRIVATE, b"not a key\n", b""],
    ids=["the private half", "not a key", "empty"],  # the same ids on every worker
)
def test_anything_but_the_public_half_stops_ingress(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "operators-key.pem").write_bytes(content)
    with pytest.raises(ConfigError, match="not the operators' public key"):
        operators_key(str(tmp_path / "operators-key.pem"))
