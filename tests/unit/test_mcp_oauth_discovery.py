"""Where the MCP authorization spec's metadata documents are looked for (RFC 9728 §3.1 and
RFC 8414 §3: the well-known name inserted before the URL's path, then at the root)."""

from __future__ import annotations

from services.retrieval.mcp.oauth import well_known


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
