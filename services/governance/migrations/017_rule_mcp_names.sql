-- A fine rule naming an `mcp:` capability names one tool (`mcp:<server>/<tool>`) or a server's
-- whole source (`mcp:<server>/*`), spelt as decide parses them (services/governance/logic.py):
-- `mcp:Helpdesk/*`, `mcp:helpdesk`, `mcp:cr*` or `mcp:helpdesk/ *` would name no tool at all,
-- and a deny rule written so would refuse nothing while reading as if it did. NOT VALID: rows
-- kept from before are left as they are; every row written from now on is checked.
ALTER TABLE governance.rules ADD CONSTRAINT rules_mcp_name CHECK (
    tool NOT LIKE 'mcp:%'
    OR tool ~ '^mcp:[a-z][a-z0-9-]{0,31}/(\*|[A-Za-z][A-Za-z0-9_.-]{0,63})$') NOT VALID;
