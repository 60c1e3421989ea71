-- Model calls begun for a chat turn's step, counted apart from the step's own transaction (which
-- a crash rolls back): a second call for the same step means an earlier one may have streamed
-- text to the session that the new call's text replaces, so its stream starts with a reset.
CREATE TABLE planner.session_model_calls (
    run_id text NOT NULL,
    seq    int NOT NULL,
    calls  int NOT NULL DEFAULT 1,
    PRIMARY KEY (run_id, seq)
);
GRANT SELECT, INSERT, UPDATE ON planner.session_model_calls TO {role:planner};
