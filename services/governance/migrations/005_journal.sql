-- The audit journal (libs/journal.sql).
-- Governance writes a row in the same transaction as every decision, answer, grant, rule, run
-- and policy change it records.
{include:journal}
