-- A capability call that was definitely not carried out (denied, rejected, expired, failed, sent
-- back) gives back what its spend charge took from its caps (docs/budgets.md "Spend caps"):
-- `credited_micros` records what was given back, once. A charge credited already is never
-- credited again, so an outcome delivered twice gives back once.
ALTER TABLE governance.spend_charges ADD COLUMN credited_micros bigint
    CHECK (credited_micros >= 0);
