"""`writ service governance`: the composition root of the governance process."""

from __future__ import annotations

from pathlib import Path

import anyio.abc
import msgspec

from libs.db import connect_pool
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.governance.policy import load_keys
from services.governance.service import GovernanceService
from services.governance.store import GovernanceStore


class GovernanceSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus, governance's own database role, and where the signed org policies are."""

    database_url: str
    database_password_file: str
    policy_dir: str = ""
    policy_keys_file: str = ""  # {"<key id>": "<Ed25519 public key PEM>"}


def main() -> None:
    """Start the governance process."""
    settings = load_settings(GovernanceSettings)
    password = read_secret(settings.database_password_file)
    keys = load_keys(msgspec.json.decode(read_secret(settings.policy_keys_file),
                                         type=dict[str, str])
                     if settings.policy_keys_file else {})

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # A short statement timeout: a slow store must turn into a denial, not a stuck caller.
        async with await connect_pool(settings.database_url, password=password,
                                      statement_timeout_ms=1000, max_size=20,
                                      application_name="writ-governance") as pool:
            svc = GovernanceService(
                rt=rt, store=GovernanceStore(pool),
                policy_dir=Path(settings.policy_dir) if settings.policy_dir else None,
                policy_keys=keys)
            await svc.run(task_status=task_status)

    run_service("governance", settings, start, description="Decides every capability call")


if __name__ == "__main__":
    main()
