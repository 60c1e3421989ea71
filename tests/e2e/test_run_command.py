"""`writ run` (what `make run` runs), as a new user would: embedded servers by default, the
servers named by WRIT_NATS_URL / WRIT_DATABASE_URL when they are set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libs.embedded import EmbeddedNats

pytestmark = pytest.mark.e2e

# The demo's path: the catalog, a read, its observation, a proposal, its outcome observed,
# the answer and the critic's verdict, then the result.
STEPS = (
    "verified",
    "evidence",
    "capabilities",
    "select",
    "read",
    "observation",
    "select",
    "proposal",
    "admitted",
    "relayed",
    "dispatched",
    "observation",
    "answer",
    "critic",
    "result",
)


def _run(home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WRIT_")}
    return subprocess.run(
        [sys.executable, "-m", "writ.cli", "run", "--once", "--home", str(home)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _section(output: str, heading: str) -> list[str]:
    """The lines of one block of the demo's output: after its heading, up to a blank line."""
    block = output.split(heading, 1)[1].split("\n\n", 1)[0]
    return block.splitlines()[1:]


def _timeline(output: str) -> list[str]:
    """The first demo's steps in the order it printed them (the chat and scenario C follow in
    blocks of their own). Admission announces `admitted` and its relay publishes the command
    (`relayed`) once the same commit is done, concurrently: either may be seen first, so the
    pair is read in the order the path defines."""
    lines = _section(output, "Timeline of request")
    steps = [
        line.split()[1]
        for line in lines
        if line.startswith("  ") and len(line.split()) > 1 and line.split()[1] in STEPS
    ]
    for i in range(len(steps) - 1):
        if steps[i : i + 2] == ["relayed", "admitted"]:
            steps[i : i + 2] = ["admitted", "relayed"]
    return steps


def test_writ_run_starts_its_own_servers_and_completes_the_demo(tmp_path: Path) -> None:
    done = _run(tmp_path, {})
    assert done.returncode == 0, done.stdout + done.stderr
    assert _timeline(done.stdout) == list(STEPS)
    assert "result" in done.stdout and "succeeded" in done.stdout
    # Every service that journals says its chain is intact after the demo.
    journals = _section(done.stdout, "Audit journal")
    assert {line.split()[0]: line.split()[1] for line in journals if line.strip()} == {
        service: "intact" for service in ("admission", "dispatcher", "governance", "planner")
    }
    # The chat: a plan proposed, approved by its id, then the turn's note and its end.
    chat = "\n".join(_section(done.stdout, "A chat session (plan mode):"))
    assert "plan proposed: crm.note.create" in chat and "PlanDecided approved" in chat, chat
    assert "StepOutcome crm.note.create succeeded" in chat and "turn 1 succeeded" in chat, chat
    # Scenario C: read over the host's MCP server, one comment written over its REST API.
    federation = done.stdout.split("Scenario C:", 1)[1]
    assert "retrieval reads mcp:helpdesk/ticket.get" in federation, federation
    assert "dispatched         succeeded receipt=cmt_1" in federation, federation
    assert "scenario C: one comment at the host, as asked" in federation, federation
    assert (tmp_path / "nats" / "jetstream").is_dir()
    assert (tmp_path / "postgres" / "pgdata" / "PG_VERSION").exists()

    again = _run(tmp_path, {})  # a second `make run` reuses the same data
    assert again.returncode == 0, again.stdout + again.stderr
    assert _timeline(again.stdout) == list(STEPS)


def test_writ_run_uses_the_servers_the_environment_names(tmp_path: Path, admin_dsn: str) -> None:
    with EmbeddedNats(tmp_path / "their-nats") as theirs:
        done = _run(
            tmp_path / "home", {"WRIT_NATS_URL": theirs.url, "WRIT_DATABASE_URL": admin_dsn}
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _timeline(done.stdout) == list(STEPS)
    assert not (tmp_path / "home" / "nats").exists()
    assert not (tmp_path / "home" / "postgres").exists()
    assert (tmp_path / "their-nats" / "jetstream").is_dir()


def test_writ_run_serves_the_http_api_on_the_port_asked_for(tmp_path: Path) -> None:
    import signal
    import socket

    import httpx

    with socket.socket() as probe:  # a port that is free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith("WRIT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "writ.cli", "run", "--home", str(tmp_path)],
        env={**base, "WRIT_HTTP_PORT": str(port)},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "/console/sign-in?token=" in line:
                break
        output = "".join(lines)
        assert "Serving." in output, output
        url = f"http://127.0.0.1:{port}/api/v1"
        assert f"base URL  {url}\n" in output and f"OpenAPI   {url}/openapi.json" in output
        document = httpx.get(f"{url}/openapi.json", timeout=10).json()
        assert document["openapi"] == "3.1.0"
        # The console link in the log: it says it expires within minutes, and its token is
        # no bearer (a log reader holds nothing the API takes); it signs in, once.
        assert "only within the next 10 minutes" in output, output
        link = lines[-1].strip()
        token = link.split("token=", 1)[1]
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{url}/pending-decisions", headers=bearer, timeout=10).status_code == 401
        assert httpx.get(link, timeout=10).status_code == 303
        assert httpx.get(link, timeout=10).status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)  # drains and closes the pipe


def _children(parent: int) -> dict[int, str]:
    """The processes whose parent is `parent`, with their command lines (Linux /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == parent:
                found[int(entry.name)] = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                )
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_writ_run_reports_a_dead_service_at_once_and_restarts_it(tmp_path: Path) -> None:
    """`make run` serving: kill -9 one service process; the console says so in the
    timeline, and the service is back (a new process) without anyone doing anything."""
    import signal
    import threading
    import time

    base = {k: v for k, v in os.environ.items() if not k.startswith("WRIT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "writ.cli", "run", "--home", str(tmp_path)],
        env=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()

    def wait_for(text: str, timeout: float) -> str:
        """The first line with `text`, or the first timeline line of step `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(lines):
                words = line.split()
                if (len(words) > 1 and words[1] == text) or (text.endswith(".") and text in line):
                    return line
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not printed:\n" + "".join(lines))

    try:
        wait_for("Serving.", 180)
        [(victim, _)] = [
            (pid, cmd)
            for pid, cmd in _children(proc.pid).items()
            if cmd.endswith("service retrieval")
        ]
        os.kill(victim, signal.SIGKILL)
        died = wait_for("died", 10)
        assert "retrieval killed by SIGKILL" in died
        restarted = wait_for("restarted", 20)
        assert "retrieval" in restarted
        deadline = time.monotonic() + 20
        while not [
            pid
            for pid, cmd in _children(proc.pid).items()
            if cmd.endswith("service retrieval") and pid != victim
        ]:
            assert time.monotonic() < deadline, "retrieval was not started again"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
