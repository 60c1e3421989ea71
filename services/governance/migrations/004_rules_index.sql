-- decide reads the rules of one tool for one agent (or all agents) on every call.
DROP INDEX governance.rules_by_tool;
CREATE INDEX rules_by_tool_agent ON governance.rules (tenant, tool, agent);
