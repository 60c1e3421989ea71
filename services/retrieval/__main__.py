"""`writ service retrieval`: the composition root of the retrieval process."""

from __future__ import annotations

import anyio.abc

from libs.db import connect_pool
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.retrieval.mcp import McpReads, ServerRegistry
from services.retrieval.service import RetrievalService
from services.retrieval.store import RetrievalStore


class RetrievalSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus and retrieval's own read-only database role."""

    database_url: str
    database_password_file: str
    decide_timeout_s: float = 2.0
    # Federation (services/retrieval/mcp/): the operator's registration of MCP servers. The
    # credentials it names are files only this process is given.
    mcp_servers_file: str = ""
    mcp_breaker_cooldown_s: float = 30.0


def main() -> None:
    """Start the retrieval process."""
    settings = load_settings(RetrievalSettings)
    password = read_secret(settings.database_password_file)

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with await connect_pool(
            settings.database_url, password=password, application_name="writ-retrieval"
        ) as pool:
            rt.health.watch_pool("postgres", pool)
            store = RetrievalStore(pool)
            mcp = McpReads(
                nc=rt.nc,
                servers=ServerRegistry(settings.mcp_servers_file or None),
                classified=store.classification,
                decide_timeout_s=settings.decide_timeout_s,
                breaker_cooldown_s=settings.mcp_breaker_cooldown_s,
            )
            svc = RetrievalService(
                rt=rt, store=store, decide_timeout_s=settings.decide_timeout_s, mcp=mcp
            )
            await svc.run(task_status=task_status)

    run_service(
        "retrieval",
        settings,
        start,
        description="Gathers tenant-scoped evidence and executes reads",
    )


if __name__ == "__main__":
    main()
