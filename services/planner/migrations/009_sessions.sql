-- Chat sessions (docs/design.md §10): a durable conversation of one principal with one agent. Each
-- turn is a run of the planner's loop (`<session_id>-t<turn>`); the session's state is moved
-- only by services/planner/sessions/logic.py's table, and every change writes its event (and
-- its journal row) in the transaction that makes it.
CREATE TABLE planner.sessions (
    session_id        text PRIMARY KEY,
    tenant            text NOT NULL,
    principal         text NOT NULL,
    agent             text NOT NULL,
    plan_mode         boolean NOT NULL DEFAULT false,
    state             text NOT NULL CHECK (state IN ('active', 'processing', 'paused', 'closed')),
    -- The last turn started (0: none yet) and whether it is still in flight: a paused
    -- session resumes to `processing` only if its turn has not ended.
    turn              int NOT NULL DEFAULT 0,
    turn_open         boolean NOT NULL DEFAULT false,
    parent_session_id text,
    fork_turn         int,
    fork_step         int,
    -- The branch run a child session shows (an agent call of a parent's turn), if it is one.
    branch_run_id     text UNIQUE,
    -- The Idempotency-Key that opened it: the same key opens the same session.
    open_key          text NOT NULL,
    -- The last event number given and the last one published on the session's subject.
    last_n            int NOT NULL DEFAULT 0,
    published_n       int NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, open_key)
);
CREATE INDEX sessions_unpublished ON planner.sessions (session_id)
    WHERE published_n < last_n;

-- A session's turns: one per accepted message, keyed by its Idempotency-Key (a re-sent
-- message returns the first acceptance), each driving the run `run_id`.
CREATE TABLE planner.session_turns (
    session_id  text NOT NULL REFERENCES planner.sessions (session_id),
    turn        int NOT NULL,
    run_id      text NOT NULL UNIQUE,
    message_key text NOT NULL,
    input       text NOT NULL,  -- the run's input: the bounded conversation, as user data
    status      text NOT NULL DEFAULT 'running',
    started     boolean NOT NULL DEFAULT false,  -- registered and handed to retrieval
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, turn),
    UNIQUE (session_id, message_key)
);
CREATE INDEX session_turns_unstarted ON planner.session_turns (session_id) WHERE NOT started;

-- Every durable event of a session, numbered 1, 2, ... with no gap (under the session's row
-- lock); `source` names what produced it, so a redelivery that derives it again adds nothing.
CREATE TABLE planner.session_events (
    session_id text NOT NULL REFERENCES planner.sessions (session_id),
    n          int NOT NULL,
    type       text NOT NULL,
    source     text NOT NULL,
    body       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, n),
    UNIQUE (session_id, source)
);

-- Injected messages: seen by the model at the next decision of the turn in flight (recorded
-- there as a step of the run) or, if none is in flight, at the next turn's.
CREATE TABLE planner.session_injections (
    session_id text NOT NULL REFERENCES planner.sessions (session_id),
    n          int NOT NULL,
    text       text NOT NULL,
    taken_by   text,  -- the run whose step recorded it
    taken_seq  int,
    PRIMARY KEY (session_id, n)
);

-- An injected message is a step of the run the model saw it in.
ALTER TABLE planner.steps DROP CONSTRAINT steps_kind_check;
ALTER TABLE planner.steps ADD CONSTRAINT steps_kind_check
    CHECK (kind IN ('decision', 'observation', 'critic', 'injected'));

GRANT SELECT, INSERT, UPDATE ON planner.sessions TO {role:planner};
GRANT SELECT, INSERT, UPDATE ON planner.session_turns TO {role:planner};
GRANT SELECT, INSERT ON planner.session_events TO {role:planner};
GRANT SELECT, INSERT, UPDATE ON planner.session_injections TO {role:planner};
