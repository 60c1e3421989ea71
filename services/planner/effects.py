"""What one delivery leads to once its transaction commits: the messages to publish, each with
its `Nats-Msg-Id` (a redelivery publishes the same ones again, so nothing happens twice), or
`AGAIN` — the runtime answered a decision itself and the run decides again in a transaction of
its own — and the runs it finished, counted once the commit is done."""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["AGAIN", "Effect", "Effects", "Finished"]

# (subject, message, Nats-Msg-Id) to publish after the commit.
Effect = tuple[str, msgspec.Struct, str]
Effects = list[Effect]
# (status, error code) of each run this delivery finished, counted once its commit is done.
Finished = list[tuple[str, str | None]]
AGAIN: Final = None  # a step the runtime answered itself: decide again
