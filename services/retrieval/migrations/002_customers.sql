-- Customer records `crm.customer.get` reads: retrieval's own read-only copy, so reading a
-- customer never needs the CRM credential (only the dispatcher holds that, and it can write).
-- Untrusted content like the documents: a note on a record is data, never an instruction.
CREATE TABLE retrieval.customers (
    tenant      text NOT NULL,
    customer_id text NOT NULL,
    name        text NOT NULL,
    owner       text NOT NULL DEFAULT '',
    email       text NOT NULL DEFAULT '',
    status      text NOT NULL DEFAULT 'active',
    notes       text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, customer_id)
);

-- Read-only, like the documents: retrieval serves reads, it never writes what it serves.
GRANT SELECT ON retrieval.customers TO {role:retrieval};
