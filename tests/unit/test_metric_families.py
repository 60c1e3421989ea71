"""The metric families every service shares: the service a label, a consumer's counters at 0
from the first time it is named, the process and the interpreter exported, no `*_created`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from libs.telemetry import ALERTED_OUTCOMES, ActorMetrics, service_registry


def test_a_consumer_named_once_exports_every_counter_an_alert_reads_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = ActorMetrics(service="planner", registry=registry)
    metrics.redelivered.labels("planner")  # what the actor loop does as it starts
    sample = registry.get_sample_value
    for outcome in ALERTED_OUTCOMES:
        labels = {"service": "planner", "consumer": "planner", "outcome": outcome}
        assert sample("writ_messages_failed_total", labels) == 0.0, outcome
    for name in ("handled", "dead_lettered", "waiting", "redelivered"):
        labels = {"service": "planner", "consumer": "planner"}
        assert sample(f"writ_messages_{name}_total", labels) == 0.0, name
    # An endpoint named by its dropped-request counter is declared as well.
    metrics.requests_dropped.labels("replay", "expired")
    assert sample("writ_messages_handled_total", {"service": "planner", "consumer": "replay"}) == 0
    metrics.failed.labels("planner", "outage_exhausted").inc()
    labels = {"service": "planner", "consumer": "planner", "outcome": "outage_exhausted"}
    assert sample("writ_messages_failed_total", labels) == 1.0


def test_a_service_registry_exports_the_process_and_the_build_and_no_created() -> None:
    registry = service_registry("governance", version="1.2.3")
    ActorMetrics(service="governance", registry=registry).handled.labels("governance").inc()
    text = generate_latest(registry).decode()
    assert "process_open_fds" in text
    assert "python_info{" in text
    assert 'writ_build_info{service="governance",version="1.2.3"} 1.0' in text
    assert "_created" not in text
