"""The statements of `BudgetStore` (`_budgets.py`), and how their rows read."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from services.governance.budgets import BudgetState, Limits

__all__ = [
    "_ELAPSED",
    "_BUDGET",
    "_LOCK_FOR_RESERVE",
    "_KNOWN",
    "_LOCK_FOR_SETTLE",
    "_RESERVATION",
    "_RESERVED",
    "_CLOSE",
    "_SETTLED",
    "_FAST_LOCK",
    "_FAST_CLOSE",
    "_FAST_SETTLED",
    "_MADE_KEPT",
    "_LOWER",
    "_PAUSE",
    "_RESUME",
    "_state",
    "_settled_entry",
]

# The run's clock: seconds since registration, less every wait for a person (closed waits in
# paused_s, the open one since paused_since).
_ELAPSED = """(extract(epoch FROM now() - b.started_at) - b.paused_s
             - CASE WHEN b.waiting > 0 THEN extract(epoch FROM now() - b.paused_since)
                    ELSE 0 END)::float8 AS elapsed_s"""
_BUDGET = f"SELECT b.*, {_ELAPSED} FROM governance.budgets b WHERE b.tenant = $1 AND b.run_id = $2"
# The budget row locked, with the reservation this step key already has (a redelivery). The
# reservation is read in the statement's snapshot, taken before the lock was granted: one that
# a concurrent reserve of the same key committed meanwhile is not seen here, but the insert's
# conflict (or, before a refusal, `_KNOWN`) finds it.
_LOCK_FOR_RESERVE = f"""
SELECT b.*, {_ELAPSED}, k.reservation_id::text AS known_id, k.status AS known_status,
       k.provider_calls AS known_provider_calls, k.tokens AS known_tokens,
       k.capability_calls AS known_capability_calls
FROM governance.budgets b
LEFT JOIN governance.reservations k
       ON k.tenant = b.tenant AND k.run_id = b.run_id AND k.step_key = $3
WHERE b.tenant = $1 AND b.run_id = $2 FOR UPDATE OF b
"""
_KNOWN = (
    "SELECT reservation_id::text AS known_id, status AS known_status, "
    "provider_calls AS known_provider_calls, tokens AS known_tokens, "
    "capability_calls AS known_capability_calls FROM governance.reservations "
    "WHERE tenant = $1 AND run_id = $2 AND step_key = $3"
)
# The budget row and the reservation being settled, both locked (no row: no such budget or
# no such reservation). Both are locked so that a settle that waited for a concurrent one of
# the same reservation reads the status it left.
_LOCK_FOR_SETTLE = """
SELECT r.step_key, r.status, r.provider_calls, r.tokens, r.capability_calls,
       r.used_provider_calls, r.used_tokens, r.used_capability_calls
FROM governance.budgets b
JOIN governance.reservations r
  ON r.reservation_id = $3::uuid AND r.tenant = b.tenant AND r.run_id = b.run_id
WHERE b.tenant = $1 AND b.run_id = $2 FOR UPDATE OF b, r
"""
# $1 tenant, $2 run, $3 reservation, $4 step key, $5-$7 amounts. Inserts nothing (and moves
# no total) if a concurrent reserve of the same step key committed first.
_RESERVATION = (
    "reservation AS (INSERT INTO governance.reservations (reservation_id, tenant, "
    "run_id, step_key, provider_calls, tokens, capability_calls) "
    "VALUES ($3, $1, $2, $4, $5, $6, $7) ON CONFLICT (tenant, run_id, step_key) "
    "DO NOTHING RETURNING 1)"
)
_RESERVED = (
    "UPDATE governance.budgets SET "
    "reserved_provider_calls = reserved_provider_calls + $5, "
    "reserved_tokens = reserved_tokens + $6, "
    "reserved_capability_calls = reserved_capability_calls + $7, "
    "open_steps = open_steps + 1 WHERE tenant = $1 AND run_id = $2 "
    "AND EXISTS (SELECT 1 FROM reservation) RETURNING true"
)
# $1 tenant, $2 run, $3 reservation, $4 status, $5-$7 used, $8-$10 what it had reserved.
_CLOSE = (
    "reservation AS (UPDATE governance.reservations SET status = $4, "
    "used_provider_calls = $5, used_tokens = $6, used_capability_calls = $7, "
    "closed_at = now() WHERE reservation_id = $3::uuid)"
)
_SETTLED = (
    "UPDATE governance.budgets SET "
    "reserved_provider_calls = reserved_provider_calls - $8, "
    "reserved_tokens = reserved_tokens - $9, "
    "reserved_capability_calls = reserved_capability_calls - $10, "
    "used_provider_calls = used_provider_calls + $5, "
    "used_tokens = used_tokens + $6, "
    "used_capability_calls = used_capability_calls + $7, "
    "open_steps = open_steps - 1 WHERE tenant = $1 AND run_id = $2"
)
# The settlement in one statement, no transaction of its own, for a reservation whose step key
# and amounts this process knows (it made it): $1-$10 as `_CLOSE` and `_SETTLED`, $11 the step
# key. The budget row is locked first, as everywhere; the reservation is closed only if it is
# still open and is the one known (else nothing is written, and the locked path answers).
_FAST_LOCK = (
    "budget AS (SELECT 1 FROM governance.budgets WHERE tenant = $1 AND run_id = $2 FOR UPDATE)"
)
_FAST_CLOSE = (
    "reservation AS (UPDATE governance.reservations SET status = $4, "
    "used_provider_calls = $5, used_tokens = $6, used_capability_calls = $7, "
    "closed_at = now() WHERE reservation_id = $3::uuid AND tenant = $1 "
    "AND run_id = $2 AND status = 'open' AND step_key = $11 "
    "AND provider_calls = $8 AND tokens = $9 AND capability_calls = $10 "
    "AND EXISTS (SELECT 1 FROM budget) RETURNING 1)"
)
_FAST_SETTLED = f"{_SETTLED} AND EXISTS (SELECT 1 FROM reservation) RETURNING true"
# Reservations this process made and has not seen settled (`_made`), at most this many.
_MADE_KEPT = 4096
# $1 tenant, $2 run, $3-$7 the lowered limits.
_LOWER = (
    "UPDATE governance.budgets SET provider_calls = $3, tokens = $4, "
    "capability_calls = $5, wall_time_s = $6, max_concurrent_steps = $7 "
    "WHERE tenant = $1 AND run_id = $2"
)

# Overlapping waits (two asks at once) stop the clock once: it stops when the first opens and
# runs again when the last closes. The wait row makes both statements idempotent.
_PAUSE = """
WITH wait AS (
    INSERT INTO governance.budget_waits (tenant, run_id, wait_key)
    SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM governance.budgets
                                    WHERE tenant = $1 AND run_id = $2)
    ON CONFLICT DO NOTHING RETURNING 1)
UPDATE governance.budgets SET waiting = waiting + 1,
    paused_since = CASE WHEN waiting = 0 THEN now() ELSE paused_since END
WHERE tenant = $1 AND run_id = $2 AND EXISTS (SELECT 1 FROM wait) RETURNING true
"""
_RESUME = """
WITH wait AS (
    UPDATE governance.budget_waits SET ended_at = now()
    WHERE tenant = $1 AND run_id = $2 AND wait_key = $3 AND ended_at IS NULL RETURNING 1)
UPDATE governance.budgets SET waiting = waiting - 1,
    paused_s = paused_s + CASE WHEN waiting = 1
                               THEN extract(epoch FROM now() - paused_since)::float8 ELSE 0 END,
    paused_since = CASE WHEN waiting = 1 THEN NULL ELSE paused_since END
WHERE tenant = $1 AND run_id = $2 AND EXISTS (SELECT 1 FROM wait) RETURNING true
"""


def _state(row: asyncpg.Record) -> BudgetState:
    return BudgetState(
        limits=Limits(
            provider_calls=row["provider_calls"],
            tokens=row["tokens"],
            capability_calls=row["capability_calls"],
            wall_time_s=row["wall_time_s"],
            max_concurrent_steps=row["max_concurrent_steps"],
        ),
        reserved_provider_calls=row["reserved_provider_calls"],
        reserved_tokens=row["reserved_tokens"],
        reserved_capability_calls=row["reserved_capability_calls"],
        used_provider_calls=row["used_provider_calls"],
        used_tokens=row["used_tokens"],
        used_capability_calls=row["used_capability_calls"],
        open_steps=row["open_steps"],
        elapsed_s=row["elapsed_s"],
    )


def _settled_entry(
    reservation_id: str, step_key: str, reserved: Sequence[int], used: Sequence[int]
) -> dict[str, object]:
    """The journal's record of a closed reservation."""
    kinds = ("provider_calls", "tokens", "capability_calls")
    return {
        "reservation_id": reservation_id,
        "step_key": step_key,
        "reserved": dict(zip(kinds, reserved, strict=True)),
        "used": dict(zip(kinds, used, strict=True)),
    }
