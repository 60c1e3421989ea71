-- The operator's own description of a classified MCP tool: the only text about it that the
-- model's instructions carry. The server's description stays in `description`, as data.
ALTER TABLE retrieval.mcp_tools ADD COLUMN operator_description text NOT NULL DEFAULT '';
