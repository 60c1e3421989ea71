"""`writ conformance`, run as a user runs it: the crash matrix at a small K against the fake
providers (no duplicate, no loss, `unknown` only where the provider cannot tell, each listed by
`writ reconcile list`), against a deliberately broken CRM that acts again under a repeated key
(which it must catch), and its check of a host's own endpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fakes.crm import FakeCrm
from writ.conformance.deployment import kit_settings
from writ.stack import Stack
from writ.supervisor import Supervisor

pytestmark = [pytest.mark.e2e]

TOKEN = "crm-conformance-token"


def _writ(
    *args: str, timeout: float = 1700, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command; past `timeout`, interrupt it so that it stops its deployment."""
    with subprocess.Popen(
        [sys.executable, "-m", "writ.cli", "conformance", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            raise AssertionError(f"not done within {timeout} s:\n{out}\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(1800)
def test_the_matrix_leaves_no_duplicate_no_loss_and_unknown_only_where_none_can_tell(
    tmp_path: Path,
) -> None:
    figures, rows, logs = tmp_path / "figures.json", tmp_path / "rows.jsonl", tmp_path / "logs"
    done = _writ(
        "--k", "1", "--json", str(figures), "--rows", str(rows), "--keep-logs", str(logs)
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]

    summary = json.loads(figures.read_text())
    cells = {(c["contract"], c["boundary"]): c for c in summary["cells"]}
    assert len(cells) == 15 and summary["conforms"]
    for (contract, boundary), c in cells.items():
        # K counts the commands the evidence at the kill shows at the boundary.
        assert c["k"] == c["reached"] == 1 and c["commands"] >= 1, c
        assert (c["duplicates"], c["losses"], c["mismatches"]) == (0, 0, 0), c
        kills = 2 if boundary == "reconciling" else 0 if boundary == "lost_response" else 1
        assert c["kills"] == kills * c["rounds"], c
        if contract != "none":
            assert c["unknown"] == 0, c
        assert c["listed"] == c["unknown"], c
    # The provider that cannot tell leaves `unknown` where it may have acted, and only there.
    assert cells[("none", "after_commit")]["unknown"] == 1
    assert cells[("none", "lost_response")]["unknown"] == 1
    assert cells[("none", "before_ack")]["unknown"] == 0
    # A provider that can be asked is asked.
    assert cells[("lookup", "after_commit")]["settled"] == {"found by key lookup": 1}
    trials = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(trials) == sum(c["commands"] for c in cells.values())
    for t in trials:  # row by row: the journal's receipt is the provider's only effect
        if t["state"] == "succeeded":
            assert t["effects"] == [t["receipt"]], t
        # and the dispatcher's chained journal tells each attempt and the one outcome
        assert t["journal"] == "", t
    seen = {t["boundary"]: t["evidence"] for t in trials if t["reached"]}
    assert seen["before_send"].endswith("last open; 0 write(s)"), seen
    assert seen["after_commit"].endswith("last open; 1 write(s)"), seen
    assert "1 answer(s) lost" in seen["lost_response"], seen
    # The dispatcher held the commands and was killed from outside; no crash point exited it.
    dispatcher = (logs / "dispatcher.log").read_text()
    assert dispatcher.count("fault injected: holding") >= 14
    assert "fault injected: crashing" not in dispatcher


@pytest.mark.timeout(1800)
def test_a_connector_that_acts_again_under_a_repeated_key_is_caught(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    done = _writ(
        "--broken-crm",
        "--contract",
        "idempotent",
        "--boundary",
        "after_commit",
        "--k",
        "1",
        "--json",
        str(figures),
    )
    assert done.returncode == 1, done.stdout + done.stderr[-4000:]
    summary = json.loads(figures.read_text())
    assert not summary["conforms"] and len(summary["cells"]) == 1
    for c in summary["cells"]:
        assert c["reached"] == 1 and c["duplicates"] >= 1, c
    assert re.search(r"^NOT CONFORMING: idempotent/after_commit: \d+ duplicate", done.stdout, re.M)


@pytest.mark.timeout(900)
def test_the_kit_targets_a_running_deployment_it_neither_starts_nor_restarts(
    tmp_path: Path,
) -> None:
    """A deployment started here and kept alive by its own supervisor; the kit, given its
    addresses and credentials in the environment, kills its dispatcher and leaves it running."""
    faults = tmp_path / "faults"
    faults.write_text("")
    stack = Stack(
        tmp_path / "home", database="target", durable_pg=False, extra_env=kit_settings(faults)
    )
    restarted: list[str] = []
    supervisor = Supervisor(stack, report=lambda what, detail: restarted.append(what))
    try:
        stack.start_all()
        supervisor.start()
        env = {
            "WRIT_CONFORMANCE_NATS_URL": stack.nats_url,
            "WRIT_CONFORMANCE_DATABASE_URL": stack.database_dsn,
            "WRIT_CONFORMANCE_HOST_CREDENTIALS": str(stack.write_host_credentials("acme")),
            "WRIT_CONFORMANCE_CRM_URL": stack.crm_url,
            "WRIT_CONFORMANCE_PAYMENTS_URL": stack.payments_url,
            "WRIT_CONFORMANCE_FAULTS_FILE": str(faults),
        }
        figures = tmp_path / "figures.json"
        args = ("--target", "--contract", "idempotent", "--boundary", "reconciling")
        done = _writ(*args, "--k", "1", "--json", str(figures), env=env, timeout=800)
        assert done.returncode == 0, done.stdout + done.stderr[-4000:]
        summary = json.loads(figures.read_text())
        assert summary["conforms"], summary
        for c in summary["cells"]:
            assert c["reached"] == 1 and c["kills"] == 2 * c["rounds"], c
            assert (c["duplicates"], c["losses"], c["mismatches"]) == (0, 0, 0), c
        kills = sum(c["kills"] for c in summary["cells"])
        # Every kill was of the deployment's own dispatcher, which its supervisor restarted;
        # and the deployment is still there after the kit is done.
        assert supervisor.restarts >= kills, (supervisor.restarts, restarted)
        assert stack.procs["dispatcher"].poll() is None
        assert faults.read_text() == ""  # left disarmed

        partial = {k: v for k, v in env.items() if not k.endswith("_DATABASE_URL")}
        refused = _writ("--target", "--k", "1", env=partial, timeout=60)
        assert refused.returncode != 0
        assert "--database-url (WRIT_CONFORMANCE_DATABASE_URL)" in refused.stderr
        assert stack.nats_url not in refused.stderr  # a credential is never echoed
    finally:
        supervisor.stop()
        stack.stop()


@pytest.fixture
def crm() -> Iterator[FakeCrm]:
    with FakeCrm(token=TOKEN) as server:
        yield server


def test_an_endpoint_is_trusted_only_if_every_repeated_key_replays(
    crm: FakeCrm, tmp_path: Path
) -> None:
    credential = tmp_path / "credential"
    credential.write_text(TOKEN + "\n")
    url = f"{crm.url}/v1/customers/ACME-42/notes"
    args = ("--endpoint", url, "--credential-file", str(credential), "--k", "3")

    done = _writ(*args, "--id-field", "note_id", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^  replayed +3 ", done.stdout, re.M), done.stdout
    with httpx.Client(base_url=crm.url) as control:
        assert len(control.get("/_control/notes").json()) == 3

        control.post("/_control/idempotency", json={"honour": False}).raise_for_status()
        done = _writ(*args, "--id-field", "note_id", timeout=120)
        assert done.returncode == 1
        assert re.search(r"^  double-applied +3 ", done.stdout, re.M), done.stdout
        assert "acted again under a repeated idempotency key" in done.stdout
        assert len(control.get("/_control/notes").json()) == 3 + 6

    credential.write_text("not-the-token")
    done = _writ(*args, timeout=120)
    assert done.returncode == 1 and "refused" in done.stdout
