-- The audit journal (libs/journal.sql).
-- The dispatcher writes a row in the same transaction as every attempt it starts or
-- releases, every outcome it records and every reconciliation.
{include:journal}
