"""Provisioning makes each consumer as the service that binds to it describes it."""

from __future__ import annotations

from libs.natsauth import EVAL, SERVICE_SUBJECTS
from libs.provision import EVAL_DURABLE, consumers
from schemas import subjects
from services.admission.service import INBOX as ADMISSION
from services.dispatcher.service import inbox as dispatcher_inbox
from services.governance.service import INBOX as GOVERNANCE
from services.ingress.service import inbox as ingress_inbox
from services.ingress.service import runs_inbox
from services.planner.service import INBOX as PLANNER
from writ.eval._shadow import EVIDENCE_COPY


def _server_side(spec):  # what the server holds of a spec: the rest is the process's
    return (spec.stream, spec.durable, spec.filter_subjects, spec.ack_wait_s, spec.deliver_new)


def test_every_service_binds_to_the_consumer_provisioning_makes() -> None:
    made = {
        (c.stream, c.durable): _server_side(c) for c in consumers(["acme"], dispatcher_lease_s=7)
    }
    for spec in (ADMISSION, GOVERNANCE, PLANNER, dispatcher_inbox(7)):
        assert made.pop((spec.stream, spec.durable)) == _server_side(spec)
    for spec in (ingress_inbox("acme"), runs_inbox("acme")):
        assert made.pop((spec.stream, spec.durable)) == _server_side(spec)
    [(key, shadow)] = made.items()
    assert key == ("WRIT_INT", EVAL_DURABLE) == ("WRIT_INT", EVAL)
    assert shadow[2] == (EVIDENCE_COPY,) and shadow[4]  # only what starts after it exists


def test_each_consuming_service_has_its_consumer_in_its_permissions() -> None:
    for spec in consumers(["acme"]):
        service = spec.durable.removesuffix("-runs")
        if service in SERVICE_SUBJECTS:
            stream, _, _ = SERVICE_SUBJECTS[service]
            assert stream in (spec.stream, None), spec


def test_a_tenants_run_requests_have_a_consumer_of_their_own() -> None:
    # Ingress's two consumers on a tenant's host stream share nothing and miss nothing: no
    # burst of commands queues a run's start behind it.
    others, runs = ingress_inbox("acme"), runs_inbox("acme")
    assert runs.filter_subjects == (subjects.request("acme"),)
    assert set(others.filter_subjects).isdisjoint(runs.filter_subjects)
    assert set(others.filter_subjects) | set(runs.filter_subjects) == set(
        subjects.host_subjects("acme")
    )
    assert (runs.stream, runs.durable) == (subjects.in_stream("acme"), "ingress-runs")
