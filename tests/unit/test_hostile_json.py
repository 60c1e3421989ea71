"""What both doors refuse before a decoder sees it, naming where: JSON nested too deep, text
PostgreSQL cannot store in a body, a path id or a query parameter; and the audience and proof
that keep a console sign-in token off every bearer path."""

from __future__ import annotations

import msgspec
import pytest

from services.ingress.logic import (
    COMMAND_DECODER,
    MAX_JSON_DEPTH,
    Rejection,
    console_audience,
    console_proof,
    hostile_json,
    too_deep_at,
    unstorable_parameter,
    verify_request,
)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"a": ' + _nested(MAX_JSON_DEPTH - 1) + b"}", None),  # 32 levels, the object's one
        (b'{"a": ' + _nested(MAX_JSON_DEPTH) + b"}", "$.a" + "[0]" * 7),  # 33
        (_nested(MAX_JSON_DEPTH + 1), "$" + "[0]" * 8),  # the path is cut at 8 levels
        (b'{"a": 1, "b": {"c": [1, ' + _nested(40) + b"]}}", "$.b.c[1]" + "[0]" * 5),
        (b'{"a": "' + b"[" * 500 + b'"}', None),  # brackets inside a string are text
        (b'{"k\\"[[": ' + _nested(2000) + b"}", '$.k\\"[[' + "[0]" * 7),
        (b'{"a":' * 2000 + b"1" + b"}" * 2000, "$" + ".a" * 8),
        (b"not json at all" + b"{" * 10, None),
    ],
)
def test_depth_names_the_first_container_too_deep(body: bytes, where: str | None) -> None:
    assert too_deep_at(body) == where


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"input": "ok\\u0000"}', "`$.input`"),
        (b'{"input": "\\ud800"}', "`$.input`"),
        (b'{"input": "\\udfff\\ud800"}', "`$.input`"),
        (b'{"input": "\xed\xa0\x80"}', "`$.input`"),
        (b'{"input": "\xff"}', "`$.input`"),
        (b'{"arguments": {"body": ["x", "a\\u0000"]}}', "`$.arguments.body[1]`"),
        (b'{"arguments": {"a\\u0000": 1}}', "`$.arguments (a key)`"),
        (b'{"budget": ' + _nested(100) + b"}", "`$.budget"),
    ],
)
def test_hostile_json_names_the_field(body: bytes, field: str) -> None:
    said = hostile_json(body)
    assert said is not None and said.startswith(field), said


@pytest.mark.parametrize(
    "body", [b'{"input": "fine \\ud83d\\ude00 \xc3\xa9"}', b"{", b"", b"[]", b'"\\u0001"']
)
def test_hostile_json_lets_through_what_it_does_not_refuse(body: bytes) -> None:
    assert hostile_json(body) is None


def test_parameters_are_named() -> None:
    assert unstorable_parameter({"run_id": "ok"}, [("limit", "5")]) is None
    assert "`run_id`" in (unstorable_parameter({"run_id": "a\x00b"}, []) or "")
    assert "`timeout_s`" in (unstorable_parameter({}, [("timeout_s", "\ud800")]) or "")
    named = unstorable_parameter({}, [("a\x00", "1")]) or ""
    assert "\x00" not in named and "`a\ufffd`" in named


def test_the_nats_door_refuses_deep_arguments_instead_of_recursing() -> None:
    body = (
        b'{"type":"SubmitCommand","request_id":"r1","token":"t","agent":"a",'
        b'"operation_key":"k","action":"x","arguments":{"a":' + _nested(20_000) + b"}}"
    )
    refused = verify_request(
        body,
        subject_tenant="acme",
        header_request_id="r1",
        keys={},
        audience="writ",
        max_bytes=1 << 20,
        decoder=COMMAND_DECODER,
    )
    assert isinstance(refused, Rejection) and refused.code == "INVALID_REQUEST"
    assert refused.message.startswith("`$.arguments.a[0]")
    with pytest.raises(RecursionError):  # what the decoder would have done
        msgspec.json.decode(_nested(20_000))


def test_a_mismatched_nats_msg_id_is_refused_unanswerable() -> None:
    body = b'{"type":"RunRequest","request_id":"r1","token":"t","agent":"a","input":"x"}'
    refused = verify_request(
        body,
        subject_tenant="acme",
        header_request_id="r2",
        keys={},
        audience="writ",
        max_bytes=1 << 20,
    )
    assert isinstance(refused, Rejection) and not refused.answerable


def test_the_sign_in_audience_and_proof() -> None:
    assert console_audience("writ") != "writ"
    assert console_proof(b"k" * 32, "t") == console_proof(b"k" * 32, "t")
    assert console_proof(b"k" * 32, "t") != console_proof(b"j" * 32, "t")
    assert console_proof(b"k" * 32, "t") != console_proof(b"k" * 32, "u")
