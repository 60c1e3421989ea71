-- The relay publishes each command with the trace context of the admission that created it,
-- so one run is one trace across all six processes.
ALTER TABLE admission.outbox ADD COLUMN traceparent text;
-- Commands awaiting reconciliation are counted every few seconds; keep that cheap.
CREATE INDEX commands_unknown ON admission.commands (tenant) WHERE state = 'unknown';
