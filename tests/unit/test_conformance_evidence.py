"""What puts a command at a boundary in `writ conformance`'s K (writ/conformance/matrix.py), and
what a target deployment's settings must hold (writ/conformance/target.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from writ.conformance.matrix import CONTRACTS, at_boundary, journal_disagrees
from writ.conformance.target import Target, TargetError

OP = "0b6f6f0e-0000-4000-8000-000000000001"
KEY = f"acme:{OP}"


def _write(answered: bool = True, key: str = KEY) -> dict[str, Any]:
    return {"kind": "write", "key": key, "answered": answered}


def _at(boundary: str, held: bool, tried: list[Any], calls: list[Any], **kw: Any) -> bool:
    contract = CONTRACTS[kw.get("contract", "idempotent")]
    state = kw.get("state", "dispatching")
    held_ops = {OP} if held else set()
    return at_boundary("acme", boundary, contract, OP, held_ops, tried, calls, state)[0]


def test_before_send_needs_an_open_intent_and_no_write_under_the_key() -> None:
    assert _at("before_send", True, [(1, None)], [_write(key="acme:other")])
    assert not _at("before_send", False, [(1, None)], [])  # not held when killed
    assert not _at("before_send", True, [], [])  # no intent recorded
    assert not _at("before_send", True, [(1, None)], [_write()])  # the provider had acted


def test_after_commit_needs_a_write_writ_had_not_recorded() -> None:
    assert _at("after_commit", True, [(1, None)], [_write()])
    assert not _at("after_commit", True, [(1, None)], [])  # the call had not acted
    assert not _at("after_commit", True, [(1, "succeeded")], [_write()])  # already recorded


def test_before_ack_needs_the_outcome_recorded() -> None:
    assert _at("before_ack", True, [(1, "succeeded")], [_write()])
    assert not _at("before_ack", True, [(1, None)], [_write()])


def test_reconciling_needs_an_open_earlier_attempt_and_for_lookup_the_lookup() -> None:
    assert _at("reconciling", True, [(1, None)], [_write()])
    assert not _at("reconciling", True, [(1, "succeeded")], [_write()])
    assert not _at("reconciling", True, [(1, None)], [_write()], state="succeeded")
    lookup = {"kind": "lookup", "key": KEY, "answered": True}
    assert not _at("reconciling", True, [(1, None)], [_write()], contract="lookup")
    assert _at("reconciling", True, [(1, None)], [_write(), lookup], contract="lookup")


def test_lost_response_needs_the_providers_log_to_show_the_answer_lost() -> None:
    assert _at("lost_response", False, [], [_write(answered=False), _write()])
    assert not _at("lost_response", False, [], [_write()])


def _settings(tmp_path: Path) -> dict[str, str]:
    host = tmp_path / "acme"
    host.mkdir()
    (host / "signing.pem").write_text("key")
    (host / "nats.url").write_text("nats://host-acme:pw@127.0.0.1:4222")
    faults = tmp_path / "faults"
    faults.write_text("")
    return {
        "nats_url": "nats://admin:secret@127.0.0.1:4222",
        "database_url": "postgresql://writ@127.0.0.1/writ",
        "host_credentials": str(host),
        "crm_url": "http://127.0.0.1:8101/",
        "payments_url": "http://127.0.0.1:8102",
        "faults_file": str(faults),
    }


def test_a_target_is_read_from_arguments_over_the_environment(tmp_path: Path) -> None:
    given = _settings(tmp_path)
    environ = {"WRIT_CONFORMANCE_CRM_URL": "http://elsewhere:1"}
    target = Target.read({**given, "database_url": ""}, environ | {
        "WRIT_CONFORMANCE_DATABASE_URL": "postgresql://from-env/writ"
    })  # fmt: skip
    assert target.database_url == "postgresql://from-env/writ"
    assert target.crm_url == "http://127.0.0.1:8101"  # the argument won, its slash dropped
    assert target.tenant == "acme"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("database_url", "", "--database-url (WRIT_CONFORMANCE_DATABASE_URL)"),
        ("nats_url", "http://127.0.0.1:4222", "--nats-url: a nats|tls URL"),
        ("crm_url", "file:///etc/passwd", "--crm-url: a http|https URL"),
        ("payments_url", "http://" + "x" * 3000, "--payments-url"),
        ("host_credentials", "/nonexistent", "--host-credentials"),
        ("faults_file", "/nonexistent/faults", "--faults-file"),
    ],
)
def test_an_incomplete_or_malformed_target_is_refused(
    tmp_path: Path, name: str, value: str, says: str
) -> None:
    with pytest.raises(TargetError) as refused:
        Target.read({**_settings(tmp_path), name: value}, {})
    assert says in str(refused.value)
    assert "secret" not in str(refused.value)


def test_the_journal_agrees_when_it_tells_each_attempt_and_the_outcome_once() -> None:
    told = ["attempt.started", "attempt.started", "command.succeeded"]
    assert journal_disagrees("succeeded", 2, told) == ""
    assert journal_disagrees("unknown", 1, ["attempt.started", "command.unknown"]) == ""
    settled = ["attempt.started", "command.unknown", "command.reconciled"]
    assert journal_disagrees("unknown", 1, settled) == ""
    assert journal_disagrees("dispatching", 1, ["attempt.started"]) == ""


@pytest.mark.parametrize(
    ("state", "attempts", "kinds", "said"),
    [
        pytest.param(
            "succeeded", 1, [], "journal: 0 attempt(s) started, 1 recorded", id="nothing-told"
        ),
        pytest.param(
            "succeeded",
            1,
            ["attempt.started"],
            "journal: no outcome; recorded succeeded",
            id="outcome-not-told",
        ),
        pytest.param(
            "succeeded",
            2,
            ["attempt.started", "command.succeeded", "attempt.started", "command.succeeded"],
            "journal: command.succeeded, command.succeeded; recorded succeeded",
            id="outcome-told-twice",
        ),
        pytest.param(
            "succeeded",
            1,
            ["attempt.started", "command.failed"],
            "journal: command.failed; recorded succeeded",
            id="another-outcome",
        ),
        pytest.param(
            "succeeded",
            1,
            ["attempt.started", "attempt.started", "command.succeeded"],
            "journal: 2 attempt(s) started, 1 recorded",
            id="attempt-not-recorded",
        ),
    ],
)
def test_the_journal_disagrees_where_it_does_not_tell_the_row(
    state: str, attempts: int, kinds: list[str], said: str
) -> None:
    assert journal_disagrees(state, attempts, kinds) == said
