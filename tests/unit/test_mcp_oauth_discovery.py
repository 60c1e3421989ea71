"""Where the MCP authorization spec's metadata documents are looked for (RFC 9728 §3.1 and
RFC 8414 §3: the well-known name inserted before the URL's path, then at the root; or the URL a
401's `WWW-Authenticate` names, §5.1), and the origins discovery may follow."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from services.retrieval.mcp import ServerConfig
from services.retrieval.mcp.oauth import (
    McpTokenError,
    _followed,
    named_metadata,
    origin,
    well_known,
)
from writ.cli import main
from writ.mcp import servers_file


def test_metadata_is_looked_for_with_the_path_inserted_then_at_the_root() -> None:
    assert well_known("https://host.example/mcp", "oauth-protected-resource") == [
        "https://host.example/.well-known/oauth-protected-resource/mcp",
        "https://host.example/.well-known/oauth-protected-resource",
    ]
    assert well_known("https://as.example:8443/tenant/a/", "oauth-authorization-server") == [
        "https://as.example:8443/.well-known/oauth-authorization-server/tenant/a",
        "https://as.example:8443/.well-known/oauth-authorization-server",
    ]
    assert well_known("https://as.example", "oauth-authorization-server") == [
        "https://as.example/.well-known/oauth-authorization-server"
    ]


@pytest.mark.parametrize(
    ("challenge", "named"),
    [
        (
            'Bearer error="invalid_token", resource_metadata="https://h.example/m/x"',
            "https://h.example/m/x",
        ),
        ('Bearer resource_metadata="https://h.example/m"', "https://h.example/m"),
        ("Bearer resource_metadata=https://h.example/m, scope=read", "https://h.example/m"),
        ('Bearer Resource_Metadata = "https://h.example/m"', "https://h.example/m"),
        ('Basic realm="x", Bearer resource_metadata="https://h.example/m"', "https://h.example/m"),
        ('Bearer resource_metadata="https://h.example/a\\"b"', 'https://h.example/a"b'),
        ('Bearer error="invalid_token"', None),
        ('Bearer xresource_metadata="https://h.example/m"', None),
        ('Bearer resource_metadata="/relative"', None),
        ('Bearer resource_metadata="file:///etc/passwd"', None),
        ('Bearer resource_metadata="https://h.example/a b"', None),
        ('Bearer resource_metadata="https://h.example/' + "a" * 5000 + '"', None),
        ("", None),
    ],
)
def test_the_metadata_url_a_401_names_is_read_from_its_challenge(
    challenge: str, named: str | None
) -> None:
    assert named_metadata(challenge) == named


@pytest.mark.parametrize(
    ("url", "at"),
    [
        ("https://H.example/mcp", "https://h.example:443"),
        ("https://h.example:443/x", "https://h.example:443"),
        ("http://127.0.0.1:8080/mcp?x=1", "http://127.0.0.1:8080"),
        ("http://[::1]:9/m", "http://[::1]:9"),
        ("https://user@h.example/", None),
        ("ftp://h.example/", None),
        ("https:///path", None),
        ("https://h.example:99999/", None),
    ],
)
def test_an_origin_is_scheme_host_and_port(url: str, at: str | None) -> None:
    assert origin(url) == at


def test_other_origins_are_for_client_credentials_and_are_origins_only(tmp_path: Path) -> None:
    base = {"url": "https://h.example/mcp", "credential_file": str(tmp_path / "c")}
    config = msgspec.convert(
        {**base, "auth": "client_credentials", "auth_origins": ["https://auth.example:8443"]},
        ServerConfig,
    )
    assert config.auth_origins == ["https://auth.example:8443"]
    with pytest.raises(msgspec.ValidationError, match="auth_origins are for client_credentials"):
        msgspec.convert({**base, "auth_origins": ["https://auth.example"]}, ServerConfig)
    for bad in (
        "https://auth.example/path",
        "https://u@auth.example",
        "auth.example",
        "https://a\n",
    ):
        with pytest.raises(msgspec.ValidationError, match="auth_origins"):
            msgspec.convert(
                {**base, "auth": "client_credentials", "auth_origins": [bad]}, ServerConfig
            )


def test_writ_mcp_add_registers_other_origins_and_refuses_them_for_a_bearer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    creds = tmp_path / "client.json"
    creds.write_text("{}")

    def add(tenant: str) -> list[str]:
        return ["mcp", "--home", str(tmp_path), "--tenant", tenant, "add", "helpdesk", "--url"]

    server = ["https://h.example/mcp", "--credential-file", str(creds), "--tool", "ticket.get"]
    origins = ["--auth-origin", "https://auth.example", "--auth-origin", "https://sso.example:8443"]
    with pytest.raises(SystemExit) as done:
        main([*add("acme"), *server, "--auth", "client_credentials", *origins])
    assert done.value.code == 0
    saved = json.loads(servers_file(tmp_path).read_text())["acme"]["helpdesk"]
    assert saved["auth_origins"] == ["https://auth.example", "https://sso.example:8443"]
    with pytest.raises(SystemExit) as done:
        main([*add("globex"), *server, *origins])
    assert done.value.code == 2
    assert "auth_origins are for client_credentials" in capsys.readouterr().out
    assert "globex" not in json.loads(servers_file(tmp_path).read_text())


def test_discovery_follows_only_the_servers_origin_or_named_ones_and_never_downgrades(
    tmp_path: Path,
) -> None:
    server = msgspec.convert(
        {
            "url": "https://h.example/mcp",
            "credential_file": str(tmp_path / "c"),
            "auth": "client_credentials",
            "auth_origins": ["https://auth.example", "http://plain.example"],
        },
        ServerConfig,
    )
    for url in ("https://h.example/m", "https://H.example:443/m", "https://auth.example:443/t"):
        assert _followed(url, server, "it") == url
    for url in (
        "https://h.example:8443/m",
        "https://h.example.evil/m",
        "https://evil.example/h.example",
        "https://auth.example@evil.example/",
        "http://h.example/m",
        "http://plain.example/m",
        "/relative",
    ):
        with pytest.raises(McpTokenError) as refused:
            _followed(url, server, "it")
        assert refused.value.refused
