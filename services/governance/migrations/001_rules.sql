-- Governance owns what decides: org policy, fine rules, grants, and the decisions it gave.
CREATE SCHEMA governance;

CREATE TABLE governance.policy (
    tenant      text PRIMARY KEY,
    version     text NOT NULL,
    -- Org-level refusals (docs/design.md §4 line 1): tool names, connections, families.
    refused_tools       text[] NOT NULL DEFAULT '{}',
    refused_connectors  text[] NOT NULL DEFAULT '{}',
    refused_families    text[] NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE governance.rules (
    tenant      text NOT NULL,
    rule_id     bigint GENERATED ALWAYS AS IDENTITY,
    tool        text NOT NULL,
    arg_prefix  text,                -- NULL: any first argument
    agent       text,                -- NULL: all agents of the tenant
    effect      text NOT NULL CHECK (effect IN ('allow', 'deny')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, rule_id)
);
CREATE INDEX rules_by_tool ON governance.rules (tenant, tool);

CREATE TABLE governance.standing_grants (
    tenant      text NOT NULL,
    agent       text NOT NULL,
    family      text NOT NULL CHECK (family IN
                ('read', 'read_personal', 'write_delete', 'send_external', 'execute_code')),
    granted_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, agent, family)
);

CREATE TABLE governance.decisions (
    decision_id    uuid PRIMARY KEY,
    tenant         text NOT NULL,
    run_id         text NOT NULL,
    agent          text NOT NULL,
    principal      text NOT NULL,
    tool           text NOT NULL,
    family         text NOT NULL,
    verdict        text NOT NULL CHECK (verdict IN ('allow', 'deny', 'ask')),
    line           int NOT NULL CHECK (line BETWEEN 1 AND 6),
    reason         text NOT NULL,
    policy_version text NOT NULL,
    decided_at     timestamptz NOT NULL DEFAULT now()
);

GRANT USAGE ON SCHEMA governance TO {role:governance};
GRANT SELECT ON governance.policy, governance.rules TO {role:governance};
GRANT SELECT, INSERT ON governance.standing_grants TO {role:governance};
GRANT SELECT, INSERT ON governance.decisions TO {role:governance};
