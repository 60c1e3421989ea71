-- The audit journal (libs/journal.sql).
-- Admission writes a row in the same transaction as every proposal it records, every
-- approval, rejection or expiry, and every command it admits.
{include:journal}
