-- The dispatcher's sweeper looks for commands pending too long; without this it scans them all.
CREATE INDEX commands_stale_pending ON admission.commands (updated_at) WHERE state = 'pending';
