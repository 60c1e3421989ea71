"""`python -m bench.jsconsume URL BATCH START END`: the JetStream ceiling's consumer process.

It runs apart from the publishers, as the dispatcher runs apart from the relay, so that one
Python event loop's CPU does not bound both sides. It pulls `BATCH` messages at a time from the
`bench` consumer of `BENCH_JS`, acks each, and prints how many acks fell between the monotonic
instants START and END (CLOCK_MONOTONIC is shared by every process of the machine), and the
instant it began pulling.
"""

from __future__ import annotations

import json
import sys
import time

import anyio
import nats

__all__ = ["consume"]


async def consume(url: str, *, batch: int, start: float, end: float) -> dict[str, float]:
    """Pull and ack until END: the acks sent inside [START, END], and when pulling began."""
    nc = await nats.connect(url, name="bench-js-consumer")
    try:
        pull = await nc.jetstream().pull_subscribe_bind("bench", "BENCH_JS")
        ready = time.monotonic()
        acked = 0
        # Go on a little past END: the bench reads this process's CPU at END, and an exited
        # process has no CPU to read.
        while time.monotonic() < end + 0.5:
            try:
                msgs = await pull.fetch(batch, timeout=0.5)
            except TimeoutError:
                # nats-py raises its own TimeoutError, or asyncio's when the deadline runs out
                # between its two pull requests; both are the builtin's subclasses.
                continue
            for msg in msgs:
                await msg.ack()
                if start <= time.monotonic() <= end:
                    acked += 1
        await nc.flush()  # the last acks reach the server before we report them
        return {"acked": acked, "ready": ready}
    finally:
        await nc.close()


def main() -> None:
    """Parse the arguments, consume, print `{"acked": n, "ready": t}`."""
    url, batch, start, end = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    print(
        json.dumps(anyio.run(lambda: consume(url, batch=batch, start=start, end=end))), flush=True
    )


if __name__ == "__main__":
    main()
