"""The deployment's NATS permissions, as data (the e2e suite shows the server enforces them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from libs.natsauth import (
    ADMIN,
    AUDIT_ACCOUNT,
    AUDIT_ADMIN,
    EVAL,
    JOURNALED,
    PROVISION,
    PROVISION_AUDIT,
    SEAL_JS_API,
    SERVICE_SUBJECTS,
    WRIT_ACCOUNT,
    accounts,
    auth_config,
    host_account,
    host_user,
    identity_table,
    permissions,
    seal_account,
    seal_user,
    users,
)
from libs.provision import BUCKETS
from schemas import subjects


def _allowed(perms: dict, kind: str) -> list[str]:
    return perms[kind]["allow"]


def test_a_host_may_use_only_its_own_tenants_subjects() -> None:
    perms = permissions(["acme", "globex"])
    acme = perms[host_user("acme")]
    assert acme is not None
    published = _allowed(acme, "publish")
    for subject in published:
        assert "globex" not in subject
        assert not subject.startswith(("writ.int.", "writ.cmd.", "writ.events.", "_INBOX"))
        assert "*" not in subject.split(".")[:2] and ">" not in subject.split(".")[:3]
    assert "writ.in.requests.acme" in published and "writ.in.requests.*" not in published
    subscribed = _allowed(acme, "subscribe")
    assert subscribed == ["writ.out.results.acme", "writ.events.planner.acme", "_INBOX.host-acme.>"]


def test_services_reach_only_their_own_consumer_and_inbox() -> None:
    perms = permissions(["acme"])
    for name in SERVICE_SUBJECTS:
        service = perms[name]
        assert service is not None
        published = _allowed(service, "publish")
        # A service reads no stored message (but ingress its buckets: the HTTP door's
        # Idempotency-Key answers, who first used each id, the console's sessions): its
        # sealer reads the record, as itself.
        if name == "ingress":
            published = [s for s in published if not any(f"KV_{b.bucket}" in s for b in BUCKETS)]
        assert not [
            s
            for s in published
            if s.startswith("$JS.API.STREAM.MSG")
            or s.startswith("$JS.API.DIRECT")
            or s.endswith(".>")
            and "CONSUMER" in s
            and f".{name}." not in s
        ]
        assert not [s for s in published if s in (">", "writ.>", "$JS.API.>")]
        assert _allowed(service, "subscribe")[-1] == f"_INBOX.{name}.>"
    assert perms[ADMIN] is None


def test_every_user_has_a_password_in_the_block() -> None:
    text = auth_config({u: f"pw-{u}" for u in users(["acme"])}, ["acme"])
    for user in users(["acme"]):
        assert f'"user": "{user}"' in text and f'"pw-{user}"' in text


def test_only_the_planner_hears_admitted_progress_and_nobody_else_publishes_it() -> None:
    perms = permissions(["acme"])
    hearing = {
        name
        for name in SERVICE_SUBJECTS
        if "writ.int.admitted.*" in _allowed(perms[name] or {}, "subscribe")
    }
    assert hearing == {"planner"}  # a chat session's StepAdmitted
    publishing = {
        name
        for name in SERVICE_SUBJECTS
        if "writ.int.admitted.*" in _allowed(perms[name] or {}, "publish")
    }
    assert publishing == {"admission"}
    host = perms[host_user("acme")]
    assert host is not None
    assert not [s for s in _allowed(host, "subscribe") if s.startswith("writ.int.")]


def test_only_a_journals_sealer_reaches_its_record() -> None:
    perms = permissions(["acme"])
    # No runtime identity of Writ's account names the record, nor does any host.
    for name in (*SERVICE_SUBJECTS, EVAL, host_user("acme")):
        published = _allowed(perms[name] or {}, "publish")
        assert not [s for s in published if "AUDIT" in s or "audit" in s], name
    for service in JOURNALED:
        sealer = perms[seal_user(service)]
        assert sealer is not None
        assert _allowed(sealer, "publish") == [
            f"writ.audit.checkpoints.{service}",
            f"{SEAL_JS_API}.STREAM.MSG.GET.WRIT_AUDIT",
        ]
        assert _allowed(sealer, "subscribe") == [f"_INBOX.{seal_user(service)}.>"]
    found: dict[str, Any] = accounts({u: "pw" for u in users(["acme"])}, ["acme"])
    audit = found[AUDIT_ACCOUNT]
    assert audit["jetstream"] == "enabled"
    assert {u["user"] for u in audit["users"]} == {PROVISION_AUDIT, AUDIT_ADMIN}
    # Each journal's subject goes to its sealer's account alone; Writ's imports nothing.
    for export in audit["exports"]:
        subject = export["service"]
        if subject.startswith("writ.audit.checkpoints."):
            assert export["accounts"] == [seal_account(subject.rsplit(".", 1)[1])]
        else:
            assert subject == "$JS.API.STREAM.MSG.GET.WRIT_AUDIT"
    assert "imports" not in found[WRIT_ACCOUNT]
    for service in JOURNALED:
        account = found[seal_account(service)]
        assert "jetstream" not in account  # no acknowledgement is ever published in it
        assert [u["user"] for u in account["users"]] == [seal_user(service)]
        assert [(i["service"]["subject"], i["to"]) for i in account["imports"]] == [
            (f"writ.audit.checkpoints.{service}",) * 2,
            ("$JS.API.STREAM.MSG.GET.WRIT_AUDIT", f"{SEAL_JS_API}.STREAM.MSG.GET.WRIT_AUDIT"),
        ]


def test_the_shadow_evaluation_cannot_reach_admission_or_the_dispatcher() -> None:
    from libs.natsauth import EVAL
    from schemas import subjects

    perms: dict[str, Any] | None = permissions(["acme"])[EVAL]
    assert perms is not None and EVAL in users(["acme"])
    published = _allowed(perms, "publish")
    assert perms["publish"]["deny"] == ["writ.int.>", "writ.cmd.>", "writ.in.>", "writ.out.>"]
    # No endpoint of governance, admission or the dispatcher, no stream it could declare.
    for subject in (
        subjects.DECIDE,
        subjects.DECIDE_BATCH,
        subjects.ANSWER,
        subjects.FACTS,
        subjects.RECONCILE,
        subjects.REGISTER_RUN,
        "writ.cmd.acme",
    ):
        assert subject not in published
    assert not [s for s in published if ".STREAM.CREATE." in s or ".STREAM.UPDATE." in s]
    assert [s for s in published if "CONSUMER" in s and ".WRIT_INT.eval" not in s] == []
    assert _allowed(perms, "subscribe") == ["writ.eval.>", "_INBOX.eval.>"]


def test_facts_are_asked_by_admission_and_the_planner_and_answered_by_their_readers() -> None:
    from schemas import subjects

    perms = permissions(["acme"])
    for subject, reader in ((subjects.FACTS, "dispatcher"), (subjects.HOST_FACTS, "retrieval")):
        asking = {
            name for name in SERVICE_SUBJECTS if subject in _allowed(perms[name] or {}, "publish")
        }
        # A plan step's preview (the planner) and a proposal's (admission); nobody else.
        assert asking == {"admission", "planner"}, subject
        answering = {
            name for name in SERVICE_SUBJECTS if subject in _allowed(perms[name] or {}, "subscribe")
        }
        assert answering == {reader}
        host = perms[host_user("acme")]
        assert host is not None and subject not in _allowed(host, "publish")
    # What the planner asks for is the facts, never the connector: it may not reach the
    # dispatcher's inbox or the commands' subjects.
    planner = perms["planner"]
    assert planner is not None
    assert not [s for s in _allowed(planner, "publish") if s.startswith("writ.cmd")]


def test_only_ingress_registers_a_run_with_grants_and_only_the_planner_a_turn() -> None:
    from schemas import subjects

    perms = permissions(["acme"])
    for subject, sender in (
        (subjects.REGISTER_RUN, "ingress"),
        (subjects.REGISTER_TURN, "planner"),
    ):
        senders = {
            name for name in SERVICE_SUBJECTS if subject in _allowed(perms[name] or {}, "publish")
        }
        assert senders == {sender}, subject
        governance = perms["governance"]
        assert governance is not None and subject in _allowed(governance, "subscribe")


# JetStream's management API: what creates, changes or removes a stream or a consumer.
_MANAGEMENT = (
    "$JS.API.STREAM.CREATE.",
    "$JS.API.STREAM.UPDATE.",
    "$JS.API.STREAM.DELETE.",
    "$JS.API.STREAM.PURGE.",
    "$JS.API.STREAM.MSG.DELETE.",
    "$JS.API.CONSUMER.CREATE.",
    "$JS.API.CONSUMER.DURABLE.CREATE.",
    "$JS.API.CONSUMER.DELETE.",
)


def test_no_runtime_identity_may_manage_a_stream_or_create_a_durable_consumer() -> None:
    perms = permissions(["acme", "globex"])
    runtime = [
        *SERVICE_SUBJECTS,
        EVAL,
        host_user("acme"),
        host_user("globex"),
        *(seal_user(s) for s in JOURNALED),
    ]
    for name in runtime:
        published = _allowed(perms[name] or {}, "publish")
        managing = [s for s in published if s.startswith(_MANAGEMENT) or s.startswith("$JS.API.>")]
        # ingress reads chat sessions with ordered consumers: ephemeral, unnamed.
        expected = ["$JS.API.CONSUMER.CREATE.WRIT_CHAT"] if name == "ingress" else []
        assert managing == expected, (name, managing)
        assert "allow_responses" not in (perms[name] or {}), name
    assert _allowed(perms[PROVISION] or {}, "publish") == ["$JS.API.>"]


def test_services_answer_on_inboxes_only() -> None:
    perms = permissions(["acme"])
    for name in SERVICE_SUBJECTS:
        published = _allowed(perms[name] or {}, "publish")
        assert "_INBOX.>" in published and "_R_.>" in published
        # Nothing else a reply could be steered to that JetStream would take as a request.
        assert not [
            s
            for s in published
            if s.startswith("$JS.API.")
            and "INFO" not in s
            and "MSG.NEXT" not in s
            and "MSG.GET" not in s
            and "DIRECT.GET" not in s
            and s != "$JS.API.CONSUMER.CREATE.WRIT_CHAT"
        ], name


def test_each_tenants_host_has_an_account_importing_its_contract_only() -> None:
    found: dict[str, Any] = accounts(
        {u: "pw" for u in users(["acme", "globex"])}, ["acme", "globex"]
    )
    assert set(found) == {
        WRIT_ACCOUNT,
        host_account("acme"),
        host_account("globex"),
        AUDIT_ACCOUNT,
        *(seal_account(s) for s in JOURNALED),
    }
    writ = found[WRIT_ACCOUNT]
    assert {u["user"] for u in writ["users"]} == {ADMIN, PROVISION, EVAL, *SERVICE_SUBJECTS}
    for tenant, other in (("acme", "globex"), ("globex", "acme")):
        account = found[host_account(tenant)]
        assert [u["user"] for u in account["users"]] == [host_user(tenant)]
        imported = [
            (kind, i[kind]["subject"])
            for i in account["imports"]
            for kind in ("service", "stream")
            if kind in i
        ]
        # JetStream's API under a prefix of the host's own (the server answers `$JS.API.>`
        # itself in an account without JetStream).
        assert {i["to"] for i in account["imports"] if "to" in i and "$JS" in i["to"]} == {
            f"$JS.WRIT.API.{api}.WRIT_OUT_{tenant}{tail}"
            for api, tail in (
                ("STREAM.INFO", ""),
                ("STREAM.MSG.GET", ""),
                ("DIRECT.GET", ""),
                ("DIRECT.GET", ".>"),
            )
        }
        for kind, subject in imported:
            assert tenant in subject and other not in subject
            assert not subject.startswith(_MANAGEMENT) and "CONSUMER" not in subject
            assert kind in ("service", "stream")
        assert ("service", "writ.in.requests." + tenant) in imported
        assert ("stream", "writ.out.results." + tenant) in imported
        # Writ exports each of them to this tenant's account alone.
        exported = {
            e.get("service") or e.get("stream")
            for e in writ["exports"]
            if e["accounts"] == [host_account(tenant)]
        }
        assert exported == {subject for _, subject in imported}
    assert all(len(e["accounts"]) == 1 for e in writ["exports"])


def test_each_service_may_dead_letter_from_every_consumer_it_fetches_from() -> None:
    # The actor dead-letters on `writ.dlq.<durable>`: a consumer whose owner may not publish
    # there retries its dead letter forever, and a poison message or an outage past the
    # limit is never given up on (ingress's consumer of run requests was one).
    perms = permissions(["acme", "globex"])
    fetched = []
    for name in SERVICE_SUBJECTS:
        service = perms[name]
        assert service is not None
        published = _allowed(service, "publish")
        for subject in published:
            if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
                durable = subject.rsplit(".", 1)[1]
                fetched.append(durable)
                assert subjects.dead_letter(durable) in published, (name, durable)
    assert {"ingress", "ingress-runs", "planner", "dispatcher"} <= set(fetched)


def test_the_bus_page_shows_the_identities_as_the_code_defines_them() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "bus.md").read_text()
    shown = page.split("<!-- identities:begin -->\n", 1)[1].split("<!-- identities:end -->")[0]
    # Regenerate: python -c "from libs.natsauth import identity_table; print(identity_table())"
    assert shown == identity_table()


def test_a_journaled_service_connecting_as_a_user_needs_its_sealers_password() -> None:
    import anyio

    from libs.errors import ConfigError
    from libs.runtime import record_connection
    from libs.settings import BaseSettings

    authenticated = BaseSettings(nats_url="nats://127.0.0.1:1", nats_user="planner")
    with pytest.raises(ConfigError, match="seal-planner"):
        anyio.run(record_connection, "planner", authenticated)
    # No second connection where there is no record to reach, or no authentication at all.
    assert anyio.run(record_connection, "retrieval", authenticated) is None
    assert anyio.run(record_connection, "planner", BaseSettings(nats_url="nats://x:1")) is None
