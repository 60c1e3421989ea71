"""A host that knows only its credentials folder (`.writ/hosts/<tenant>/`): it connects to
NATS with the URL and inbox prefix it was given, signs its tokens with its key and issuer,
and calls the HTTP API at the base URL it was given. Nothing of the deployment's is used."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio
import httpx
import msgspec
import nats
import nats.aio.client
import nats.errors

from schemas import subjects
from schemas.host import RunRequest, RunResult
from writ.stack import mint_token

__all__ = ["Credentials", "nats_answer", "read_credentials"]

_WAITING = ("pending", "running")


class Credentials:
    """What one host was given."""

    def __init__(self, folder: Path, tenant: str) -> None:
        self.folder, self.tenant = folder, tenant
        self.nats_url = (folder / "nats.url").read_text().strip()
        self.inbox = (folder / "nats.inbox").read_text().strip()
        self.api_url = (folder / "api.url").read_text().strip()
        self.issuer = (folder / "issuer").read_text().strip()
        self.signing_pem = (folder / "signing.pem").read_bytes()

    def token(self, principal: str) -> str:
        return mint_token(
            self.signing_pem, issuer=self.issuer, tenant=self.tenant, principal=principal
        )

    async def connect(self, **options: object) -> nats.aio.client.Client:
        return await nats.connect(
            self.nats_url,
            inbox_prefix=self.inbox,
            max_reconnect_attempts=1,
            allow_reconnect=False,
            **options,
        )

    async def run_over_nats(
        self, principal: str, *, agent: str = "crm-assistant", text: str, timeout: float = 60
    ) -> RunResult:
        """Publish a run request as this host and read its result as it comes."""
        nc = await self.connect()
        try:
            results = await nc.subscribe(subjects.result(self.tenant))
            request = RunRequest(
                request_id=f"creds-{uuid.uuid4().hex[:12]}",
                token=self.token(principal),
                agent=agent,
                input=text,
            )
            ack = await nc.jetstream().publish(
                subjects.request(self.tenant),
                msgspec.json.encode(request),
                headers={"Nats-Msg-Id": request.request_id},
            )
            assert ack.stream == subjects.in_stream(self.tenant)
            with anyio.fail_after(timeout):
                while True:
                    try:
                        msg = await results.next_msg(timeout=1)
                    except nats.errors.TimeoutError:
                        continue
                    found = msgspec.json.decode(msg.data)
                    if found.get("request_id") != request.request_id:
                        continue
                    result = msgspec.json.decode(msg.data, type=RunResult)
                    if result.status not in _WAITING:
                        return result
        finally:
            await nc.close()

    def run_over_http(
        self, principal: str, *, agent: str = "crm-assistant", text: str
    ) -> dict[str, object]:
        """Start a run over the HTTP API and wait for its result there."""
        headers = {"Authorization": f"Bearer {self.token(principal)}"}
        with httpx.Client(base_url=self.api_url, timeout=60) as api:
            started = api.post(
                "/runs",
                json={"agent": agent, "input": text},
                headers={**headers, "Idempotency-Key": f"creds-{uuid.uuid4().hex[:12]}"},
            )
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            waited = api.get(f"/runs/{run_id}/wait", params={"timeout_s": 45}, headers=headers)
            assert waited.status_code == 200, waited.text
            return dict(waited.json())


def read_credentials(folder: Path, tenant: str) -> Credentials:
    """The credentials in `folder`."""
    return Credentials(folder, tenant)


async def nats_answer(url: str) -> str:
    """What the server at `url` answers a client that connects with the URL's user and
    password (NATS's own protocol, so that a refusal leaves nothing open): `PONG` if it lets
    it in, its `-ERR` line if not."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    connect = {
        "verbose": False,
        "pedantic": False,
        "user": unquote(parts.username or ""),
        "pass": unquote(parts.password or ""),
        "protocol": 1,
    }
    async with await anyio.connect_tcp(parts.hostname, parts.port) as sock:
        buffer = b""
        with anyio.fail_after(10):
            while b"\r\n" not in buffer:
                buffer += await sock.receive()  # INFO {...}
            await sock.send(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
            buffer = b""
            while b"PONG" not in buffer and b"-ERR" not in buffer:
                buffer += await sock.receive()
    line = next(x for x in buffer.decode().split("\r\n") if x.startswith(("PONG", "-ERR")))
    return line
