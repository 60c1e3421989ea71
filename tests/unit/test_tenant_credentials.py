"""A tenant's host credentials folder (writ/tenants.py): each file its owner's alone from the
moment it exists, rewritten whole, a signing key kept unless replaced, removed with the
folder; a tenant name, key or principals that cannot be registered is refused before anything
is written."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from writ.tenants import (
    HOST_FILES,
    TenantError,
    add_tenant,
    host_dir,
    registered,
    remove_host_credentials,
    remove_tenant,
    validate,
    write_host_credentials,
)


def _write(home: Path, *, signing_pem: bytes | None = None, url: str = "nats://h:p@x:1") -> Path:
    return write_host_credentials(
        home,
        "initech",
        nats_url=url,
        inbox="_INBOX.host-initech",
        api_url="http://127.0.0.1:9/api/v1",
        issuer="https://initech.example/host",
        signing_pem=signing_pem,
    )


def test_credentials_are_the_owners_alone_and_rewritten_whole(tmp_path: Path) -> None:
    folder = _write(tmp_path, signing_pem=b"KEY")
    assert folder == host_dir(tmp_path, "initech")
    assert stat.S_IMODE((tmp_path / "hosts").stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == sorted(HOST_FILES)
    for name in HOST_FILES:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert (folder / "nats.url").read_text() == "nats://h:p@x:1\n"
    # Rewritten: the new values, the signing key kept when none is given.
    _write(tmp_path, url="nats://h:q@x:1")
    assert (folder / "nats.url").read_text() == "nats://h:q@x:1\n"
    assert (folder / "signing.pem").read_bytes() == b"KEY"
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    remove_host_credentials(tmp_path, "initech")
    assert not folder.exists()


def _public_pem() -> str:
    return (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def test_the_registry_is_the_deployments_list_of_tenants(tmp_path: Path) -> None:
    assert registered(tmp_path) == []
    add_tenant(tmp_path, "initech", _public_pem())
    add_tenant(tmp_path, "acme", _public_pem(), principals="email")
    assert registered(tmp_path) == ["acme", "initech"]
    remove_tenant(tmp_path, "initech")
    assert registered(tmp_path) == ["acme"]
    with pytest.raises(TenantError):
        remove_tenant(tmp_path, "initech")


@pytest.mark.parametrize(
    ("tenant", "key", "principals", "says"),
    [
        ("Bad_Name", None, "exact", "not a tenant name"),
        ("initech", "not a key", "exact", "not a PEM public key"),
        ("initech", None, "anyone", "principals are"),
    ],
)
def test_what_cannot_be_registered_is_refused(
    tenant: str, key: str | None, principals: str, says: str
) -> None:
    with pytest.raises(TenantError, match=says):
        validate(tenant, key or _public_pem(), principals=principals)
