-- Spend caps (docs/budgets.md "Spend caps"): money a tenant's or an agent's runs may spend per
-- day or per month, in the currency of the tenant's signed price table.
--
-- One row per cap and window (the calendar day or month in the tenant's time zone). Every step
-- a cap covers locks the cap's row after its run's budget row, caps in name order, so the
-- totals are exact: what is left = limit - used (settled) - reserved (open).
CREATE TABLE governance.spend (
    tenant          text NOT NULL,
    cap             text NOT NULL,
    window_key      text NOT NULL,
    reserved_micros bigint NOT NULL DEFAULT 0 CHECK (reserved_micros >= 0),
    used_micros     bigint NOT NULL DEFAULT 0 CHECK (used_micros >= 0),
    PRIMARY KEY (tenant, cap, window_key)
);

-- What one reservation holds of the caps that cover it, and how it is priced: fixed when it is
-- reserved, so its settlement charges the same windows at the same prices.
CREATE TABLE governance.spend_charges (
    reservation_id  uuid PRIMARY KEY REFERENCES governance.reservations (reservation_id),
    tenant          text NOT NULL,
    caps            text[] NOT NULL,
    windows         text[] NOT NULL,
    worst_micros    bigint NOT NULL CHECK (worst_micros >= 0),
    input_rate      bigint NOT NULL,
    output_rate     bigint NOT NULL,
    per_call        bigint NOT NULL,
    fixed           bigint NOT NULL,
    prices_version  text NOT NULL,
    used_micros     bigint CHECK (used_micros >= 0)
);

GRANT SELECT, INSERT, UPDATE ON governance.spend, governance.spend_charges TO {role:governance};
