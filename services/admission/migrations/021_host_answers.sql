-- What admission last told a host about its command (`answered_state`, the state its
-- `CommandResult` carried), set once that result is published. A host command in a final
-- state its host was not told of (the outcome's message lost before admission answered it)
-- is answered by admission's sweeper from the registry (`services/admission/sweeper.py`).
-- Commands that ended before count as told.
ALTER TABLE admission.commands ADD COLUMN answered_state text;
UPDATE admission.commands SET answered_state = state
WHERE origin = 'host' AND state NOT IN ('pending', 'dispatching');
CREATE INDEX commands_host_untold ON admission.commands (updated_at)
    WHERE origin = 'host' AND state NOT IN ('pending', 'dispatching')
      AND answered_state IS DISTINCT FROM state;
GRANT UPDATE (answered_state) ON admission.commands TO {role:admission};
