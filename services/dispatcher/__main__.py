"""`writ service dispatcher`: the composition root of the dispatcher process.

The only service whose settings have fields for connector credentials.
"""

from __future__ import annotations

import anyio.abc

from libs.db import connect_pool
from libs.journal import JetStreamRecord, Sealer, open_journal, window_key_pool
from libs.journal_audit import JournalVerifyEndpoint
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.dispatcher.connectors import (
    Connector,
    CrmConnector,
    HostConnector,
    NoopConnector,
    PaymentConnector,
)
from services.dispatcher.service import DispatcherService
from services.dispatcher.store import DispatcherStore


class DispatcherSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus, the dispatcher's database role, and the connectors' endpoints and credentials."""

    database_url: str
    database_password_file: str
    crm_url: str
    crm_token_file: str
    payments_url: str = ""
    payments_token_file: str = ""
    payments_queryable: bool = False
    # The host product's REST write API (scenario C) and its write credential.
    host_url: str = ""
    host_token_file: str = ""
    noop_connector: bool = True  # `writ.noop`: a canary through the whole governed path
    lease_s: float = 30.0
    call_timeout_s: float = 10.0
    sweep_every_s: float = 5.0
    pending_grace_s: float = 60.0
    # How old an admission's allow may be and still be the re-check before the connector call,
    # while governance's policy epoch has not moved (0: ask `decide` every time).
    recheck_reuse_s: float = 30.0
    # The audit journal's keys (libs/journal.py has the formats); required to start.
    journal_signing_key_file: str = ""
    journal_data_keys_file: str = ""
    journal_seal_interval_s: float = 0.5


def main() -> None:
    """Start the dispatcher process."""
    settings = load_settings(DispatcherSettings)
    password = read_secret(settings.database_password_file)
    journal, signing = open_journal(
        "dispatcher",
        signing_key_file=settings.journal_signing_key_file,
        data_keys_file=settings.journal_data_keys_file,
    )
    crm_token = read_secret(settings.crm_token_file)
    payments_token = read_secret(settings.payments_token_file) if settings.payments_url else ""
    host_token = read_secret(settings.host_token_file) if settings.host_url else ""

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        connectors: dict[str, Connector] = {
            "crm": CrmConnector(
                base_url=settings.crm_url, token=crm_token, timeout_s=settings.call_timeout_s
            )
        }
        if settings.noop_connector:
            connectors["noop"] = NoopConnector()
        if settings.payments_url:
            connectors["payments"] = PaymentConnector(
                base_url=settings.payments_url,
                token=payments_token,
                queryable=settings.payments_queryable,
                timeout_s=settings.call_timeout_s,
            )
        if settings.host_url:
            connectors["host"] = HostConnector(
                base_url=settings.host_url, token=host_token, timeout_s=settings.call_timeout_s
            )
        try:
            async with (
                await connect_pool(
                    settings.database_url,
                    password=password,
                    max_size=20,
                    application_name="writ-dispatcher",
                ) as pool,
                window_key_pool(
                    journal, settings.database_url, password=password, service="dispatcher"
                ),
            ):
                rt.health.watch_pool("postgres", pool)
                rt.endpoints.append(
                    JournalVerifyEndpoint(  # the auditors' GET /audit/verify
                        service="dispatcher", pool=pool, journal=journal, signing=signing
                    ).endpoint()
                )
                svc = DispatcherService(
                    rt=rt,
                    store=DispatcherStore(pool, journal=journal),
                    connectors=connectors,
                    sealer=Sealer(
                        pool=pool,
                        journal=journal,
                        signing=signing,
                        record=JetStreamRecord(rt.record_js),
                        registry=rt.registry,
                        interval=settings.journal_seal_interval_s,
                    ),
                    lease_s=settings.lease_s,
                    call_timeout_s=settings.call_timeout_s,
                    sweep_every_s=settings.sweep_every_s,
                    pending_grace_s=settings.pending_grace_s,
                    recheck_reuse_s=settings.recheck_reuse_s,
                    worker=settings.instance or None,
                )
                await svc.run(task_status=task_status)
        finally:
            for connector in connectors.values():
                await connector.aclose()

    run_service("dispatcher", settings, start, description="Executes admitted commands")


if __name__ == "__main__":
    main()
