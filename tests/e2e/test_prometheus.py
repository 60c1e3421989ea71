"""The dashboard and the alerts under a real Prometheus: a deployment scraped by the
`prometheus` binary (Debian's package) while it serves a little load, then every dashboard
target and every alert expression evaluated, and every series each one selects present, or
listed in `CONDITIONAL` with the condition it waits for (documented in docs/operations.md)."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from tests.e2e.conftest import Host
from writ.stack import SERVICES, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"
PROMETHEUS = shutil.which("prometheus")

# Selectors with no series in a healthy deployment under light load: each appears only when
# what it counts happens (and is exported at 0 as soon as the consumer or tool is named, where
# the counter is one an alert reads).
CONDITIONAL: dict[str, str] = {
    name: "a tenant with a signed price table (docs/budgets.md): no caps, no spend series"
    for name in (
        "writ_governance_spend_settled",
        "writ_governance_spend_held",
        "writ_governance_spend_limit",
        "writ_governance_spend_refused_total",
    )
}

SELECTOR = re.compile(r"(?<![A-Za-z0-9_:\"$])(writ_[A-Za-z0-9_:]+|up)(\{[^}]*\})?(?!\s*\()")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every dashboard target and alert, Grafana's variables filled in."""
    found = []
    dashboard = json.loads((OBSERVABILITY / "writ-dashboard.json").read_text())
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            if target.get("expr"):
                expr = (
                    target["expr"]
                    .replace("$__rate_interval", "1m")
                    .replace("$__range", "5m")
                    .replace("$__interval", "15s")
                    .replace("$namespace", ".*")  # the dashboard's variables, set to All
                    .replace("$release", ".*")
                )
                found.append((f"panel {panel.get('title')!r}", expr))
    rules = yaml.safe_load((OBSERVABILITY / "writ-alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            found.append((f"alert {rule['alert']}", rule["expr"]))
    return found


@pytest.fixture
def prometheus(stack: Stack, tmp_path: Path) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(OBSERVABILITY / "writ-alerts.yaml")],
        "scrape_configs": [
            {
                "job_name": "writ",
                "honor_labels": True,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{stack.metrics_port(name)}"],
                        "labels": {"service": name},
                    }
                    for name in SERVICES
                ],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


# One client for the hundreds of queries (a client per query spends most of its time loading
# the system's CA bundle).
_HTTP = httpx.Client(timeout=30)


def query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = _HTTP.get(f"{url}/api/v1/query", params={"query": expr}).json()
    assert answer["status"] == "success", (expr, answer)
    return list(answer["data"]["result"])


async def test_every_dashboard_target_and_alert_has_series(
    stack: Stack, host: Host, prometheus: str
) -> None:
    # A little load: runs and host commands, through to their outcomes.
    for _ in range(3):
        request = host.request()
        await host.publish(request, msg_id=request.request_id)
        command = host.command()
        await host.submit(command)
        assert (await host.wait_result(request.request_id)).status == "succeeded"
        assert (await host.wait_command(command.request_id)).status == "succeeded"
    # Every service scraped since the load, twice (rate() needs two samples).
    deadline = time.monotonic() + 120
    while len(query(prometheus, "count_over_time(up[1m]) >= 3 and up == 1")) < len(SERVICES):
        assert time.monotonic() < deadline, query(prometheus, "up")
        await anyio.sleep(1)
    await anyio.sleep(3)

    empty: dict[str, list[str]] = {}
    has_series: dict[str, bool] = {}
    for where, expr in expressions():
        query(prometheus, expr)  # every expression evaluates
        for match in SELECTOR.finditer(expr):
            selector = match.group(0)
            if selector not in has_series:
                has_series[selector] = bool(query(prometheus, selector))
            if not has_series[selector]:
                empty.setdefault(selector, []).append(where)
    unexplained = {s: w for s, w in empty.items() if s.split("{")[0] not in CONDITIONAL}
    assert not unexplained, "\n".join(f"{s}: {', '.join(w)}" for s, w in unexplained.items())
    # What is exported beside the Writ series.
    for name in SERVICES:
        assert query(prometheus, f'process_open_fds{{service="{name}"}}'), name
        assert query(prometheus, f'python_info{{service="{name}"}}'), name
        assert query(prometheus, f'writ_build_info{{service="{name}"}}'), name
    assert not query(prometheus, 'count by (__name__) ({__name__=~"writ_.*_created"})')
    assert not query(prometheus, '{__name__=~"writ_.*", exported_service!=""}')
