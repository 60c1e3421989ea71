-- Retrieval owns the documents agents may read. Everything in here is untrusted content.
CREATE SCHEMA retrieval;

CREATE TABLE retrieval.documents (
    tenant      text NOT NULL,
    document_id text NOT NULL,
    kind        text NOT NULL,
    title       text NOT NULL,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    search      tsvector GENERATED ALWAYS AS (
        to_tsvector('english', title || ' ' || body)) STORED,
    PRIMARY KEY (tenant, document_id)
);
CREATE INDEX documents_search ON retrieval.documents USING gin (search);

GRANT USAGE ON SCHEMA retrieval TO {role:retrieval};
-- Read-only: retrieval executes reads, it never writes what it serves.
GRANT SELECT ON retrieval.documents TO {role:retrieval};
