"""Who may register a run with what (`services/governance/registration.py`)."""

from __future__ import annotations

import msgspec
import pytest

from schemas.governance import RegisterRun, RegisterTurn
from services.governance.registration import turn_run, widening

RUN = RegisterRun(
    tenant="acme",
    run_id="req-1",
    principal="alice@acme.example",
    agent="crm-assistant",
    grants=["write_delete"],
)
KNOWN = ("alice@acme.example", "crm-assistant", False, frozenset({"write_delete"}))


def test_a_new_run_or_the_same_registration_again_widens_nothing() -> None:
    assert widening(None, RUN) == ""
    assert widening(KNOWN, RUN) == ""
    assert widening(KNOWN, msgspec.structs.replace(RUN, grants=[])) == ""  # asks less


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"grants": ["write_delete", "payment"]}, "its grants by payment"),
        ({"principal": "mallory@acme.example"}, "its principal"),
        ({"agent": "refund-agent"}, "its agent"),
        ({"attended": True}, "its attendance"),
    ],
)
def test_a_registration_that_asks_more_than_the_known_one_is_named(
    change: dict[str, object], named: str
) -> None:
    assert named in widening(KNOWN, msgspec.structs.replace(RUN, **change))


def test_a_turn_registers_a_run_without_grants_and_only_as_a_turn_of_its_session() -> None:
    turn = RegisterTurn(
        tenant="acme",
        run_id="ses-abc-t3",
        session_id="ses-abc",
        principal="alice@acme.example",
        agent="chat-assistant",
    )
    run = turn_run(turn)
    assert run is not None and run.grants == [] and run.budget is None and run.attended
    for run_id in ("req-1", "ses-abc-t", "ses-abc-t3x", "ses-abcd-t3", "ses-ab-t3"):
        assert turn_run(msgspec.structs.replace(turn, run_id=run_id)) is None


def test_a_turn_cannot_carry_grants() -> None:
    body = msgspec.json.encode(
        {
            "type": "RegisterTurn",
            "tenant": "acme",
            "run_id": "ses-abc-t1",
            "session_id": "ses-abc",
            "principal": "alice@acme.example",
            "agent": "chat-assistant",
            "grants": ["write_delete"],
        }
    )
    with pytest.raises(msgspec.ValidationError, match="grants"):
        msgspec.json.decode(body, type=RegisterTurn)
