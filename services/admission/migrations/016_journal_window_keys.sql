-- Journal payloads keyed per tenant, day and run, so retention and erasure can destroy keys
-- (libs/journal_window_keys.sql).
{include:journal_window_keys}
