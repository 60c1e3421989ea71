"""`writ service governance`: the composition root of the governance process."""

from __future__ import annotations

from pathlib import Path

import anyio.abc
import msgspec

from libs.db import connect_pool
from libs.errors import ConfigError
from libs.journal import JetStreamRecord, Sealer, open_journal, window_key_pool
from libs.journal_audit import JournalVerifyEndpoint
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.governance.budgets import BudgetDefaults
from services.governance.mcp import McpRegistry
from services.governance.policy import load_keys
from services.governance.service import GovernanceService
from services.governance.store import GovernanceStore


class GovernanceSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus, governance's own database role, and where the signed org policies are."""

    database_url: str
    database_password_file: str
    policy_dir: str = ""
    policy_keys_file: str = ""  # {"<key id>": "<Ed25519 public key PEM>"}
    # The audit journal's keys (libs/journal.py has the formats); required to start.
    journal_signing_key_file: str = ""
    journal_data_keys_file: str = ""
    journal_seal_interval_s: float = 0.5
    # Run budgets when the run's registration sets none: {"default": {"provider_calls": 50,
    # "tokens": 200000, "capability_calls": 50, "wall_time_s": 900, "max_concurrent_steps": 4},
    # "agents": {"<agent>": {<any of those>}}}; unset: those built-in defaults.
    budgets_file: str = ""
    # Tenants (comma-separated) whose spend gauges carry their name; every other tenant's
    # are summed under `tenant=""`, so the series stay bounded (spend_metrics.py).
    spend_label_tenants: str = ""


def load_budget_defaults(path: str) -> BudgetDefaults:
    """The budget defaults file, checked (ConfigError if it does not decode)."""
    if not path:
        return BudgetDefaults()
    try:
        return msgspec.json.decode(read_secret(path), type=BudgetDefaults)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"invalid WRIT_BUDGETS_FILE {path}: {exc}") from exc


def main() -> None:
    """Start the governance process."""
    settings = load_settings(GovernanceSettings)
    password = read_secret(settings.database_password_file)
    keys = load_keys(
        msgspec.json.decode(read_secret(settings.policy_keys_file), type=dict[str, str])
        if settings.policy_keys_file
        else {}
    )
    if not (settings.journal_signing_key_file and settings.journal_data_keys_file):
        raise ConfigError(
            "governance records every decision in its audit journal: set "
            "WRIT_JOURNAL_SIGNING_KEY_FILE and WRIT_JOURNAL_DATA_KEYS_FILE"
        )
    journal, signing = open_journal(
        "governance",
        signing_key_file=settings.journal_signing_key_file,
        data_keys_file=settings.journal_data_keys_file,
    )
    budget_defaults = load_budget_defaults(settings.budgets_file)

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        # A short statement timeout: a slow store must turn into a denial, not a stuck caller.
        async with (
            await connect_pool(
                settings.database_url,
                password=password,
                statement_timeout_ms=1000,
                max_size=20,
                application_name="writ-governance",
            ) as pool,
            window_key_pool(
                journal, settings.database_url, password=password, service="governance"
            ),
        ):
            rt.health.watch_pool("postgres", pool)
            rt.endpoints.append(
                JournalVerifyEndpoint(  # the auditors' GET /audit/verify
                    service="governance", pool=pool, journal=journal, signing=signing
                ).endpoint()
            )
            svc = GovernanceService(
                rt=rt,
                store=GovernanceStore(pool, journal=journal),
                policy_dir=Path(settings.policy_dir) if settings.policy_dir else None,
                policy_keys=keys,
                sealer=Sealer(
                    pool=pool,
                    journal=journal,
                    signing=signing,
                    record=JetStreamRecord(rt.record_js),
                    registry=rt.registry,
                    interval=settings.journal_seal_interval_s,
                ),
                budget_defaults=budget_defaults,
                mcp=McpRegistry(pool, journal=journal),
                spend_label_tenants=filter(None, settings.spend_label_tenants.split(",")),
            )
            await svc.run(task_status=task_status)

    run_service("governance", settings, start, description="Decides every capability call")


if __name__ == "__main__":
    main()
