"""`writ service admission`: the composition root of the admission process."""

from __future__ import annotations

from datetime import timedelta

import anyio.abc

from libs.db import connect_pool
from libs.journal import JetStreamRecord, Sealer, open_journal, window_key_pool
from libs.journal_audit import JournalVerifyEndpoint
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from services.admission._plan_facts import PlanFactsEndpoint
from services.admission._sealed import window_keys
from services.admission.reads import AdmissionReads
from services.admission.receipts import Authorizer, ReceiptSigner
from services.admission.relay import OutboxRelay
from services.admission.service import AdmissionService
from services.admission.store import AdmissionStore
from services.admission.sweeper import AnswerSweeper


class AdmissionSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus, admission's own database role, and how long an admitted command stays valid."""

    database_url: str
    database_password_file: str
    command_ttl_s: float = 3600.0
    # How long a proposal waits for a person before it can no longer be approved.
    proposal_ttl_s: float = 86400.0
    # The audit journal's keys (libs/journal.py has the formats); required to start.
    journal_signing_key_file: str = ""
    journal_data_keys_file: str = ""
    journal_seal_interval_s: float = 0.5
    relay_poll_s: float = 1.0
    # A proposal whose decision governance answered this long ago and that admission has not
    # moved (the answer's message lost), or a host command that ended this long ago and whose
    # host was not told: the sweeper, looking every `answer_sweep_every_s`, acts on the
    # recorded answer, or tells the host (`sweeper.py`).
    answer_sweep_stall_s: float = 20.0
    answer_sweep_every_s: float = 5.0
    # Approval receipts' signing key (the journal key file's format; docs/receipts.md). Empty:
    # no receipts are signed, and systems of record that check them refuse every write.
    receipt_signing_key_file: str = ""
    # How long after a command's own expiry its receipt still verifies (a retried send).
    receipt_grace_s: float = 600.0


def main() -> None:
    """Start the admission process."""
    settings = load_settings(AdmissionSettings)
    password = read_secret(settings.database_password_file)
    journal, signing = open_journal(
        "admission",
        signing_key_file=settings.journal_signing_key_file,
        data_keys_file=settings.journal_data_keys_file,
    )
    authorizer = (
        Authorizer(
            ReceiptSigner.from_file(settings.receipt_signing_key_file),
            journal,
            grace=timedelta(seconds=settings.receipt_grace_s),
        )
        if settings.receipt_signing_key_file
        else None
    )

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with (
            await connect_pool(
                settings.database_url,
                password=password,
                max_size=20,
                application_name="writ-admission",
            ) as pool,
            window_key_pool(journal, settings.database_url, password=password, service="admission"),
        ):
            rt.health.watch_pool("postgres", pool)
            store = AdmissionStore(pool, journal=journal, receipts=authorizer)
            relay = OutboxRelay(
                store=store,
                js=rt.js,
                listen_dsn=settings.database_url,
                listen_password=password,
                poll_s=settings.relay_poll_s,
                faults=rt.faults,
                tracer=rt.tracer,
                authorizer=authorizer,
            )
            sealer = Sealer(
                pool=pool,
                journal=journal,
                signing=signing,
                record=JetStreamRecord(rt.record_js),
                registry=rt.registry,
                interval=settings.journal_seal_interval_s,
            )
            svc = AdmissionService(
                rt=rt,
                store=store,
                relay=relay,
                command_ttl=timedelta(seconds=settings.command_ttl_s),
                proposal_ttl=timedelta(seconds=settings.proposal_ttl_s),
                sealer=sealer,
                sweeper=AnswerSweeper(
                    pool=pool,
                    stall_s=settings.answer_sweep_stall_s,
                    every_s=settings.answer_sweep_every_s,
                ),
            )
            rt.endpoints.append(
                JournalVerifyEndpoint(  # the auditors' GET /audit/verify
                    service="admission", pool=pool, journal=journal, signing=signing
                ).endpoint()
            )
            rt.endpoints.extend(
                AdmissionReads(pool, keys=window_keys(journal)).endpoints()
            )  # ingress's HTTP reads
            # The facts a proposed plan's steps stand on, kept for evaluation.
            rt.endpoints.append(PlanFactsEndpoint(store, rt.nc).endpoint())
            await svc.run(task_status=task_status)

    run_service("admission", settings, start, description="Admits commands, relays the outbox")


if __name__ == "__main__":
    main()
