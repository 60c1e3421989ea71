"""The planner store's statements that more than one of its methods build on: a locked run's
state, the lock that counts itself on the run's row, and the reservation rows written behind."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import asyncpg
import msgspec

from libs.journal import Expired, JournalError, WindowKeys, column_aad, unseal
from services.planner.store._rows import Reservation, RunRow, Step


def state_columns(tenant: str, after: str) -> str:
    """What a locked run's state reads: its steps after seq `after` (a parameter), how many
    it has, the first this transaction wrote, who asked to cancel it (for `tenant`), its
    reservations and the database's clock."""
    return f"""
(SELECT coalesce(json_agg(json_build_object('seq', seq, 'kind', kind, 'payload', payload)
                          ORDER BY seq), '[]'::json)
 FROM planner.steps WHERE run_id = $1 AND seq > {after}) AS steps,
(SELECT count(*) FROM planner.steps WHERE run_id = $1) AS step_count,
-- The first step this transaction wrote itself (not committed: never kept).
(SELECT min(seq) FROM planner.steps WHERE run_id = $1
 AND xmin::text::bigint = pg_current_xact_id()::text::bigint % 4294967296) AS own_from,
(SELECT principal FROM planner.cancellations
 WHERE run_id = $1 AND tenant = {tenant}) AS cancelled_by,
(SELECT coalesce(json_agg(json_build_object(
            'step_key', step_key, 'reservation_id', reservation_id, 'state', state,
            'provider_calls', provider_calls, 'tokens', tokens,
            'capability_calls', capability_calls, 'lease', lease,
            'reserved_provider_calls', reserved_provider_calls,
            'reserved_tokens', reserved_tokens,
            'reserved_capability_calls', reserved_capability_calls,
            'expires_at', expires_at)), '[]'::json)
 FROM planner.reservations WHERE run_id = $1) AS reservations,
extract(epoch FROM now())::float8 AS now"""


# $1 run, $2 tenant, $3 the last step known.
STATE = f"SELECT {state_columns('$2', '$3')}"
RESERVATION_COLUMNS = (
    "step_key, reservation_id, state, provider_calls, tokens, "
    "capability_calls, lease, reserved_provider_calls, reserved_tokens, "
    "reserved_capability_calls, expires_at"
)
# What `hold` inserts of each reservation, in its statement's order.
HELD = (
    "step_key",
    "reservation_id",
    "lease",
    "reserved_provider_calls",
    "reserved_tokens",
    "reserved_capability_calls",
    "expires_at",
)
# Reservation rows kept to be written with the transaction's next statement (`write_behind`):
# (run id, step key) -> the row as it must stand; None outside a `writing_behind` scope.
BEHIND: ContextVar[dict[tuple[str, str], Reservation] | None] = ContextVar(
    "writ_planner_behind", default=None
)
# The columns a kept row writes, with their array types, in `behind_cte`'s order.
BEHIND_COLUMNS = (
    ("step_key", "text"),
    ("reservation_id", "text"),
    ("state", "text"),
    ("provider_calls", "int"),
    ("tokens", "int"),
    ("capability_calls", "int"),
    ("lease", "text"),
    ("reserved_provider_calls", "int"),
    ("reserved_tokens", "int"),
    ("reserved_capability_calls", "int"),
    ("expires_at", "float8"),
)


def behind_cte(first: int) -> str:
    """A data-modifying CTE writing the kept rows from parameters $first.. (the run ids, then
    one array per column): a new row is inserted, a known one takes its new state and use. A
    closed row is never opened again (the planner closes a reservation once governance took
    its settlement)."""
    columns = ", ".join(name for name, _ in BEHIND_COLUMNS)
    arrays = ", ".join(f"${first + 1 + i}::{kind}[]" for i, (_, kind) in enumerate(BEHIND_COLUMNS))
    return (
        f"behind AS (INSERT INTO planner.reservations (run_id, {columns}) "
        f"SELECT * FROM unnest(${first}::text[], {arrays}) "
        "ON CONFLICT (run_id, step_key) DO UPDATE SET state = EXCLUDED.state, "
        "provider_calls = EXCLUDED.provider_calls, tokens = EXCLUDED.tokens, "
        "capability_calls = EXCLUDED.capability_calls "
        "WHERE planner.reservations.state <> 'closed')"
    )


def behind_args(kept: dict[tuple[str, str], Reservation]) -> list[list[Any]]:
    rows = list(kept.items())
    return [
        [run_id for (run_id, _), _ in rows],
        *([getattr(r, name) for _, r in rows] for name, _ in BEHIND_COLUMNS),
    ]


STEPS = msgspec.json.Decoder(list[Step])
STEPS_KEPT = 1024  # runs whose steps `state` keeps (what the planner drives at once, and more)
RESERVATIONS = msgspec.json.Decoder(list[Reservation])

RUN_COLUMNS = (
    "run_id, tenant, request_id, principal, agent, input, evidence, status, answer, "
    "error_code, error_message, attended, manifest, pending_id, state_version, sealed"
)
# Locks the run ($1) by counting this transaction on its row: an UPDATE waits for the lock,
# then works on (and returns) the newest committed row, whose count says whether another
# transaction locked it after this statement's snapshot was taken. $2 the last step known.
# `touched_at` says when the run was last driven (what the sweeper looks at).
LOCK = (
    "UPDATE planner.runs SET version = version + 1, touched_at = now() WHERE run_id = $1 "
    f"RETURNING {RUN_COLUMNS}"
)
LOCKED = (
    f"WITH locked AS ({LOCK}, version) SELECT locked.*, "
    "(SELECT version FROM planner.runs WHERE run_id = $1) AS seen_version, "
    f"{state_columns('locked.tenant', '$2')} FROM locked"
)
RUN_FIELDS = tuple(c.strip() for c in RUN_COLUMNS.split(",") if c.strip() != "sealed")
_JSON = msgspec.json.Decoder()  # what a run's row holds as JSON (its evidence, its manifest)


class SealedRun(msgspec.Struct, frozen=True):
    """What `planner.runs.sealed` holds: the run's input and the evidence it was given."""

    input: str
    evidence: list[dict[str, Any]]


SEALED_RUN = msgspec.json.Decoder(SealedRun)


def run_aad(run_id: str) -> bytes:
    return column_aad("planner.runs", "sealed", run_id)


def run_row(row: asyncpg.Record, keys: WindowKeys | None = None) -> RunRow:
    """The run of `row`; its sealed input and evidence opened with `keys` (loaded first)."""
    values = {name: row[name] for name in RUN_FIELDS}
    values["evidence"] = _JSON.decode(values["evidence"])
    if values["manifest"] is not None:
        values["manifest"] = _JSON.decode(values["manifest"])
    sealed = row["sealed"]
    if sealed is not None:
        if keys is None:
            raise JournalError(f"run {row['run_id']} is sealed: open it with the window keys")
        opened = unseal(keys, sealed, run_aad(row["run_id"]))
        if isinstance(opened, Expired):
            values["expired"] = opened.key_id
        else:
            run = SEALED_RUN.decode(opened)
            values["input"], values["evidence"] = run.input, run.evidence
    return RunRow(**values)
