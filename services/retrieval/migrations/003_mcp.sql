-- Federation reads (schemas/mcp.py): the host's MCP servers as retrieval last listed them, and
-- the operator's classification of each tool. Retrieval only reads these: governance writes them,
-- each row in the same transaction as its journal row (governance's audit journal), and reads
-- the classification in `decide`. They sit in retrieval's schema, next to the listings they
-- describe.
CREATE TABLE retrieval.mcp_listings (
    tenant    text NOT NULL,
    server    text NOT NULL,
    digest    text NOT NULL,
    tools     jsonb NOT NULL,
    listed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, server, digest)
);
CREATE INDEX mcp_listings_latest ON retrieval.mcp_listings (tenant, server, listed_at DESC);

-- One row per classified tool: the family the operator chose, bound to the digest of the tool
-- (name, description, input and output schemas) it was shown. A live digest that differs is
-- refused until the tool is classified again.
CREATE TABLE retrieval.mcp_tools (
    tenant         text NOT NULL,
    capability     text NOT NULL,   -- mcp:<server>/<tool>
    family         text NOT NULL,
    digest         text NOT NULL,
    description    text NOT NULL,
    input_schema   jsonb NOT NULL,
    output_schema  jsonb,
    classified_by  text NOT NULL,
    classified_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, capability)
);

GRANT SELECT ON retrieval.mcp_listings, retrieval.mcp_tools TO {role:retrieval};
GRANT USAGE ON SCHEMA retrieval TO {role:governance};
GRANT SELECT, INSERT, UPDATE ON retrieval.mcp_listings, retrieval.mcp_tools
    TO {role:governance};
