-- Each attempt remembers the trace it ran in: a later holder of the same command (after a crash,
-- a lost lease, a redelivery) links its dispatch span to every earlier attempt's.
ALTER TABLE dispatcher.attempts ADD COLUMN traceparent text;
