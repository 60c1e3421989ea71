-- The local mail module `email.draft.apply` acts on (the approval-contracts note's broadcast assistant). The host
-- application owns drafts and audiences (the dispatcher only reads them); applying a draft writes
-- the editable broadcast form in the same transaction as the command's outcome.
CREATE TABLE dispatcher.mail_drafts (
    tenant     text NOT NULL,
    draft_id   text NOT NULL,
    subject    text NOT NULL,
    body       text NOT NULL,
    segment    text NOT NULL,
    state      text NOT NULL DEFAULT 'draft' CHECK (state IN ('draft', 'archived')),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, draft_id)
);

CREATE TABLE dispatcher.mail_audience (
    tenant  text NOT NULL,
    segment text NOT NULL,
    address text NOT NULL,
    PRIMARY KEY (tenant, segment, address)
);

CREATE TABLE dispatcher.mail_forms (
    form_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant        text NOT NULL,
    draft_id      text NOT NULL,
    subject       text NOT NULL,
    body          text NOT NULL,
    segment       text NOT NULL,
    recipients    int NOT NULL,
    operation_key text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, operation_key)
);

-- SELECT ... FOR UPDATE on a draft needs UPDATE: it holds the draft while the form is written.
GRANT SELECT, UPDATE ON dispatcher.mail_drafts TO {role:dispatcher};
GRANT SELECT ON dispatcher.mail_audience TO {role:dispatcher};
GRANT SELECT, INSERT, UPDATE ON dispatcher.mail_forms TO {role:dispatcher};
