-- The governance policy epoch read before the command's `decide` (governance migration 007).
-- The dispatcher takes the admission's allow as its re-check while the epoch has not moved;
-- NULL (an approval, or a command admitted before this column) always asks `decide` again.
ALTER TABLE admission.commands ADD COLUMN policy_epoch bigint;
