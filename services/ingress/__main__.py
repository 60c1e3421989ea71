"""`writ service ingress`: the composition root of the ingress process."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import anyio.abc
import msgspec

from libs.errors import ConfigError
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.ingress.console._operators import OperatorKey
from services.ingress.http import HttpServer
from services.ingress.logic import TenantKey, declared_agents
from services.ingress.service import IngressService

log = logging.getLogger("writ.ingress")


class IngressSettings(BaseSettings, frozen=True, kw_only=True):
    """Ingress needs the bus and the tenants' issuer keys; it has no database and no secrets."""

    tenant_keys_file: str
    audience: str = "writ"
    max_request_bytes: int = 64 * 1024
    # How long ingress waits for the planner to take a review answer before it retries it.
    review_timeout_s: float = 30.0
    # The longest lifetime (exp - iat, and exp - now) a host's token may have.
    max_token_ttl_s: float = 3600.0
    # The agents' manifests (the planner's WRIT_AGENTS_DIR): a host's command for an agent
    # none declares is refused `UNKNOWN_AGENT`. Empty: not checked here.
    agents_dir: str = ""
    # The HTTP API (`/api/v1`): 0 takes a free port, written to `http_port_file` once it
    # listens; `http_enabled: false` serves NATS only.
    http_enabled: bool = True
    http_host: str = "127.0.0.1"
    http_port: int = 0
    http_port_file: str = ""
    # How long a POST that waits for its answer (a command, a decision) waits.
    http_answer_timeout_s: float = 30.0
    # The approval receipts' public key set (a JWKS), served at `/api/v1/receipts/keys`.
    receipt_keys_file: str = ""
    # The operators' public key (PEM): who may open the console's MCP pages. Empty: nobody.
    operators_key_file: str = ""


async def _reload_keys(
    path: str, keys: dict[str, TenantKey], stopping: anyio.Event, every_s: float = 1.0
) -> None:
    """Take tenants added (`writ tenant add`) or removed while running: the file is replaced
    whole, so a changed mtime is a complete new version. `keys` is changed in place (the
    service holds it); a file that does not decode leaves the keys as they were."""
    seen = (await anyio.Path(path).stat()).st_mtime_ns
    while not stopping.is_set():
        await anyio.sleep(every_s)
        try:
            mtime = (await anyio.Path(path).stat()).st_mtime_ns
            if mtime == seen:
                continue
            fresh = msgspec.json.decode(
                await anyio.Path(path).read_bytes(), type=dict[str, TenantKey]
            )
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("tenant keys not reloaded: %r", exc)
            continue
        seen = mtime
        keys.clear()
        keys.update(fresh)
        log.info("tenant keys reloaded: %d tenants", len(keys))


def operators_key(path: str) -> OperatorKey | None:
    """The operators' public key at `path`, or None: nobody is an operator.

    The chart mounts it from an optional Secret: a path named whose file is absent (the Secret
    was not created) lets nobody in as an operator, and says so. A file that is there but is
    not an Ed25519 public key (the signing half, say, which belongs in no pod) stops ingress.
    """
    if not path:
        return None
    if not Path(path).exists():
        log.warning("no operators' key at %s: nobody signs in as an operator", path)
        return None
    try:
        return OperatorKey(read_secret(path).encode())
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not the operators' public key (an Ed25519 public key in PEM; "
            f"the signing half belongs to no service): {exc}"
        ) from exc


def main() -> None:
    """Start the ingress process."""
    settings = load_settings(IngressSettings)
    keys = msgspec.json.decode(read_secret(settings.tenant_keys_file), type=dict[str, TenantKey])
    agents = declared_agents(Path(settings.agents_dir)) if settings.agents_dir else None
    operators = operators_key(settings.operators_key_file)

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        svc = IngressService(
            rt=rt,
            keys=keys,
            audience=settings.audience,
            max_request_bytes=settings.max_request_bytes,
            review_timeout_s=settings.review_timeout_s,
            agents=agents,
            max_token_ttl_s=settings.max_token_ttl_s,
        )
        if not settings.http_enabled:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_reload_keys, settings.tenant_keys_file, keys, rt.stopping)
                await svc.run(task_status=task_status)
            return
        http = HttpServer(
            door=svc,
            nc=rt.nc,
            js=rt.js,
            stopping=rt.stopping,
            host=settings.http_host,
            port=settings.http_port,
            port_file=settings.http_port_file,
            max_body_bytes=settings.max_request_bytes,
            answer_timeout_s=settings.http_answer_timeout_s,
            endpoints=rt.endpoints,
            registry=rt.registry,
            tracer=rt.tracer,
            receipt_keys_file=settings.receipt_keys_file,
            operators=operators,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(_reload_keys, settings.tenant_keys_file, keys, rt.stopping)
            await tg.start(http.run)
            await svc.run(task_status=task_status)

    run_service("ingress", settings, start, description="Verifies hosts' requests, starts runs")


if __name__ == "__main__":
    main()
