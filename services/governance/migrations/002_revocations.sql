-- A revoked principal's queued actions must stop (the reference architecture): decide denies them on line 1,
-- and the dispatcher asks decide again right before executing.
CREATE TABLE governance.revocations (
    tenant      text NOT NULL,
    principal   text NOT NULL,
    revoked_by  text NOT NULL,
    reason      text NOT NULL DEFAULT '',
    revoked_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, principal)
);
GRANT SELECT ON governance.revocations TO {role:governance};
