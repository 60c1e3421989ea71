-- A standing grant or an allow rule that covers an MCP tool names the tool's pinned digest (the
-- digest of the definition the operator classified, services/governance/logic.py): when the
-- server changes the tool, its new definition has another digest, and no grant or rule given for
-- the old one covers it, even once it is classified again into the same family. A person is
-- asked again.
--
-- A grant naming a source holds one row per digest it covers: `mcp:<server>/<tool>` the tool's,
-- `mcp:<server>/*` each of that server's tools the granter named. A family-wide grant ('') names
-- none and covers no MCP tool at all.
ALTER TABLE governance.standing_grants ADD COLUMN digest text NOT NULL DEFAULT '';
ALTER TABLE governance.standing_grants DROP CONSTRAINT standing_grants_pkey;
ALTER TABLE governance.standing_grants ADD PRIMARY KEY (tenant, agent, family, source, digest);
-- NOT VALID: a source grant kept from before names no digest and so covers nothing; every row
-- written from now on is checked.
ALTER TABLE governance.standing_grants ADD CONSTRAINT standing_grants_digest CHECK (
    (source = '' AND digest = '') OR (source <> '' AND digest ~ '^[0-9a-f]{64}$')) NOT VALID;

-- An allow rule naming an `mcp:` tool or server names the digest it covers; a deny rule names
-- none (it refuses whatever the server serves).
ALTER TABLE governance.rules ADD COLUMN digest text;
ALTER TABLE governance.rules ADD CONSTRAINT rules_digest CHECK (
    (digest IS NULL AND (effect = 'deny' OR tool NOT LIKE 'mcp:%'))
    OR (digest IS NOT NULL AND digest ~ '^[0-9a-f]{64}$' AND effect = 'allow'
        AND tool LIKE 'mcp:%')) NOT VALID;

-- What an ask about an `mcp:` tool was asked on: `always` grants exactly that digest.
ALTER TABLE governance.pending ADD COLUMN digest text
    CHECK (digest IS NULL OR digest ~ '^[0-9a-f]{64}$');
