"""A host credentials folder read into `HostCredentials`: the NATS login split from its URL,
the inbox prefix the host's replies must use, and no secret in a repr."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from writ_client import HostCredentials, InvalidRequest, NatsLogin


def _folder(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "acme"
    folder.mkdir()
    key = Ed25519PrivateKey.generate()
    (folder / "signing.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (folder / "issuer").write_text("https://acme.example/host\n")
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def test_a_folder_gives_the_issuer_and_both_doors(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        api_url="http://127.0.0.1:8080/api/v1\n",
        nats_url="nats://host-acme:s3cr%40t@127.0.0.1:4222\n",
        nats_inbox="_INBOX.host-acme\n",
    )
    credentials = HostCredentials.from_dir(folder)
    assert credentials.tenant == "acme" and credentials.api_url == "http://127.0.0.1:8080/api/v1"
    assert credentials.nats == NatsLogin(
        url="nats://127.0.0.1:4222",
        user="host-acme",
        password="s3cr@t",
        inbox_prefix="_INBOX.host-acme",
    )
    claims = jwt.decode(
        credentials.issuer.token("alice@acme.example"), options={"verify_signature": False}
    )
    assert (claims["tenant"], claims["iss"], claims["sub"]) == (
        "acme",
        "https://acme.example/host",
        "alice@acme.example",
    )
    assert "s3cr" not in repr(credentials) and "PRIVATE" not in repr(credentials)


def test_a_named_user_replies_under_its_own_inbox_unless_told(tmp_path: Path) -> None:
    assert NatsLogin.parse("nats://host-acme:pw@h:4222").inbox_prefix == "_INBOX.host-acme"
    assert NatsLogin.parse("nats://h:4222", user="u").inbox_prefix == "_INBOX.u"
    assert NatsLogin.parse("nats://h:4222").inbox_prefix is None
    assert NatsLogin.parse("nats://a:b@h:4222", inbox_prefix="_X").inbox_prefix == "_X"
    creds = NatsLogin.parse("tls://h:4222", creds=tmp_path / "host.creds")
    assert (creds.url, creds.creds, creds.user) == ("tls://h:4222", tmp_path / "host.creds", None)


def test_a_folder_without_a_key_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "signing.pem").unlink()
    with pytest.raises(InvalidRequest, match="signing.pem"):
        HostCredentials.from_dir(folder)
