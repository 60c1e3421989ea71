"""The retention policy and window keys without I/O: which days are past, key ids, refusals."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import msgspec
import pytest

from libs.journal import (
    DataKeys,
    JournalError,
    PayloadExpired,
    WindowKeys,
    expiry_cutoff,
    parse_key_id,
    window_key_id,
)
from libs.retention import RetentionPolicy


def test_a_window_is_kept_its_days_after_it_ends() -> None:
    # Kept one day: 7 December is erased from 9 December on, not on 8 December.
    assert not date(2026, 12, 7) < expiry_cutoff(date(2026, 12, 8), timedelta(days=1))
    assert date(2026, 12, 7) < expiry_cutoff(date(2026, 12, 9), timedelta(days=1))
    # Never the current day, whatever the policy says.
    assert expiry_cutoff(date(2026, 12, 9), timedelta(0)) == date(2026, 12, 8)


def test_key_ids_name_their_tenant_and_day() -> None:
    key_id = window_key_id("acme-eu", date(2026, 12, 7))
    assert key_id == "win:acme-eu:2026-12-07"
    assert parse_key_id(key_id) == ("acme-eu", date(2026, 12, 7))
    run_key = window_key_id("acme-eu", date(2026, 12, 7), "run:7")
    assert run_key == "win:acme-eu:2026-12-07:run:7"
    assert parse_key_id(run_key) == ("acme-eu", date(2026, 12, 7))
    assert parse_key_id("planner-data-1") is None
    assert parse_key_id("win:acme:yesterday") is None


def test_a_destroyed_window_raises_expired_and_an_unmade_one_is_refused() -> None:
    keys = WindowKeys(DataKeys.from_json(DataKeys.generate("d1")), schema="planner")
    at = datetime(2026, 12, 7, 12, tzinfo=UTC)
    with pytest.raises(JournalError, match="not ready"):
        keys.key_for("acme", at)
    keys._take({"key_id": window_key_id("acme", at.date()), "wrapped": None})
    with pytest.raises(PayloadExpired) as caught:
        keys.decrypt(window_key_id("acme", at.date()), b"0" * 12, b"x" * 32, b"")
    assert caught.value.key_id == "win:acme:2026-12-07"
    with pytest.raises(PayloadExpired):
        keys.key_for("acme", at)


def test_a_policy_refuses_unknown_kinds_and_out_of_range_days() -> None:
    for bad in (
        b'{"default": {"documents": 3}}',
        b'{"default": {"journal": 0}}',
        b'{"tenants": {"a b": {"journal": 3}}}',
        b'{"keep": {}}',
    ):
        with pytest.raises(msgspec.ValidationError):
            RetentionPolicy.from_json(bad)
    policy = RetentionPolicy.from_json(
        b'{"default": {"journal": 90}, "tenants": {"a": {}, "b": {"journal": 1}}}'
    )
    assert (policy.days("a"), policy.days("b"), policy.days("c")) == (90, 1, 90)
    assert RetentionPolicy().days("a") is None
