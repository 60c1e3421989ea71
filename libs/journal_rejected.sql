-- The audit journal's rejections (libs/journal): a row the sealer cannot accept (it does not
-- authenticate, or it was recorded before the head it would follow) still takes its place in the
-- chain, as a rejection with the reason, instead of stopping the chain behind it. Rows deleted
-- behind a stalled chain would leave no trace; a rejection is signed and cannot be undone.
ALTER TABLE {schema}.journal_seals ADD COLUMN rejected text;
