"""The SDK as a host installs it: built as a wheel, installed into a fresh virtual environment
(no services, no repository on the path), and driving runs from there on a host's credentials,
over HTTP and over NATS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.e2e.test_sdk_host import host_folder
from writ.stack import Stack

pytestmark = [pytest.mark.e2e]
ROOT = Path(__file__).resolve().parents[2]

# Runs in the fresh environment: what it prints is the test's evidence.
HOST = """
import asyncio, importlib.util, json, sys
import writ_client
from writ_client import HostCredentials, NatsClient, SyncClient

credentials = HostCredentials.from_dir(sys.argv[1])
with SyncClient.from_credentials(credentials, "alice@acme.example") as http:
    over_http = http.start("crm-assistant", "Note the delayed shipment call").result()

async def over_nats():
    async with await NatsClient.from_credentials(credentials, "alice@acme.example") as nats:
        return await nats.run("crm-assistant", "Note the delayed shipment call")

print(json.dumps({
    "module": writ_client.__file__,
    "schemas": importlib.util.find_spec("schemas") is not None,
    "http": [over_http.status, type(over_http).__module__],
    "nats": asyncio.run(over_nats()).status,
}))
"""


def _uv() -> str:
    found = ROOT / ".tools" / "bin" / "uv"
    if found.exists():
        return str(found)
    which = shutil.which("uv")
    if which is None:
        pytest.skip("no uv to build the wheel with")
    return which


def test_the_wheel_installed_alone_drives_runs(stack: Stack, tmp_path: Path) -> None:
    uv = _uv()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dist = tmp_path / "dist"
    subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(dist), str(ROOT / "clients" / "python")],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    [wheel] = dist.glob("writ_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(archive.read(n) for n in names if n.endswith(".dist-info/METADATA"))
    assert "writ_client/py.typed" in names and "writ_client/_wire/host.py" in names
    assert not [n for n in names if n.split("/")[0] in ("schemas", "libs", "services")]
    assert b"License-Expression: Apache-2.0" in metadata and b"Project-URL:" in metadata
    assert b"Typing :: Typed" in metadata and b"# writ-client" in metadata  # the README

    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--python", sys.executable, str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "--python", str(python), f"{wheel}[nats]"]
    if subprocess.run([*install, "--offline"], capture_output=True, env=env).returncode:
        subprocess.run(install, check=True, capture_output=True, env=env, timeout=300)

    folder = host_folder(stack, "acme")
    out = subprocess.run(
        [str(python), "-c", HOST, str(folder)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository: nothing of it is importable
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["module"].startswith(str(venv)), seen
    assert seen["schemas"] is False
    assert seen["http"] == ["succeeded", "writ_client._wire.host"]
    assert seen["nats"] == "succeeded"
