-- Run budgets (docs/design.md §3 invariant 9): limits set when the run is registered, reservations
-- taken before a step starts and settled when it ends.
--
-- Every change to a run's reservations first locks its budget row, so the running totals below
-- are exact: remaining = limit - used (settled) - reserved (open), and open_steps counts the open
-- reservations. Parallel steps queue on that lock and each sees what the previous one took.
CREATE TABLE governance.budgets (
    tenant                 text NOT NULL,
    run_id                 text NOT NULL,
    agent                  text NOT NULL,
    -- Limits.
    provider_calls         bigint NOT NULL CHECK (provider_calls >= 0),
    tokens                 bigint NOT NULL CHECK (tokens >= 0),
    capability_calls       bigint NOT NULL CHECK (capability_calls >= 0),
    wall_time_s            integer NOT NULL CHECK (wall_time_s >= 1),
    max_concurrent_steps   integer NOT NULL CHECK (max_concurrent_steps >= 1),
    -- Open reservations.
    reserved_provider_calls   bigint NOT NULL DEFAULT 0 CHECK (reserved_provider_calls >= 0),
    reserved_tokens           bigint NOT NULL DEFAULT 0 CHECK (reserved_tokens >= 0),
    reserved_capability_calls bigint NOT NULL DEFAULT 0 CHECK (reserved_capability_calls >= 0),
    open_steps                integer NOT NULL DEFAULT 0 CHECK (open_steps >= 0),
    -- Settled use, as reported (it may exceed what was reserved).
    used_provider_calls    bigint NOT NULL DEFAULT 0,
    used_tokens            bigint NOT NULL DEFAULT 0,
    used_capability_calls  bigint NOT NULL DEFAULT 0,
    -- The run's clock: started at registration, stopped while at least one wait for a person
    -- (a pending decision of this run) is open. elapsed = now - started_at - paused_s
    -- - (now - paused_since, while waiting > 0).
    started_at             timestamptz NOT NULL DEFAULT now(),
    waiting                integer NOT NULL DEFAULT 0 CHECK (waiting >= 0),
    paused_since           timestamptz,
    paused_s               double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, run_id),
    FOREIGN KEY (tenant, run_id) REFERENCES governance.runs (tenant, run_id)
);

-- One row per wait for a person; the key makes pausing and resuming idempotent.
CREATE TABLE governance.budget_waits (
    tenant      text NOT NULL,
    run_id      text NOT NULL,
    wait_key    text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    PRIMARY KEY (tenant, run_id, wait_key),
    FOREIGN KEY (tenant, run_id) REFERENCES governance.budgets (tenant, run_id)
);

CREATE TABLE governance.reservations (
    reservation_id   uuid PRIMARY KEY,
    tenant           text NOT NULL,
    run_id           text NOT NULL,
    step_key         text NOT NULL,
    provider_calls   bigint NOT NULL CHECK (provider_calls >= 0),
    tokens           bigint NOT NULL CHECK (tokens >= 0),
    capability_calls bigint NOT NULL CHECK (capability_calls >= 0),
    status           text NOT NULL DEFAULT 'open'
                     CHECK (status IN ('open', 'settled', 'released')),
    used_provider_calls   bigint,
    used_tokens           bigint,
    used_capability_calls bigint,
    reserved_at      timestamptz NOT NULL DEFAULT now(),
    closed_at        timestamptz,
    -- A redelivered reserve for the same step finds this reservation instead of a second one.
    UNIQUE (tenant, run_id, step_key),
    FOREIGN KEY (tenant, run_id) REFERENCES governance.budgets (tenant, run_id)
);

GRANT SELECT, INSERT, UPDATE ON governance.budgets, governance.budget_waits,
    governance.reservations TO {role:governance};
