"""Retrieval's MCP client: the governed `mcp:<server>/<tool>` reads (docs/design.md §11).

Retrieval is the only service that talks to a host's MCP server and the only one given its
credential (a secret file named by the operator's registration). `servers.py` is the operator's
registration, `client.py` the SDK session, `digest.py` what a listing is hashed into, and
`reads.py` the path every call takes.
"""

from services.retrieval.mcp.client import McpClient, McpCredentialRefused, McpUnavailable
from services.retrieval.mcp.digest import listing_digest, tool_digest
from services.retrieval.mcp.reads import McpReads
from services.retrieval.mcp.servers import ServerConfig, ServerRegistry

__all__ = [
    "McpClient",
    "McpCredentialRefused",
    "McpReads",
    "McpUnavailable",
    "ServerConfig",
    "ServerRegistry",
    "listing_digest",
    "tool_digest",
]
