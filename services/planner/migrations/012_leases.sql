-- Budget leases (services/planner/budgeting.py): a root run reserves a chunk of its budgets in
-- governance at once (step key "<run>:lease:<n>") and its steps draw on it here, so a step
-- no longer costs a governance round trip of its own. A draw is a reservation row whose
-- `lease` names the lease's step key and whose reservation_id is the lease's; it holds the
-- `reserved_*` amounts while open and is closed with what the step used. A lease row keeps
-- what governance granted in `reserved_*`, may be drawn on while open and until `expires_at`
-- (the run's clock as governance gave it, epoch seconds on the database's clock), and is
-- settled in governance once, with what its draws used together.
ALTER TABLE planner.reservations
    ADD COLUMN lease text,
    ADD COLUMN reserved_provider_calls int NOT NULL DEFAULT 0,
    ADD COLUMN reserved_tokens int NOT NULL DEFAULT 0,
    ADD COLUMN reserved_capability_calls int NOT NULL DEFAULT 0,
    ADD COLUMN expires_at double precision;
