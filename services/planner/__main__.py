"""`writ service planner`: the composition root of the planner process.

The planner's settings have no field for any connector credential: it cannot be given one.
"""

from __future__ import annotations

import anyio.abc

from libs.db import connect_pool
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.planner.provider import ScriptedProvider
from services.planner.service import PlannerService
from services.planner.store import PlannerStore


class PlannerSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus, the planner's database role, and where its decisions come from."""

    database_url: str
    database_password_file: str
    decisions_file: str
    max_decisions: int = 8


def main() -> None:
    """Start the planner process."""
    settings = load_settings(PlannerSettings)
    password = read_secret(settings.database_password_file)
    provider = ScriptedProvider.from_file(settings.decisions_file)

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with await connect_pool(settings.database_url, password=password,
                                      application_name="writ-planner") as pool:
            svc = PlannerService(rt=rt, store=PlannerStore(pool), provider=provider,
                                 max_decisions=settings.max_decisions)
            await svc.run(task_status=task_status)

    run_service("planner", settings, start, description="Plans runs with the model")


if __name__ == "__main__":
    main()
