-- A host's request to cancel a run, kept even when it arrives before the run exists (a cancel
-- is accepted while the run is still being started): the run is then created cancelled.
CREATE TABLE planner.cancellations (
    run_id       text NOT NULL,
    tenant       text NOT NULL,
    principal    text NOT NULL,
    request_id   text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    -- Per tenant: another tenant naming the run cannot take its place.
    PRIMARY KEY (run_id, tenant)
);
GRANT SELECT, INSERT ON planner.cancellations TO {role:planner};
