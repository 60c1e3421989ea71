-- A standing grant may name a source instead of covering its whole family: `mcp:<server>/*`
-- (every tool of that MCP server) or `mcp:<server>/<tool>` (that one tool). It covers a call only
-- when the tool is classified into the grant's family (services/governance/logic.py); '' is the
-- family-wide grant every grant was before. A source grant never names a family that sends
-- outside or executes code: those are asked every time whatever a grant says.
ALTER TABLE governance.standing_grants ADD COLUMN source text NOT NULL DEFAULT '';
ALTER TABLE governance.standing_grants ADD CONSTRAINT standing_grants_source CHECK (
    source = ''
    OR (source ~ '^mcp:[a-z][a-z0-9-]{0,31}/(\*|[A-Za-z][A-Za-z0-9_.-]{0,63})$'
        AND family NOT IN ('send_external', 'execute_code')));
ALTER TABLE governance.standing_grants DROP CONSTRAINT standing_grants_pkey;
ALTER TABLE governance.standing_grants ADD PRIMARY KEY (tenant, agent, family, source);
