-- The policy epoch: one counter, bumped in the same transaction as any change to what `decide`
-- reads that could take an allow back (org policy, fine rules, revocations, grants, a run's
-- registration or grants changed, an answer changed or removed). Inserting a run, its grants or
-- a pending decision only adds what may be allowed, so those inserts leave it alone.
--
-- Admission reads it before asking `decide` and stores it with the command; the dispatcher reads
-- it again in its claim. Unchanged (and the admission recent), nothing `decide` reads for that
-- call has changed, so the admission's allow is the re-check's answer; otherwise it asks again.
-- A row update, not a sequence: a sequence moves before the change commits, so a reader could
-- see the new value while the change is still invisible to `decide`.
CREATE TABLE governance.policy_epoch (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    epoch     bigint NOT NULL
);
INSERT INTO governance.policy_epoch (epoch) VALUES (1);

-- SECURITY DEFINER: whoever makes the change (governance's role, an operator) bumps the epoch
-- without being granted anything on it.
CREATE FUNCTION governance.bump_policy_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    UPDATE governance.policy_epoch SET epoch = epoch + 1;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION governance.bump_policy_epoch() FROM PUBLIC;

CREATE TRIGGER bump_policy_epoch AFTER INSERT OR UPDATE OR DELETE ON governance.policy
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.policy
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch AFTER INSERT OR UPDATE OR DELETE ON governance.rules
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.rules
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch AFTER INSERT OR UPDATE OR DELETE ON governance.revocations
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.revocations
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch AFTER INSERT OR UPDATE OR DELETE ON governance.standing_grants
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.standing_grants
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch AFTER UPDATE OR DELETE ON governance.runs
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.runs
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch AFTER UPDATE OR DELETE ON governance.run_grants
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.run_grants
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch AFTER UPDATE OR DELETE ON governance.pending
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();
CREATE TRIGGER bump_policy_epoch_truncate AFTER TRUNCATE ON governance.pending
    FOR EACH STATEMENT EXECUTE FUNCTION governance.bump_policy_epoch();

GRANT SELECT ON governance.policy_epoch TO {role:governance};
-- Admission and the dispatcher read the counter and nothing else of governance's (their roles
-- exist whenever they are provisioned with governance; a test of governance alone has none).
DO $$
BEGIN
    IF to_regrole('{role:admission}') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA governance TO {role:admission};
        GRANT SELECT ON governance.policy_epoch TO {role:admission};
    END IF;
    IF to_regrole('{role:dispatcher}') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA governance TO {role:dispatcher};
        GRANT SELECT ON governance.policy_epoch TO {role:dispatcher};
    END IF;
END
$$;
