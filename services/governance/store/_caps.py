"""The spend cap rows one transaction moves, locked only for its last statement.

Every reservation and settlement of a tenant's capped runs moves the same cap rows
(`governance.spend`, one per cap and window), so whoever holds them makes every other step of
the tenant wait. A transaction therefore reads them without a lock to decide (`read`), keeps
what it moves (`CapMoves`: the holds its settlements return, what they charge, and at most one
new hold), and applies it all in one statement just before it commits (`apply`): the rows are
locked, in cap order, for that statement and the commit only. The statement holds again only
if the hold still fits every cap under the lock; if a concurrent step took the room meanwhile,
nothing is applied and `CapRaced` rolls the transaction back, to be tried again, where the read
then refuses it. So the guarantee stays what a lock held throughout gave: a hold never takes a
window's reserved plus settled above its cap.
"""

from __future__ import annotations

import asyncpg

from libs.errors import RetryableError

__all__ = ["CapMoves", "CapRaced", "read_caps"]

# $1 tenant, $2 caps, $3 windows: what those rows hold and settled now (no lock).
_READ = """
SELECT s.cap, s.window_key, s.reserved_micros, s.used_micros
FROM governance.spend s JOIN unnest($2::text[], $3::text[]) AS t(c, w)
  ON s.cap = t.c AND s.window_key = t.w
WHERE s.tenant = $1
"""
# $1 tenant, $2 caps, $3 windows: the rows created if new.
_ENSURE = """
INSERT INTO governance.spend (tenant, cap, window_key)
SELECT $1, c, w FROM unnest($2::text[], $3::text[]) AS t(c, w)
ON CONFLICT DO NOTHING
"""
# $1 tenant, $2 caps, $3 windows, $4 reserved change, $5 used change, $6 new hold, $7 limits
# (micros; a hold of 0 is not checked). The rows are locked in cap order (no two such
# statements wait on each other the other way round) and read as they are once locked; they
# move only if every hold fits. Returns how many rows moved.
_APPLY = """
WITH d AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
                         $7::bigint[]) AS t(c, w, dr, du, hold, lim)),
locked AS (
    SELECT s.cap, s.window_key, s.reserved_micros + s.used_micros AS spent
    FROM governance.spend s JOIN d ON s.cap = d.c AND s.window_key = d.w
    WHERE s.tenant = $1 ORDER BY s.cap, s.window_key FOR UPDATE OF s),
fits AS (
    SELECT count(*) = cardinality($2::text[])
           AND coalesce(bool_and(d.hold = 0 OR l.spent + d.dr + d.du + d.hold <= d.lim), true)
           AS ok
    FROM locked l JOIN d ON l.cap = d.c AND l.window_key = d.w),
moved AS (
    UPDATE governance.spend s SET reserved_micros = s.reserved_micros + d.dr + d.hold,
        used_micros = s.used_micros + d.du
    FROM d, fits WHERE fits.ok AND s.tenant = $1 AND s.cap = d.c AND s.window_key = d.w
    RETURNING 1)
SELECT count(*) FROM moved
"""


class CapRaced(RetryableError):
    """A hold that fitted when read no longer fits under the lock: a concurrent step of the
    tenant took the room. The transaction is rolled back and tried again."""


async def read_caps(
    conn: asyncpg.Connection, tenant: str, caps: list[str], windows: list[str]
) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]]]:
    """What each cap's window holds and settled, as committed now (no lock; 0 where it has
    no row yet), and the windows with no row."""
    rows = await conn.fetch(_READ, tenant, caps, windows)
    spent = {(c, w): 0 for c, w in zip(caps, windows, strict=True)}
    new = set(spent)
    for r in rows:
        key = (r["cap"], r["window_key"])
        spent[key] = r["reserved_micros"] + r["used_micros"]
        new.discard(key)
    return spent, new


class CapMoves:
    """What one transaction moves on one tenant's cap rows, applied by `apply`."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        # (cap, window) -> [reserved change, used change, new hold, limit].
        self._moves: dict[tuple[str, str], list[int]] = {}
        self._new: set[tuple[str, str]] = set()

    def move(self, caps: list[str], windows: list[str], *, reserved: int, used: int) -> None:
        """A settlement's or a credit's change to each of these caps' windows."""
        for key in zip(caps, windows, strict=True):
            entry = self._moves.setdefault(key, [0, 0, 0, 0])
            entry[0] += reserved
            entry[1] += used

    def pending(self, cap: str, window: str) -> int:
        """What this transaction's settlements change of the window's spend so far."""
        entry = self._moves.get((cap, window))
        return 0 if entry is None else entry[0] + entry[1]

    def hold(
        self,
        caps: list[str],
        windows: list[str],
        limits: list[int],
        worst: int,
        new: set[tuple[str, str]],
    ) -> None:
        """Hold `worst` against each cap, if it still fits `limits` once locked; `new`: the
        windows that had no row when read."""
        for key, limit in zip(zip(caps, windows, strict=True), limits, strict=True):
            entry = self._moves.setdefault(key, [0, 0, 0, 0])
            entry[2] += worst
            entry[3] = limit
        self._new |= new

    async def apply(self, conn: asyncpg.Connection) -> None:
        """Move the rows, locked in cap order, in one statement (the transaction's last).

        Raises:
            CapRaced: a hold no longer fits; nothing moved (roll back and try again).
        """
        if not self._moves:
            return
        keys = sorted(self._moves)
        caps, windows = [c for c, _ in keys], [w for _, w in keys]
        if self._new:
            new = sorted(self._new)
            await conn.execute(_ENSURE, self.tenant, [c for c, _ in new], [w for _, w in new])
        columns = list(zip(*(self._moves[k] for k in keys), strict=True))
        moved = await conn.fetchval(_APPLY, self.tenant, caps, windows, *map(list, columns))
        if moved != len(keys):
            raise CapRaced("a spend cap's room was taken meanwhile", delay=0.0)
