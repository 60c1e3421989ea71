-- A critic's verdict on an answer is a step of its own (captured like a model decision).
ALTER TABLE planner.steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE planner.steps ADD CONSTRAINT steps_kind_check
    CHECK (kind IN ('decision', 'observation', 'critic'));

-- The run's budget reservations in governance, one per step key ("<run>:<seq>:model",
-- "<run>:<seq>:critic", "<run>:<seq>:capability"), recorded with the step they pay for:
-- `open` while the step's work is in flight, `due` once what it used is known (settled with
-- these amounts, again after a crash: settling is idempotent), `closed` once governance has it.
CREATE TABLE planner.reservations (
    run_id           text NOT NULL REFERENCES planner.runs (run_id),
    step_key         text NOT NULL,
    reservation_id   text NOT NULL,
    state            text NOT NULL CHECK (state IN ('open', 'due', 'closed')),
    provider_calls   int NOT NULL DEFAULT 0,
    tokens           int NOT NULL DEFAULT 0,
    capability_calls int NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, step_key)
);

GRANT SELECT, INSERT, UPDATE ON planner.reservations TO {role:planner};
