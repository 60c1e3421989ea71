-- Four eyes: whether a person's approval of a proposal still counts. The one place that says
-- so: admission counts and lists a proposal's approvals through it, and governance checks the
-- earlier approvers through it before an approval completes them. NULL while the approval
-- counts; otherwise the stable code of why not (APPROVER_REVOKED: the approver's access to
-- the tenant was revoked after they approved; lifting the revocation makes it count again).
--
-- SECURITY DEFINER: admission learns whether an approver's approval counts, and nothing else
-- of the revocations (who revoked, why, when) and nothing of anyone it does not name.
CREATE FUNCTION governance.approval_void(p_tenant text, p_approver text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM governance.revocations v
                     WHERE v.tenant = p_tenant AND v.principal = p_approver)
        THEN 'APPROVER_REVOKED'
    END
$$;
REVOKE ALL ON FUNCTION governance.approval_void(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION governance.approval_void(text, text) TO {role:governance};
DO $grant$
BEGIN
    IF to_regrole('{role:admission}') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA governance TO {role:admission};
        GRANT EXECUTE ON FUNCTION governance.approval_void(text, text) TO {role:admission};
    END IF;
END
$grant$;
