"""Where a Writ process may answer a request (libs/replies.py)."""

from __future__ import annotations

import pytest

from libs.replies import reply_allowed


@pytest.mark.parametrize(
    "reply",
    [
        "",  # nothing will be published
        "_INBOX.host-acme.AbC123.xyz",
        "_INBOX.planner.k3j4",
        "_INBOX.nUid1234",  # an operator's tool, no prefix of its own
        "_R_.7Gk2fa.MGUVPR",  # a host's request through its account's import
    ],
)
def test_an_inbox_may_be_answered(reply: str) -> None:
    assert reply_allowed(reply)


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.API.STREAM.DELETE.WRIT_AUDIT",
        "$JS.API.STREAM.PURGE.WRIT_OUT_globex",
        "writ.out.results.globex",
        "writ.int.approvals.acme",
        "writ.audit.checkpoints.admission",
        "_INBOX.>",
        "_INBOX.*.x",
        "_INBOX.",
        "_INBOX",
        "_R_.a.>",
        "_INBOX.a b",
        "_INBOX.a..b",
        "$JS.ACK.WRIT_INT.planner.1.2.3.4.5",
        "x._INBOX.a",
    ],
)
def test_anything_else_is_refused(reply: str) -> None:
    assert not reply_allowed(reply)
