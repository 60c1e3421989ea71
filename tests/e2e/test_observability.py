"""The dashboard and alerts in deploy/observability/ are well formed, and every metric they
query is one the six services really export.

The second half drives one run through the session deployment, scrapes the six services'
`/metrics`, and checks each `writ_...` name that a dashboard query or an alert expression uses.
A renamed or missing metric fails here, by name, instead of as a dashboard or alert that stays
blank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from libs.natsauth import SERVICE_SUBJECTS
from tests.e2e.conftest import Host
from writ.stack import JOURNALS, SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

OBSERVABILITY = Path(__file__).resolve().parents[2] / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "writ-dashboard.json"
ALERTS = OBSERVABILITY / "writ-alerts.yaml"

# The services with a durable consumer (retrieval answers requests only).
CONSUMING = {
    name for name, (stream, _, _) in SERVICE_SUBJECTS.items() if name in SERVICES and stream != ""
}

# Gauges read from JetStream and Postgres are refreshed every ~5 s.
REFRESH_WAIT_S = 15.0

# A metric name in PromQL: `writ_` and then name characters, not preceded by a name character
# (so `foo_writ_x` is not picked up).
METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])writ_[A-Za-z0-9_:]+")
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
SEVERITIES = frozenset({"page", "ticket"})
# The sample names each metric type exposes, given a family's name (the parser strips
# `_total` from counters).
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def alerts() -> dict[str, Any]:
    return yaml.safe_load(ALERTS.read_text())


def data_panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel that shows data, including those inside a collapsed row.

    Rows only lay the others out, so they have no queries.
    """
    found = []
    for panel in panels:
        if panel.get("type") == "row":
            found.extend(data_panels(panel.get("panels", [])))
        else:
            found.append(panel)
    return found


def rules() -> list[dict[str, Any]]:
    return [rule for group in alerts()["groups"] for rule in group["rules"]]


def expressions() -> list[tuple[str, str]]:
    """(where, expr) for every dashboard query and every alert expression."""
    found = [
        (f"dashboard panel {panel.get('title')!r} target {target.get('refId')}", target["expr"])
        for panel in data_panels(dashboard()["panels"])
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    found += [
        (f"alert {rule['alert']} ({rule.get('labels', {}).get('service', 'writ')})", rule["expr"])
        for rule in rules()
    ]
    return found


def referenced() -> dict[str, list[str]]:
    """Every metric name used in an expression, with the places that use it."""
    names: dict[str, list[str]] = {}
    for where, expr in expressions():
        for name in METRIC_NAME.findall(expr):
            names.setdefault(name, []).append(where)
    return names


# --- The files themselves --------------------------------------------------------------------


def test_dashboard_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["title"] and board["uid"]
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    every = board["panels"] + [p for row in board["panels"] for p in row.get("panels", [])]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    assert all(p.get("title") for p in every), "a panel or row has no title"

    panels = data_panels(board["panels"])
    assert panels
    problems = []
    for panel in panels:
        title = panel.get("title") or f"panel {panel.get('id')}"
        if not panel.get("title"):
            problems.append(f"{title}: no title")
        if not panel.get("description"):
            problems.append(f"{title}: no description")
        if not {"h", "w", "x", "y"} <= set(panel.get("gridPos", {})):
            problems.append(f"{title}: no gridPos")
        targets = panel.get("targets") or []
        if not any(isinstance(t.get("expr"), str) and t["expr"].strip() for t in targets):
            problems.append(f"{title}: no target with an expr")
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{title}: not on the ${{datasource}} variable")
        ref_ids = [t.get("refId") for t in targets]
        if len(ref_ids) != len(set(ref_ids)) or None in ref_ids:
            problems.append(f"{title}: refIds missing or repeated: {ref_ids}")
    assert not problems, "\n".join(problems)


def test_alerts_are_a_prometheus_rule_file() -> None:
    document = alerts()
    assert set(document) == {"groups"}, f"top-level keys: {sorted(document)}"
    groups = document["groups"]
    assert isinstance(groups, list) and groups
    names = [group["name"] for group in groups]
    assert len(names) == len(set(names)), f"group names repeat: {names}"

    problems, seen = [], set()
    for group in groups:
        assert isinstance(group["rules"], list) and group["rules"], f"{group['name']}: no rules"
        for rule in group["rules"]:
            name = rule.get("alert")
            where = f"{group['name']}/{name}"
            if not name:
                problems.append(f"{where}: not an alerting rule (no `alert`)")
            if not isinstance(rule.get("expr"), str) or not rule["expr"].strip():
                problems.append(f"{where}: no expr")
            if not DURATION.match(str(rule.get("for", ""))):
                problems.append(f"{where}: `for` is {rule.get('for')!r}, not a duration")
            labels = rule.get("labels") or {}
            if labels.get("severity") not in SEVERITIES:
                problems.append(f"{where}: labels.severity is {labels.get('severity')!r}")
            annotations = rule.get("annotations") or {}
            if not annotations.get("summary"):
                problems.append(f"{where}: no annotations.summary")
            if not annotations.get("description"):
                problems.append(f"{where}: no annotations.description")
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                problems.append(f"{where}: the same alert and labels twice")
            seen.add(key)
    assert not problems, "\n".join(problems)

    # What the on-call rota relies on.
    by_name: dict[str, list[dict[str, Any]]] = {}
    for rule in rules():
        by_name.setdefault(rule["alert"], []).append(rule)
    unknown = by_name["WritUnknownCommands"]
    assert [(r["for"], r["labels"]["severity"]) for r in unknown] == [("10m", "page")]
    assert "writ_dispatcher_unknown_commands" in unknown[0]["expr"]
    assert by_name["WritProposalsAwaitingPerson"][0]["labels"]["severity"] == "ticket"
    # Written once for every service: the service is a label of the series, not of the rule.
    for per_service in (
        "WritDeadLetters",
        "WritConsumerBacklog",
        "WritConsumerAckPendingGrowing",
        "WritHandlerErrors",
        "WritEndpointFallingBehind",
        "WritJournalSealRefused",
        "WritJournalRowRejected",
        "WritJournalSealerStalled",
    ):
        assert len(by_name[per_service]) == 1, per_service
        assert "service" not in by_name[per_service][0]["labels"], per_service
        assert "service" in by_name[per_service][0]["expr"], per_service
    # What a service cannot say about itself.
    for absent in ("WritServiceDown", "WritQueueWithoutConsumer", "WritJournalSealerMissing"):
        assert by_name[absent][0]["labels"]["severity"] == "page", absent
    assert "up{" in by_name["WritServiceDown"][0]["expr"]
    for name in (*JOURNALS, *CONSUMING):
        assert name in by_name["WritServiceDown"][0]["expr"], name


def test_expressions_name_metrics() -> None:
    for where, expr in expressions():
        # `up` (Prometheus's own, per scrape target) says what a service cannot: it is away.
        assert METRIC_NAME.search(expr) or "up{" in expr, f"{where} queries no metric: {expr}"


# --- Against the running services -------------------------------------------------------------


def exported_names(text: str) -> set[str]:
    """Every name a `/metrics` page exports: family names, sample names, and the sample names
    implied by each family's type.

    A labelled metric with no children yet shows only its HELP/TYPE lines, but the service has
    still registered that name.
    """
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


async def scrape_names(stack: Stack) -> dict[str, set[str]]:
    """Every exported name, by service."""
    names = {}
    async with httpx.AsyncClient(timeout=5) as client:
        for service in SERVICES:
            url = f"http://127.0.0.1:{stack.metrics_port(service)}/metrics"
            response = await client.get(url)
            response.raise_for_status()
            names[service] = exported_names(response.text)
    return names


async def test_every_queried_metric_is_exported(stack: Stack, host: Host) -> None:
    request = host.request()
    await host.publish(request, msg_id=request.request_id)
    result = await host.wait_result(request.request_id)
    assert result.status == "succeeded", result

    wanted = referenced()
    assert wanted, "no writ_ metric referenced at all"
    exported: dict[str, set[str]] = {}
    missing: set[str] = set(wanted)
    # Poll, since some gauges appear only after their first refresh. A name still missing after
    # that is a real gap, not a timing problem.
    with anyio.move_on_after(REFRESH_WAIT_S):
        while True:
            exported = await scrape_names(stack)
            everything = set().union(*exported.values())
            missing = set(wanted) - everything
            if not missing:
                break
            await anyio.sleep(0.5)

    lines = []
    for name in sorted(missing):
        users = wanted[name]
        more = f" (+{len(users) - 3} more)" if len(users) > 3 else ""
        lines.append(f"  {name}: used by {'; '.join(users[:3])}{more}")
    exported_writ = {
        s: sorted(n for n in names if n.startswith("writ_")) for s, names in exported.items()
    }
    assert not missing, (
        f"{len(missing)} metric name(s) used in deploy/observability/ are not exported by "
        f"any service after {REFRESH_WAIT_S:.0f} s:\n"
        + "\n".join(lines)
        + "\nexported writ_ names by service:\n"
        + "\n".join(f"  {s}: {', '.join(n) or '(none)'}" for s, n in exported_writ.items())
    )

    # The name also belongs to the service it is named after, not just to some service.
    misplaced = [
        f"  {name} is not exported by {name.split('_')[1]}"
        for name in sorted(wanted)
        if name.split("_")[1] in exported and name not in exported[name.split("_")[1]]
    ]
    assert not misplaced, "metric names exported by the wrong service:\n" + "\n".join(misplaced)
