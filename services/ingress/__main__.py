"""`writ service ingress`: the composition root of the ingress process."""

from __future__ import annotations

from pathlib import Path

import anyio.abc
import msgspec

from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.ingress.logic import TenantKey, declared_agents
from services.ingress.service import IngressService


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


def main() -> None:
    """Start the ingress process."""
    settings = load_settings(IngressSettings)
    keys = msgspec.json.decode(read_secret(settings.tenant_keys_file), type=dict[str, TenantKey])
    agents = declared_agents(Path(settings.agents_dir)) if settings.agents_dir else None

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        svc = IngressService(rt=rt, keys=keys, audience=settings.audience,
                             max_request_bytes=settings.max_request_bytes,
                             review_timeout_s=settings.review_timeout_s, agents=agents,
                             max_token_ttl_s=settings.max_token_ttl_s)
        await svc.run(task_status=task_status)

    run_service("ingress", settings, start, description="Verifies hosts' requests, starts runs")


if __name__ == "__main__":
    main()
