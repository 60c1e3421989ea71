"""`writ eval run` as its own process, against a candidate behind the OpenAI-compatible fake,
beside a running fake CRM and payment provider: it scores k = 3 samples per case, and the only
connections the process opens are to the candidate's base URL — no bus, no database, no CRM,
no payment provider."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from fakes.crm import FakeCrm
from fakes.llm import FakeLlm
from fakes.payments import FakePayments
from libs.journal import DataKeys
from tests.eval_runs import FACTS, agreeing_script, demo_runs
from writ.eval import (
    EgressRefused,
    Report,
    cases_from_run,
    make_set,
    seal_set,
)
from writ.eval._run import CandidateConfig, candidate_provider

KEY = "sk-eval-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]
# Runs `writ` with an audit hook that logs every socket connection the process opens.
HOOKED = """
import json, sys
log = open(sys.argv[1], "a")
def hook(event, args):
    if event == "socket.connect":
        log.write(json.dumps(repr(args[1])) + "\\n"); log.flush()
sys.addaudithook(hook)
sys.argv = ["writ", *sys.argv[2:]]
from writ.cli import main
main()
"""


@pytest.fixture
def fakes() -> Iterator[tuple[FakeLlm, FakeCrm, FakePayments]]:
    with (
        FakeLlm(token=KEY) as llm,
        FakeCrm(token="crm-token") as crm,
        FakePayments(token="pay-token") as payments,
    ):
        yield llm, crm, payments


def wire(decision: dict[str, Any]) -> dict[str, Any]:
    """A decision as the model writes it in structured mode."""
    d = dict(decision)
    if d["decision"] == "select_capability":
        d["arguments"] = json.dumps(d["arguments"])
    if d["decision"] == "request_human_review":
        d.setdefault("reason", "")
    return {"content": json.dumps({"next": d})}


def expected_replies(eval_set: Any, k: int, *, flip: str | None = None) -> list[dict[str, Any]]:
    """The agreeing candidate's answers, case by case, k each; at case `flip` the last sample
    refunds the larger line instead."""
    script = agreeing_script()
    replies = []
    for case in eval_set.cases:
        decisions = script["agents"].get(case.agent, script["decisions"])
        for i in range(k):
            decision = decisions[case.input.turn]
            if case.case_id == flip and i == k - 1:
                decision = {**decision, "arguments": {"payment_id": "pay_7781", "line_id": "L3"}}
            replies.append(wire(decision))
    return replies


def write_set(tmp_path: Path) -> tuple[Any, Path, Path]:
    cases = [
        c
        for run_id, entries in demo_runs().items()
        for c in cases_from_run(run_id, entries, facts=FACTS)
    ]
    eval_set = make_set("acme", cases)
    keys_file = tmp_path / "eval-data.json"
    keys_file.write_text(DataKeys.generate("eval-1"))
    set_file = tmp_path / "set.json"
    set_file.write_bytes(seal_set(eval_set, DataKeys.from_json(keys_file.read_text())))
    return eval_set, set_file, keys_file


def candidate_file(tmp_path: Path, llm: FakeLlm) -> Path:
    (tmp_path / "model.key").write_text(KEY)
    path = tmp_path / "candidate.json"
    path.write_text(
        json.dumps(
            {
                "name": "fake-gpt",
                "provider": "openai",
                "base_url": f"{llm.url}/v1",
                "model": "fake-1",
                "key_file": "model.key",
            }
        )
    )
    return path


def test_a_candidate_behind_the_fake_model_in_step_mode_with_k_3(
    tmp_path: Path, fakes: tuple[FakeLlm, FakeCrm, FakePayments]
) -> None:
    llm, crm, payments = fakes
    eval_set, set_file, keys_file = write_set(tmp_path)
    replies = expected_replies(eval_set, 3, flip="run-refund@0")
    assert (
        httpx.post(
            f"{llm.url}/_control/replies",
            json={"replies": replies},
            headers={"Authorization": f"Bearer {KEY}"},
        ).status_code
        == 200
    )
    connects = tmp_path / "connects.log"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            HOOKED,
            str(connects),
            "eval",
            "run",
            "--set",
            str(set_file),
            "--set-keys",
            str(keys_file),
            "--candidate",
            str(candidate_file(tmp_path, llm)),
            "-k",
            "3",
            "--json",
            str(tmp_path / "report.json"),
            "--junit",
            str(tmp_path / "junit.xml"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the flipped sample widened
    report = msgspec.json.decode((tmp_path / "report.json").read_bytes(), type=Report)
    assert (report.k, report.steps, report.provider_calls) == (3, 18, 18)
    assert report.tokens > 0
    assert (report.pass_k.hits, report.pass_k.total) == (5, 6)
    assert (report.flip.hits, report.flip.total) == (1, 6)
    assert report.widening == [
        "run-refund@0: payment.refund.amount_cents 4000 > 1500 (a reach field)"
    ]
    assert "pass^3" in done.stdout and "gate: REGRESSION (exit 1)" in done.stdout
    # Every answer the fake gave was asked with the case's own model input.
    asked = httpx.get(
        f"{llm.url}/_control/requests", headers={"Authorization": f"Bearer {KEY}"}
    ).json()
    assert len(asked) == 18
    # The process connected to the candidate and nowhere else: no NATS, no Postgres, no fake.
    port = llm.url.rsplit(":", 1)[1]
    opened = [json.loads(line) for line in connects.read_text().splitlines()]
    assert opened and all(f", {port})" in a for a in opened), opened
    for fake, path in ((crm, "/_control/calls"), (payments, "/_control/calls")):
        assert httpx.get(f"{fake.url}{path}").json() == {"calls": 0}
    assert httpx.get(f"{crm.url}/_control/notes").json() in ([], {"notes": []})
    assert httpx.get(f"{payments.url}/_control/refunds").json() in ([], {"refunds": []})


def test_the_same_candidate_agreeing_passes(
    tmp_path: Path, fakes: tuple[FakeLlm, FakeCrm, FakePayments]
) -> None:
    llm, _, _ = fakes
    eval_set, set_file, keys_file = write_set(tmp_path)
    httpx.post(
        f"{llm.url}/_control/replies",
        json={"replies": expected_replies(eval_set, 3)},
        headers={"Authorization": f"Bearer {KEY}"},
    ).raise_for_status()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "writ.cli",
            "eval",
            "run",
            "--set",
            str(set_file),
            "--set-keys",
            str(keys_file),
            "--candidate",
            str(candidate_file(tmp_path, llm)),
            "-k",
            "3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gate: PASS (exit 0)" in done.stdout


def test_a_candidate_with_no_answer_is_incomplete(
    tmp_path: Path, fakes: tuple[FakeLlm, FakeCrm, FakePayments]
) -> None:
    llm, _, _ = fakes
    _, set_file, keys_file = write_set(tmp_path)  # no reply queued: the fake answers 500
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "writ.cli",
            "eval",
            "run",
            "--set",
            str(set_file),
            "--set-keys",
            str(keys_file),
            "--candidate",
            str(candidate_file(tmp_path, llm)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gate: INCOMPLETE (exit 2)" in done.stdout


@pytest.mark.anyio
async def test_the_client_reaches_only_the_candidates_base_url(
    tmp_path: Path, fakes: tuple[FakeLlm, FakeCrm, FakePayments]
) -> None:
    llm, crm, payments = fakes
    (tmp_path / "model.key").write_text(KEY)
    config = CandidateConfig(
        name="x",
        provider="openai",
        base_url=f"{llm.url}/v1",
        model="m",
        key_file=str(tmp_path / "model.key"),
    )
    async with candidate_provider(config) as provider:
        client = provider._client  # type: ignore[attr-defined]  # the provider's own client
        for url in (
            f"{crm.url}/v1/customers/ACME-42/notes",
            f"{payments.url}/v1/refunds",
            "http://127.0.0.1:4222/",
            "http://example.com/v1/chat/completions",
        ):
            with pytest.raises(EgressRefused):
                await client.post(url, json={"body": "x"})
    async with httpx.AsyncClient() as control:
        for fake in (crm, payments):
            assert (await control.get(f"{fake.url}/_control/calls")).json() == {"calls": 0}


def test_tokens_relative_to_a_baseline_report_per_pass(
    tmp_path: Path, fakes: tuple[FakeLlm, FakeCrm, FakePayments]
) -> None:
    """A baseline report of the candidate at k = 1, then k = 3: the same tokens per pass pass
    a limit of 1.0x; answers four kilobytes longer fail `tokens=1.05:fail` and only warn
    without `:fail`. A relative limit without a baseline cannot run (3)."""
    llm, _, _ = fakes
    eval_set, set_file, keys_file = write_set(tmp_path)
    candidate = candidate_file(tmp_path, llm)

    def run(replies: list[dict[str, Any]], k: int, *extra: str) -> subprocess.CompletedProcess[str]:
        httpx.post(
            f"{llm.url}/_control/replies",
            json={"replies": replies},
            headers={"Authorization": f"Bearer {KEY}"},
        ).raise_for_status()
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "writ.cli",
                "eval",
                "run",
                "--set",
                str(set_file),
                "--set-keys",
                str(keys_file),
                "--candidate",
                str(candidate),
                "-k",
                str(k),
                *extra,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    base = tmp_path / "base.json"
    assert run(expected_replies(eval_set, 1), 1, "--json", str(base)).returncode == 0
    same = run(
        expected_replies(eval_set, 3),
        3,
        "--baseline",
        str(base),
        "--cost-ratio",
        "tokens=1.0:fail",
        "--case-cost-ratio",
        "calls=1:fail",
        "--json",
        str(tmp_path / "same.json"),
    )
    assert same.returncode == 0, same.stdout + same.stderr
    report = msgspec.json.decode((tmp_path / "same.json").read_bytes(), type=Report)
    assert report.cost_vs_baseline is not None
    assert report.cost_vs_baseline.ratios["tokens"] == 1.0
    assert report.tokens == 3 * msgspec.json.decode(base.read_bytes(), type=Report).tokens

    def wordy(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for reply in replies:
            body = json.loads(reply["content"])
            if body["next"]["decision"] == "answer_directly":
                body["next"]["answer"] += " Furthermore," * 300
            out.append({"content": json.dumps(body)})
        return out

    long = run(
        wordy(expected_replies(eval_set, 1)),
        1,
        "--baseline",
        str(base),
        "--cost-ratio",
        "tokens=1.05:fail",
    )
    assert long.returncode == 1, long.stdout + long.stderr
    assert "x the baseline's" in long.stdout and "(limit 1.05x)" in long.stdout
    warned = run(
        wordy(expected_replies(eval_set, 1)),
        1,
        "--baseline",
        str(base),
        "--cost-ratio",
        "tokens=1.05",
    )
    assert warned.returncode == 0 and "warning    cost: tokens" in warned.stdout, warned.stdout
    alone = run(expected_replies(eval_set, 1), 1, "--cost-ratio", "tokens=2")
    assert alone.returncode == 3 and "--baseline" in alone.stderr
