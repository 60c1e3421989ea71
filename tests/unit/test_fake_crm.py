"""The fake CRM, driven over real HTTP on loopback."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakes.crm import FakeCrm

TOKEN = "s3cret-token"
NOTES = "/v1/customers/ACME-42/notes"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def crm() -> Iterator[FakeCrm]:
    with FakeCrm(token=TOKEN) as server:
        yield server


@pytest.fixture
def client(crm: FakeCrm) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=crm.url, headers=headers, timeout=5) as c:
        yield c


def post_note(
    client: httpx.Client, key: str | None, body: Any = "hello", **headers: str
) -> httpx.Response:
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(NOTES, json={"body": body}, headers=headers)


def stored_notes(client: httpx.Client) -> list[dict[str, Any]]:
    return client.get("/_control/notes").json()


def calls(client: httpx.Client) -> int:
    return client.get("/_control/calls").json()["calls"]


def set_mode(
    client: httpx.Client, mode: str, count: int | None = None, delay_s: float = 0.0
) -> None:
    r = client.post("/_control/mode", json={"mode": mode, "count": count, "delay_s": delay_s})
    assert r.status_code == 200, r.text


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_healthz_needs_no_token(crm: FakeCrm) -> None:
    with httpx.Client(base_url=crm.url) as anon:
        r = anon.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_seeded_customer_starts_at_r1(client: httpx.Client) -> None:
    r = client.get("/v1/customers/ACME-42")
    assert r.status_code == 200
    assert r.json() == {"customer_id": "ACME-42", "name": "Acme Corporation", "revision": "r1"}
    assert client.get("/v1/customers/NOPE").status_code == 404


def test_first_post_creates_one_note_and_bumps_revision(client: httpx.Client) -> None:
    r = post_note(client, "k1")
    assert r.status_code == 201
    note = r.json()
    assert note.pop("revision") == "r2"
    assert note.pop("created_at")
    assert note == {
        "note_id": "note_1",
        "customer_id": "ACME-42",
        "body": "hello",
        "idempotency_key": "k1",
    }
    assert "Idempotent-Replayed" not in r.headers
    assert stored_notes(client) == [{**note, "created_at": r.json()["created_at"]}]
    assert client.get("/v1/customers/ACME-42").json()["revision"] == "r2"


def test_same_key_same_body_replays_without_a_second_note(client: httpx.Client) -> None:
    first = post_note(client, "k1")
    second = post_note(client, "k1")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.json() == first.json()
    assert len(stored_notes(client)) == 1
    assert client.get("/v1/customers/ACME-42").json()["revision"] == "r2"
    assert calls(client) == 2


def test_the_broken_switch_acts_again_under_a_repeated_key_until_switched_back(
    client: httpx.Client,
) -> None:
    """The deliberately broken connector `writ conformance --broken-crm` must catch."""
    for bad in ({}, {"honour": "no"}, {"honour": False, "extra": 1}):
        assert client.post("/_control/idempotency", json=bad).status_code == 400
    assert client.post("/_control/idempotency", json={"honour": False}).status_code == 200
    first, second = post_note(client, "k-broken"), post_note(client, "k-broken")
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["note_id"] != second.json()["note_id"]
    assert len(stored_notes(client)) == 2

    assert client.post("/_control/idempotency", json={"honour": True}).status_code == 200
    assert post_note(client, "k-honest").status_code == 201
    assert post_note(client, "k-honest").status_code == 200
    assert len(stored_notes(client)) == 3


def test_same_key_different_body_is_409_and_note_unchanged(client: httpx.Client) -> None:
    original = post_note(client, "k1", "first").json()
    r = post_note(client, "k1", "second")
    assert r.status_code == 409
    assert r.json() == {"error": "idempotency key reused with a different request"}
    [note] = stored_notes(client)
    assert note["body"] == "first" and note["note_id"] == original["note_id"]


def test_same_key_for_another_customer_is_409(client: httpx.Client) -> None:
    client.post("/_control/customers", json={"customer_id": "BETA-7", "name": "Beta"})
    assert post_note(client, "k1").status_code == 201
    r = client.post(
        "/v1/customers/BETA-7/notes", json={"body": "hello"}, headers={"Idempotency-Key": "k1"}
    )
    assert r.status_code == 409
    assert len(stored_notes(client)) == 1
    assert client.get("/v1/customers/BETA-7").json()["revision"] == "r1"


@pytest.mark.parametrize("key", [None, "", "x" * 256])
def test_bad_idempotency_key_is_400_without_effect(client: httpx.Client, key: str | None) -> None:
    r = post_note(client, key)
    assert r.status_code == 400
    if not key:
        assert r.json() == {"error": "idempotency key required"}
    assert stored_notes(client) == []


def test_255_char_key_is_accepted(client: httpx.Client) -> None:
    assert post_note(client, "x" * 255).status_code == 201


def test_if_match_mismatch_is_412_without_effect(client: httpx.Client) -> None:
    r = post_note(client, "k1", **{"If-Match": "r7"})
    assert r.status_code == 412
    assert r.json() == {"error": "revision mismatch", "revision": "r1"}
    assert stored_notes(client) == []
    assert client.get("/v1/customers/ACME-42").json()["revision"] == "r1"


def test_if_match_current_revision_succeeds(client: httpx.Client) -> None:
    assert post_note(client, "k1", **{"If-Match": "r1"}).json()["revision"] == "r2"
    assert post_note(client, "k2", **{"If-Match": "r2"}).json()["revision"] == "r3"


def test_retry_with_stale_if_match_still_replays(client: httpx.Client) -> None:
    # The key is checked first, so a retry after a lost response replays instead of 412ing.
    first = post_note(client, "k1", **{"If-Match": "r1"})
    retry = post_note(client, "k1", **{"If-Match": "r1"})
    assert (retry.status_code, retry.json()) == (200, first.json())
    assert len(stored_notes(client)) == 1


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN])
def test_bad_token_is_401_without_effect(
    crm: FakeCrm, client: httpx.Client, auth: str | None
) -> None:
    headers = {"Idempotency-Key": "k1"} | ({"Authorization": auth} if auth else {})
    with httpx.Client(base_url=crm.url, headers=headers) as anon:
        r = anon.post(NOTES, json={"body": "hello"})
        assert anon.get("/v1/customers/ACME-42").status_code == 401
        assert anon.get("/v1/notes", params={"idempotency_key": "k1"}).status_code == 401
    assert (r.status_code, r.json()) == (401, {"error": "unauthorized"})
    assert stored_notes(client) == []
    assert calls(client) == 1


def test_unknown_customer_is_404_without_effect(client: httpx.Client) -> None:
    r = client.post(
        "/v1/customers/NOPE/notes", json={"body": "x"}, headers={"Idempotency-Key": "k1"}
    )
    assert r.status_code == 404
    assert stored_notes(client) == []


def test_fail_mode_is_503_without_effect_then_recovers(client: httpx.Client) -> None:
    set_mode(client, "fail", count=1)
    r = post_note(client, "k1")
    assert (r.status_code, r.json()) == (503, {"error": "unavailable"})
    assert stored_notes(client) == []
    assert post_note(client, "k1").status_code == 201
    assert len(stored_notes(client)) == 1


def test_fail_mode_without_count_lasts_until_changed(client: httpx.Client) -> None:
    set_mode(client, "fail")
    assert [post_note(client, "k1").status_code for _ in range(3)] == [503] * 3
    set_mode(client, "normal")
    assert post_note(client, "k1").status_code == 201
    assert calls(client) == 4


def test_the_call_log_names_each_write_and_the_answer_it_lost(client: httpx.Client) -> None:
    set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        post_note(client, "k1")
    assert post_note(client, "k1").status_code == 200  # replayed: still a call under the key
    assert post_note(client, None).status_code == 400  # refused: nothing done, nothing logged
    assert client.get("/_control/log").json()["log"] == [
        {"kind": "write", "key": "k1", "answered": False},
        {"kind": "write", "key": "k1", "answered": True},
    ]
    client.post("/_control/reset").raise_for_status()
    assert client.get("/_control/log").json()["log"] == []


def test_lose_response_performs_effect_and_drops_connection(client: httpx.Client) -> None:
    set_mode(client, "lose_response", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        post_note(client, "k1")
    [note] = stored_notes(client)
    assert note["idempotency_key"] == "k1"
    retry = post_note(client, "k1")
    assert (retry.status_code, retry.headers["Idempotent-Replayed"]) == (200, "true")
    assert retry.json()["note_id"] == note["note_id"]
    assert len(stored_notes(client)) == 1


def test_slow_mode_applies_the_effect_after_the_delay(crm: FakeCrm, client: httpx.Client) -> None:
    set_mode(client, "slow", count=1, delay_s=0.5)
    with pytest.raises(httpx.ReadTimeout):
        client.post(NOTES, json={"body": "hi"}, headers={"Idempotency-Key": "k1"}, timeout=0.1)
    assert stored_notes(client) == []
    wait_for(lambda: len(stored_notes(client)) == 1)
    started = time.monotonic()
    assert post_note(client, "k2").status_code == 201  # count=1: back to normal
    assert time.monotonic() - started < 0.4


def test_slow_mode_delays_the_response(client: httpx.Client) -> None:
    set_mode(client, "slow", delay_s=0.2)
    started = time.monotonic()
    assert post_note(client, "k1").status_code == 201
    assert time.monotonic() - started >= 0.2


@pytest.mark.parametrize(
    "mode", [{"mode": "chaos"}, {"mode": "fail", "count": 0}, {"mode": "slow", "delay_s": -1}]
)
def test_bad_mode_is_rejected(client: httpx.Client, mode: dict[str, Any]) -> None:
    assert client.post("/_control/mode", json=mode).status_code == 400
    assert post_note(client, "k1").status_code == 201


def test_oversized_body_is_413_without_effect(client: httpx.Client) -> None:
    r = post_note(client, "k1", "x" * (64 * 1024))
    assert r.status_code == 413
    assert stored_notes(client) == []


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"body": 5}', b""])
def test_malformed_request_is_400_without_effect(client: httpx.Client, content: bytes) -> None:
    r = client.post(
        NOTES,
        content=content,
        headers={"Idempotency-Key": "k1", "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert stored_notes(client) == []


def test_lookup_by_idempotency_key(client: httpx.Client) -> None:
    created = post_note(client, "k1").json()
    found = client.get("/v1/notes", params={"idempotency_key": "k1"})
    assert found.status_code == 200
    assert found.json() == {"notes": [{k: v for k, v in created.items() if k != "revision"}]}
    assert client.get("/v1/notes", params={"idempotency_key": "other"}).json() == {"notes": []}
    assert client.get("/v1/notes").status_code == 400


def test_reset_forgets_notes_keys_calls_and_mode(client: httpx.Client) -> None:
    post_note(client, "k1")
    set_mode(client, "fail")
    assert client.post("/_control/reset").status_code == 200
    assert stored_notes(client) == [] and calls(client) == 0
    assert client.get("/v1/customers/ACME-42").json()["revision"] == "r1"
    r = post_note(client, "k1", "new body")
    assert (r.status_code, r.json()["note_id"]) == (201, "note_1")


def test_seeding_a_customer(client: httpx.Client) -> None:
    r = client.post("/_control/customers", json={"customer_id": "BETA-7", "name": "Beta Ltd"})
    assert r.status_code == 201
    assert client.get("/v1/customers/BETA-7").json() == {
        "customer_id": "BETA-7",
        "name": "Beta Ltd",
        "revision": "r1",
    }
    assert (
        client.post("/_control/customers", json={"customer_id": "a/b", "name": "x"}).status_code
        == 400
    )


def test_constructor_customers_replace_the_default() -> None:
    with (
        FakeCrm(token=TOKEN, customers={"C-1": "One"}) as crm,
        httpx.Client(base_url=crm.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        assert client.get("/v1/customers/C-1").json()["name"] == "One"
        assert client.get("/v1/customers/ACME-42").status_code == 404


def test_concurrent_posts_with_one_key_make_one_note(client: httpx.Client) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = sorted(
            r.status_code for r in pool.map(lambda _: post_note(client, "k1"), range(16))
        )
    assert statuses == [200] * 15 + [201]
    assert len(stored_notes(client)) == 1
    assert client.get("/v1/customers/ACME-42").json()["revision"] == "r2"


def test_stop_hangs_up_idle_and_cuts_slow_requests_short() -> None:
    crm = FakeCrm(token=TOKEN)
    crm.start()
    with httpx.Client(base_url=crm.url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        assert client.get("/healthz").status_code == 200  # leaves an idle keep-alive connection
        set_mode(client, "slow", delay_s=60)

        # Whether the slow request gets its answer or a hang-up is a race; either is fine
        # (a hang-up must not end the thread with an exception pytest reports).
        def post() -> None:
            with contextlib.suppress(httpx.TransportError):
                post_note(client, "k1")

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        wait_for(lambda: calls(client) == 1)
        started = time.monotonic()
        crm.stop()
        poster.join(timeout=5)
        assert time.monotonic() - started < 5
        assert not poster.is_alive()
    crm.stop()  # idempotent


def test_stop_without_start_releases_the_port() -> None:
    FakeCrm(token=TOKEN).stop()


def test_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        FakeCrm(token="")


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    token_file, ready = tmp_path / "token", tmp_path / "ready"
    token_file.write_text(TOKEN + "\n")
    cmd = [
        sys.executable,
        "-m",
        "fakes.crm",
        "--port",
        "0",
        "--token-file",
        str(token_file),
        "--ready-file",
        str(ready),
    ]
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            wait_for(ready.exists, timeout=20)
            url = ready.read_text()
            assert proc.stdout is not None and proc.stdout.readline().strip() == url
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
                assert post_note(client, "k1").status_code == 201
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
