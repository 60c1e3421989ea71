-- Approval receipts: one signed receipt per command, written by admission before the command
-- is relayed. The dispatcher reads it and forwards it with the request; it cannot write one
-- (SELECT only), and it holds no signing key. `kid` is the key that signed it.
CREATE TABLE admission.authorizations (
    tenant        text NOT NULL,
    operation_id  uuid NOT NULL,
    kid           text NOT NULL,
    token         text NOT NULL,
    expires_at    timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, operation_id)
);

GRANT SELECT, INSERT ON admission.authorizations TO {role:admission};
GRANT SELECT ON admission.authorizations TO {role:dispatcher};

-- The dispatcher's sweeper leaves a pending command the relay has not published yet (its outbox
-- row is still there) to the relay, which signs its receipt before publishing it.
GRANT SELECT ON admission.outbox TO {role:dispatcher};
