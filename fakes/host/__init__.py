"""A simulated host product (a helpdesk) that federates with Writ, as scenario C describes.

One loopback HTTP server, three faces:

- `/mcp`: the host's own MCP server over Streamable HTTP (the official `mcp` SDK's low-level
  `Server`), or, with `legacy_sse` (`--legacy-sse`), over the legacy HTTP+SSE transport only,
  as a server from before Streamable HTTP would be (`GET /mcp` opens the event stream,
  messages are POSTed to `/mcp/messages/`, `POST /mcp` is 405); bearer token required:
  read tools `tickets.search`, `ticket.get`, `customer.get`, each with an input and an
  output schema. Their annotations say `readOnlyHint`, as a real server's would; Writ treats
  them as hints and never decides on them.
  A tool it serves but never lists (`tickets.export`) answers anyone who calls it anyway: a
  client that calls what it was never shown is caught by `calls`.
- `/api/v1`: its REST API for writes, another bearer token: `POST /tickets/{id}/comments` and
  `PATCH /tickets/{id}` with `If-Match` revisions and `Idempotency-Key` (same key and body: the
  first answer again; same key, another body: 422), described by `GET /api/v1/openapi.json`.
- `/oauth/token`: its authorization server's token endpoint, for the OAuth 2.0 client
  credentials grant (RFC 6749 §4.4; `client_secret_basic` or `_post`) when `oauth_clients`
  (`--oauth-clients-file`, `{"<client id>": "<secret>"}`) are set: the access tokens it issues
  (an hour) are taken by `/mcp` beside the static MCP token; `/_control/revoke_tokens` revokes
  every one.
- `/_control`: the switches, as the other fakes have them: a mode per face (`fail` answers 503,
  `slow` waits `delay_s`, `lose_response` applies a write and never answers), a "rug pull"
  (a tool's description, input schema or name changes between two listings, or a tool is
  added), instruction-like text
  in a tool's result, and the host's state (customers, tickets, comments, calls per tool).

"Going away" is the process stopping (`FakeHost.stop`, or the stack stopping it); it comes
back on the same port. `drive_run` plays the host driving Writ through the SDK (`writ_client`).
"""

from __future__ import annotations

from fakes.host._server import FakeHost, drive_run, main
from fakes.host._state import DEFAULT_DATA, tool_definitions

__all__ = ["DEFAULT_DATA", "FakeHost", "drive_run", "main", "tool_definitions"]
