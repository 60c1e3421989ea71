"""Every NATS subject is declared once, in `schemas/subjects.py`'s table.

The consumers' filters, the NATS permissions and the AsyncAPI channels are derived from the table,
so a subject spelled as a string anywhere else is a second declaration that can drift from the
first. The scan reads every tracked Python file's string literals (f-strings included) and fails
on one that starts with a bus family (`writ.in.`, `writ.int.`, `writ.cmd.`, ...). Tests that
deliberately spell a subject, to probe the bus as an outsider would, are listed by name.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

from libs import natsauth, provision
from schemas import subjects

ROOT = Path(__file__).resolve().parents[2]
TABLE_MODULE = "schemas/subjects.py"
# The SDK's private copy of the table (clients/python/copy_wire.py), held identical to it by
# tests/unit/test_sdk_wire.py.
TABLE_COPY = "clients/python/writ_client/_wire/subjects.py"
# A string literal that names a subject: `writ.` then one of the bus's families.
SUBJECT = re.compile(r"^writ\.(?:in|out|int|cmd|dlq|events|chat|audit|api|eval)(?:\.|$)")
# Literals that start like a subject and are not one: path -> the literals, with why.
NOT_SUBJECTS: dict[str, frozenset[str]] = {
    # A JUnit report's test case class (the evaluation's tenant), not a bus address.
    "writ/eval/_report.py": frozenset({'f"writ.eval.{report.tenant}"'}),
}
# Tests that spell subjects on purpose: they probe the bus (permissions, reply subjects,
# streams) with the addresses an outsider would use, or check the table's values themselves.
PROBING_TESTS: frozenset[str] = frozenset(
    {
        "tests/e2e/test_bus_permissions.py",
        "tests/e2e/test_eval.py",
        "tests/e2e/test_host_credentials.py",
        "tests/e2e/test_hostile_input.py",
        "tests/e2e/test_reply_subjects.py",
        "tests/e2e/test_sdk_host.py",
        "tests/e2e/test_sessions.py",
        "tests/integration/test_host_streams.py",
        "tests/integration/test_http_idempotency.py",
        "tests/integration/test_sdk_deadline.py",
        "tests/unit/test_elections.py",
        "tests/unit/test_http_contract.py",
        "tests/unit/test_natsauth.py",
        "tests/unit/test_replies.py",
        "tests/unit/test_subjects.py",
    }
)


def _tracked_python() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def subject_literals(source: str) -> list[tuple[int, str]]:
    """The string literals of `source` that start with a bus family, with their lines."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.STRING:
            continue
        body = token.string.lstrip("rRbBuUfF")
        quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
        if SUBJECT.match(body[len(quote) :]):
            found.append((token.start[0], token.string))
    return found


def test_no_subject_is_spelled_outside_the_table() -> None:
    stray = []
    for path in _tracked_python():
        if path in (TABLE_MODULE, TABLE_COPY) or path in PROBING_TESTS:
            continue
        allowed = NOT_SUBJECTS.get(path, frozenset())
        source = (ROOT / path).read_text(encoding="utf-8")
        stray += [
            f"{path}:{line}: {text}"
            for line, text in subject_literals(source)
            if text not in allowed
        ]
    assert not stray, "subjects spelled outside schemas/subjects.py:\n" + "\n".join(stray)


def test_the_scan_finds_a_spelled_subject() -> None:
    source = 'A = "writ.int.approvals.*"\nB = f"writ.out.results.{t}"\nC = "writ.noop"\n'
    assert subject_literals(source) == [
        (1, '"writ.int.approvals.*"'),
        (2, 'f"writ.out.results.{t}"'),
    ]


def test_the_allowlists_name_files_that_exist_and_still_need_it() -> None:
    for path in PROBING_TESTS | NOT_SUBJECTS.keys():
        source = (ROOT / path).read_text(encoding="utf-8")
        assert subject_literals(source), f"{path} spells no subject: drop it from the list"


def test_each_subject_is_declared_once_with_a_meaning() -> None:
    patterns = [s.pattern for s in subjects.TABLE.values()]
    assert len(patterns) == len(set(patterns))
    for name, subject in subjects.TABLE.items():
        assert subject.meaning.strip(), name
        assert subject.handlers, name
        assert subject.kind in ("stream", "request", "event"), name


def test_consumers_filter_what_the_table_says_they_handle() -> None:
    # Who handles `writ.int.approvals.*`: one look-up.
    assert subjects.TABLE["approvals.verified"].handlers == ("admission",)
    assert subjects.proposal_answer.filter in subjects.ADMISSION_IN
    by_durable = {spec.durable: spec.filter_subjects for spec in provision.consumers(["acme"])}
    for durable in ("planner", "governance", "admission", "dispatcher", provision.EVAL_DURABLE):
        handled = {
            s.filter
            for s in subjects.TABLE.values()
            if s.kind == "stream" and durable in s.handlers
        }
        assert set(by_durable[durable]) == handled, durable
    # Every stream subject a durable filters is stored by one of the declared streams.
    stored = [p for spec in subjects.STREAMS for p in spec.subjects]
    for durable in ("planner", "governance", "admission", "dispatcher"):
        for filt in by_durable[durable]:
            assert any(_covers(p, filt) for p in stored), (durable, filt)


def test_every_subject_a_service_may_use_is_in_the_table() -> None:
    # Each permission names table subjects: one filter, a pattern inside one, or a family of
    # them (the dispatcher's outcomes, both origins).
    filters = {s.filter for s in subjects.TABLE.values()}
    for service, (_, publishes, endpoints) in natsauth.SERVICE_SUBJECTS.items():
        for subject in (*publishes, *endpoints):
            if subject.startswith("writ."):
                assert any(_covers(f, subject) or _covers(subject, f) for f in filters), (
                    service,
                    subject,
                )


def test_a_subject_is_its_pattern_filled_in() -> None:
    assert subjects.proposal_answer("acme") == "writ.int.approvals.acme"
    assert subjects.proposal_answer.filter == "writ.int.approvals.*"
    assert subjects.host_read("acme", "run") == "writ.api.acme.run"
    assert subjects.chat_subject.filter == "writ.chat.*.*"
    assert subjects.outcome("acme", "host") == subjects.TABLE["outcomes.host"]("acme")
    assert subjects.request.prefix == "writ.in.requests."


def _covers(pattern: str, subject: str) -> bool:
    """Whether NATS pattern `pattern` matches every subject `subject` (itself maybe a
    pattern) stands for."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if (
            i >= len(have)
            or (token != "*" and token != have[i])
            or (token == "*" and have[i] == ">")
        ):
            return False
    return len(want) == len(have)
