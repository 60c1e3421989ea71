"""What an SRE reads from `/metrics`: the metrics dashboards and alerts are written
against, each in the service that owns it, and not one label value that could grow without
bound (an id, a tenant, a principal).

It drives one run and one host command through the session deployment, then scrapes the six
services as the real processes they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import anyio
import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from libs.natsauth import SERVICE_SUBJECTS
from tests.e2e.conftest import Host
from writ.stack import SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# Gauges read from JetStream and Postgres are refreshed every ~5 s.
REFRESH_WAIT_S = 15.0

# (`endpoint`: a request/reply endpoint's name, fixed in code.)
ALLOWED_LABELS = frozenset(
    {
        "consumer",
        "outcome",
        "line",
        "verdict",
        "state",
        "connector",
        "result",
        "tool",
        "status",
        "check",
        "budget",
        "le",
        "quantile",
        "reason",
        "endpoint",
        "service",  # the service exporting it: one of six
        "version",  # writ_build_info's: Writ's release
        "route",  # the HTTP door's route template, never a path with ids in it
        "method",  # an HTTP method
        "code",  # an HTTP status code
        "cap",  # a spend cap's name, set by the operator's signed price table
    }
)
TENANTS = ("acme", "globex", "initech")
PRINCIPALS = ("alice@acme.example",)
UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
LONG_HEX = re.compile(r"[0-9a-f]{12,}", re.I)  # request ids, digests, hex-encoded ids
COMMAND_STATES = (
    "pending",
    "dispatching",
    "succeeded",
    "denied",
    "expired",
    "revision_required",
    "unknown",
    "failed",
)
ATTEMPT_RESULTS = ("succeeded", "failed", "transient", "lost", "revision_required")

Samples = dict[str, list[Sample]]


async def scrape(stack: Stack, name: str) -> Samples:
    """Every sample a service exports, by sample name (`..._total`, `..._bucket`, ...)."""
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"http://127.0.0.1:{stack.metrics_port(name)}/metrics")
    response.raise_for_status()
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


async def scrape_all(stack: Stack) -> dict[str, Samples]:
    return {name: await scrape(stack, name) for name in SERVICES}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The value of the one sample named `name` with exactly these labels."""
    found = [s.value for s in samples.get(name, []) if s.labels == labels]
    assert len(found) == 1, f"{name}{labels} not exported once: {samples.get(name)}"
    return found[0]


def labelsets(samples: Samples, name: str) -> list[dict[str, str]]:
    return [s.labels for s in samples.get(name, [])]


async def eventually(
    stack: Stack, check: Callable[[dict[str, Samples]], bool]
) -> dict[str, Samples]:
    """Scrape until `check` holds (gauges refresh every few seconds), then return the scrape."""
    with anyio.fail_after(REFRESH_WAIT_S):
        while True:
            scraped = await scrape_all(stack)
            if check(scraped):
                return scraped
            await anyio.sleep(0.5)


def unbounded(value: str) -> str | None:
    """Why a label value looks like it comes from an unbounded set, or None."""
    lowered = value.lower()
    if UUID.search(value):
        return "a UUID"
    if ":" in value or "@" in value:
        return "an id (':' or '@')"
    if len(value) > 64:
        return "longer than 64 characters"
    if LONG_HEX.search(value):
        return "a long hex id"
    if any(tenant in lowered for tenant in TENANTS):
        return "a tenant's name"
    if lowered in PRINCIPALS:
        return "a principal"
    return None


@pytest.fixture
async def driven(stack: Stack, host: Host) -> None:
    """One run and one host command, both through to success."""
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    command = host.command()
    await host.submit(command)
    result = await host.wait_result(request.request_id)
    assert result.status == "succeeded", result
    outcome = await host.wait_command(command.request_id)
    assert outcome.status == "succeeded", outcome


async def test_every_service_exports_what_operators_alert_on(stack: Stack, driven: None) -> None:
    scraped = await eventually(
        stack, lambda s: value(s["admission"], "writ_admission_commands", state="succeeded") >= 2
    )

    # The actor loop, in every service with an inbox (the durable is named after the service);
    # retrieval has none and answers requests only, a run's evidence search among them.
    for name in SERVICES:
        if SERVICE_SUBJECTS[name][0] == "":
            assert not labelsets(scraped[name], "writ_consumer_pending")
            continue
        samples, consumer = scraped[name], name
        assert (
            value(samples, "writ_messages_redelivered_total", service=name, consumer=consumer) >= 0
        )
        assert (
            value(samples, "writ_messages_dead_lettered_total", service=name, consumer=consumer)
            >= 0
        )
        assert value(samples, "writ_consumer_pending", service=name, consumer=consumer) >= 0
        assert value(samples, "writ_consumer_ack_pending", service=name, consumer=consumer) >= 0

    assert (
        value(
            scraped["retrieval"],
            "writ_messages_handled_total",
            service="retrieval",
            consumer="search",
        )
        >= 1
    )

    governance = scraped["governance"]
    assert value(governance, "writ_governance_decisions_total", line="5", verdict="allow") >= 1
    for labels in labelsets(governance, "writ_governance_decisions_total"):
        assert set(labels) == {"line", "verdict"}
        assert labels["line"] in {"1", "2", "3", "4", "5", "6"}
        assert labels["verdict"] in {"allow", "deny", "ask"}

    admission = scraped["admission"]
    states = sorted(ls["state"] for ls in labelsets(admission, "writ_admission_commands"))
    assert states == sorted(COMMAND_STATES)
    assert all(
        value(admission, "writ_admission_commands", state=state) >= 0 for state in COMMAND_STATES
    )
    assert value(admission, "writ_admission_commands", state="succeeded") >= 2
    assert value(admission, "writ_admission_outbox_oldest_seconds") >= 0
    assert value(admission, "writ_admission_proposals_pending") >= 0

    dispatcher = scraped["dispatcher"]
    assert value(dispatcher, "writ_dispatcher_unknown_commands") >= 0
    assert (
        value(dispatcher, "writ_dispatcher_attempts_total", connector="crm", result="succeeded")
        >= 2
    )
    for labels in labelsets(dispatcher, "writ_dispatcher_attempts_total"):
        assert set(labels) == {"connector", "result"}
        assert labels["connector"] in {"crm", "payments", "host", "noop", "local", "none"}
        assert labels["result"] in ATTEMPT_RESULTS
    assert value(dispatcher, "writ_dispatcher_breaker_state", tool="crm.note.create") == 0

    planner = scraped["planner"]
    assert value(planner, "writ_planner_runs_finished_total", status="succeeded") >= 1
    statuses = {ls["status"] for ls in labelsets(planner, "writ_planner_runs_finished_total")}
    assert statuses <= {"succeeded", "failed", "awaiting_human", "cancelled"}
    assert value(planner, "writ_planner_budget_exhaustions_total") >= 0

    # Each journal's sealer: nothing refused or rejected in an untouched deployment, and a
    # round completed lately (what WritJournalSealRefused, ...RowRejected, ...SealerStalled read).
    for name in ("governance", "planner", "admission", "dispatcher"):
        samples = scraped[name]
        for reason in ("head_differs", "seal_past_checkpoint", "record_missing", "record_short"):
            assert (
                value(samples, "writ_journal_seal_refusals_total", service=name, reason=reason) == 0
            )
        for reason in ("unauthentic", "late"):
            assert (
                value(samples, "writ_journal_rows_rejected_total", service=name, reason=reason) == 0
            )
        assert value(samples, "writ_journal_sealer_ok_timestamp_seconds", service=name) > 0

    # Every service: the process and the interpreter, which version runs, and no `*_created`.
    for name in SERVICES:
        samples = scraped[name]
        assert value(samples, "process_open_fds") > 0
        assert value(samples, "process_resident_memory_bytes") > 0
        assert labelsets(samples, "python_info")
        assert [ls["service"] for ls in labelsets(samples, "writ_build_info")] == [name]
        assert not [n for n in samples if n.endswith("_created")], sorted(samples)


async def test_backlog_gauges_follow_postgres(
    stack: Stack, driven: None, db: asyncpg.Connection
) -> None:
    """The admission and dispatcher gauges say what the tables say (once refreshed)."""
    states = {
        r["state"]: r["n"]
        for r in await db.fetch(
            "SELECT state, count(*) AS n FROM admission.commands GROUP BY state"
        )
    }

    def caught_up(s: dict[str, Samples]) -> bool:
        # Only commands that have stopped moving: the other states may change meanwhile.
        return all(
            value(s["admission"], "writ_admission_commands", state=state) >= states.get(state, 0)
            for state in ("succeeded", "failed", "denied")
        )

    scraped = await eventually(stack, caught_up)
    unknown = await db.fetchval("SELECT count(*) FROM admission.commands WHERE state = 'unknown'")
    # `unknown` only leaves through reconciliation, which nothing here does.
    assert value(scraped["dispatcher"], "writ_dispatcher_unknown_commands") >= unknown


async def test_no_label_is_unbounded(stack: Stack, driven: None) -> None:
    scraped = await scrape_all(stack)
    problems = []
    for name, samples in scraped.items():
        writ = {k: v for k, v in samples.items() if k.startswith("writ_")}
        assert writ, f"{name} exports no writ_ metric"
        for sample in (s for group in writ.values() for s in group):
            if extra := set(sample.labels) - ALLOWED_LABELS:
                problems.append(f"{name}: {sample.name} has label(s) {sorted(extra)}")
            if sample.labels.get("service", name) != name:
                problems.append(f"{name}: {sample.name} claims {sample.labels['service']}")
            for label, text in sample.labels.items():
                if why := unbounded(text):
                    problems.append(f"{name}: {sample.name}{{{label}={text!r}}} is {why}")
    assert not problems, "\n".join(problems)
