""" "No run asked the model again for a step it had recorded", checked against the fake model's
own request log (fakes/llm.py), not the planner's word for it.

Every answer of the fake model carries its serial number (`{{serial}}` in its rules), so the
decision the planner recorded names the answer it came from. A request in the log belongs to a
run by its `user_input` (each soak run and each turn has an input of its own) and to a step by
how many observations it shows. For each recorded decision, the request answered with its
serial is found in the log: a request for the same step before it is a retry (an answer lost,
cut, failed or too slow, of a step not yet recorded), which is allowed; one after it is the
model asked again for a step the run had recorded, which is the violation.

The log is in the order the fake's handler threads read the requests, not the order they were
sent: on a starved machine an attempt the planner gave up on (its 4 s timeout) can be read
after the retry that was answered and recorded. Each attempt names its call
(`X-Client-Request-Id: <call>-<attempt>`, services/planner/openai_provider/), so a request
logged after the recorded one is a violation only if it belongs to another call: an earlier
attempt of the recorded call, read late, is counted apart as a retry.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

import asyncpg

from libs.journal import DataKeys, Expired, WindowKeys, refresh, unseal
from services.planner.memory import split_memory
from services.planner.store._sql import SEALED_RUN, run_aad
from soak.deploy import TENANTS
from soak.invariant import Check

__all__ = ["ask_of", "call_of", "model_asks", "replayed"]

_SERIAL: Final = re.compile(r"model reply (\d+)")
_CRITIC: Final = "Answer under the `critic` key"


def ask_of(body: Any) -> tuple[str, int] | None:
    """(the run's input, the observations it shows) of a decision request; None for anything
    else (a critic's request, or a body that is not a chat completion)."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None
    user: str | None = None
    observations: int | None = None
    for message in body["messages"]:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            continue
        if message.get("role") == "system" and _CRITIC in content:
            return None
        if message.get("role") != "user":
            continue
        try:
            data = json.loads(content)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if isinstance(data.get("user_input"), dict):
            user = str(data["user_input"].get("request"))
        untrusted = data.get("untrusted")
        if isinstance(untrusted, dict) and isinstance(untrusted.get("observations"), list):
            observations = len(untrusted["observations"])
    return (user, observations) if user is not None and observations is not None else None


def replayed(
    log: list[dict[str, Any]], inputs: dict[str, str], steps: dict[str, list[tuple[str, Any]]]
) -> Check:
    """The check over the model's log, the runs' inputs (input -> run id) and each run's
    recorded steps in order ((kind, payload) each)."""
    result = Check("no_run_asked_the_model_again_for_a_recorded_step")
    asks: dict[tuple[str, int], list[tuple[int, int | None, str | None]]] = defaultdict(list)
    unmatched = late = 0
    for index, entry in enumerate(log):
        ask = ask_of(entry.get("body"))
        if ask is None:
            continue
        run_id = inputs.get(ask[0])
        if run_id is None:
            unmatched += 1
            continue
        asks[(run_id, ask[1])].append((index, entry.get("serial"), call_of(entry)))
    recorded = 0
    for run_id, run_steps in steps.items():
        observations = 0
        for kind, payload in run_steps:
            if kind == "observation":
                observations += 1
                continue
            if kind != "decision":
                continue
            found = _SERIAL.search(json.dumps(payload))
            if found is None:
                continue  # not an answer of the fake's rules (none in the soak)
            recorded += 1
            serial = int(found.group(1))
            mine = asks.get((run_id, observations), [])
            at, call = next(((i, c) for i, s, c in mine if s == serial), (None, None))
            if at is None:
                result.fail(
                    f"run {run_id} step {observations} recorded answer {serial}, "
                    "which the model's log does not show for that step"
                )
                continue
            after = [c for i, _, c in mine if i > at]
            again = [c for c in after if c is None or c != call]
            late += len(after) - len(again)
            if again:
                result.fail(
                    f"run {run_id} step {observations}: the model was asked again "
                    f"{len(again)} time(s) after answer {serial} was recorded"
                )
    total = sum(len(v) for v in asks.values())
    result.examined = recorded
    result.note = (
        f"{total} decision requests in the model's log for {recorded} recorded "
        f"decisions: {total - recorded} retries of steps not yet recorded"
        + (f", {late} of them logged after their call's answer" if late else "")
        + (f"; {unmatched} requests of no soak run" if unmatched else "")
    )
    return result


def call_of(entry: dict[str, Any]) -> str | None:
    """The model call a logged request is an attempt of (its `X-Client-Request-Id` without
    the attempt's number); None if it named none."""
    named = (entry.get("headers") or {}).get("x-client-request-id")
    return named.rsplit("-", 1)[0] if isinstance(named, str) and "-" in named else None


async def _inputs(db: asyncpg.Connection, secrets: Path) -> list[tuple[str, str]]:
    """(run id, input) of both tenants' runs, each input opened as an administrator holding
    the planner's key file opens it (the row holds it sealed under the run's window key)."""
    rows = await db.fetch(
        "SELECT run_id::text AS run_id, input, sealed FROM planner.runs WHERE tenant = ANY($1)",
        list(TENANTS),
    )
    keys = WindowKeys(
        DataKeys.from_json((secrets / "journal-planner-data.json").read_text()), schema="planner"
    )
    await refresh(db, keys, [r["sealed"] for r in rows if r["sealed"] is not None])
    found = []
    for row in rows:
        if row["sealed"] is None:
            found.append((row["run_id"], str(row["input"])))
            continue
        opened = unseal(keys, row["sealed"], run_aad(row["run_id"]))
        if not isinstance(opened, Expired):
            found.append((row["run_id"], SEALED_RUN.decode(opened).input))
    return found


async def model_asks(db: asyncpg.Connection, log: list[dict[str, Any]], secrets: Path) -> Check:
    """`replayed` over the registry's runs of both tenants (`secrets`: the deployment's)."""
    inputs: dict[str, str] = {}
    shared: set[str] = set()
    for run_id, recorded in await _inputs(db, secrets):
        # A chat turn's input opens with the session's memory, which reaches the model as
        # earlier messages: the request it shows is the rest (`split_memory`).
        text = split_memory(recorded)[1]
        if text in inputs:
            shared.add(text)
        inputs[text] = run_id
    for text in shared:  # an input two runs share cannot name one of them
        del inputs[text]
    steps: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for row in await db.fetch(
        "SELECT run_id, kind, payload FROM planner.steps WHERE run_id = ANY($1) "
        "ORDER BY run_id, seq",
        list(inputs.values()),
    ):
        payload = row["payload"]
        steps[row["run_id"]].append(
            (row["kind"], json.loads(payload) if isinstance(payload, str) else payload)
        )
    return replayed(log, inputs, dict(steps))
