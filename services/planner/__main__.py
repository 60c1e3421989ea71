"""`writ service planner`: the composition root of the planner process.

The planner's settings have no field for any connector credential: it cannot be given one. The
model key it may hold is read from `model_key_file` only when `provider` is `openai`.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Literal

import anyio.abc

from actions import ACTIONS
from libs.db import connect_pool
from libs.errors import ConfigError
from libs.journal import JetStreamRecord, Sealer, open_journal, window_key_pool
from libs.journal_audit import JournalVerifyEndpoint
from libs.runtime import Runtime, run_service
from libs.settings import BaseSettings, load_settings, read_secret
from schemas.retrieval import READ_TOOLS
from services.planner.agents import AgentRegistry
from services.planner.openai_provider import OpenAIProvider, load_capabilities
from services.planner.provider import DecisionProvider, ScriptedProvider
from services.planner.reads import ReadClient
from services.planner.service import CONCURRENCY, PlannerService, pool_size
from services.planner.sessions import SessionStore, SessionTurns
from services.planner.store import PlannerStore


class PlannerSettings(BaseSettings, frozen=True, kw_only=True):
    """The bus, the planner's database role, and where its decisions come from."""

    database_url: str
    database_password_file: str
    provider: Literal["scripted", "openai"] = "scripted"
    # The agents' manifests (`<name>.json` each): a run for an agent none declares fails.
    agents_dir: str = ""
    decisions_file: str = ""  # scripted: the script
    # openai: any OpenAI-compatible chat-completions API (`<model_url>/chat/completions`).
    model_url: str = ""
    model_name: str = ""
    model_key_file: str = ""
    model_mode: Literal["structured", "tools"] = "structured"
    model_capabilities_file: str = ""  # JSON list of {name, description, parameters}
    model_timeout_s: float = 30.0
    model_max_attempts: int = 3  # per decision; a run makes at most max_decisions of them
    # The planner holds its run's row lock while the model thinks, and its pool's Postgres
    # sessions end after 60 s idle in a transaction: every decision ends well before that.
    model_deadline_s: float = 45.0
    max_decisions: int = 8
    # Deliveries handled at once; the pool gets a connection for each (`pool_size`).
    concurrency: int = CONCURRENCY
    # How long a read capability waits for retrieval's answer (no answer: retried, never a
    # result).
    read_timeout_s: float = 5.0
    # Tokens a provider call reserves of the run's budget before it starts (settled with what
    # the provider reports; the scripted provider reports 0).
    model_reserve_tokens: int = 4096
    # Steps a root run's budget lease covers (`budgeting.py`): it reserves up to this many
    # provider calls, capability calls and model reservations' tokens at once, where the run
    # has them; 0: every step reserves in governance on its own.
    budget_lease_steps: int = 8
    # A running run no transaction locked for this long waits on a message the bus may have
    # lost: the sweeper, looking every `run_sweep_every_s`, drives it again (`sweeper.py`).
    run_sweep_stall_s: float = 20.0
    run_sweep_every_s: float = 5.0
    # The audit journal's keys (libs/journal.py has the formats); required to start.
    journal_signing_key_file: str = ""
    journal_data_keys_file: str = ""
    journal_seal_interval_s: float = 0.5


def main() -> None:
    """Start the planner process."""
    settings = load_settings(PlannerSettings)
    password = read_secret(settings.database_password_file)
    scripted: ScriptedProvider | None = None
    if settings.provider == "scripted":
        if not settings.decisions_file:
            raise ConfigError("WRIT_DECISIONS_FILE is required with the scripted provider")
        scripted = ScriptedProvider.from_file(settings.decisions_file)
    elif not (settings.model_url and settings.model_name and settings.model_key_file):
        raise ConfigError(
            "the openai provider needs WRIT_MODEL_URL, WRIT_MODEL_NAME and WRIT_MODEL_KEY_FILE"
        )
    if not settings.agents_dir:
        raise ConfigError("WRIT_AGENTS_DIR is required: the folder of the agents' manifests")
    agents = AgentRegistry.from_folder(settings.agents_dir)
    # Read tools resolve against retrieval's catalog (`schemas.retrieval.READ_TOOLS`).
    agents.resolve(actions=ACTIONS, tools=READ_TOOLS, providers=(settings.provider,))
    capabilities = (
        load_capabilities(settings.model_capabilities_file)
        if settings.model_capabilities_file
        else []
    )
    if not (settings.journal_signing_key_file and settings.journal_data_keys_file):
        raise ConfigError(
            "the planner captures every model response and tool output in its "
            "audit journal: set WRIT_JOURNAL_SIGNING_KEY_FILE and "
            "WRIT_JOURNAL_DATA_KEYS_FILE"
        )
    journal, signing = open_journal(
        "planner",
        signing_key_file=settings.journal_signing_key_file,
        data_keys_file=settings.journal_data_keys_file,
    )

    async def start(rt: Runtime, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with AsyncExitStack() as stack:
            provider: DecisionProvider = (
                scripted
                if scripted is not None
                else (
                    await stack.enter_async_context(
                        OpenAIProvider(
                            base_url=settings.model_url,
                            model=settings.model_name,
                            key_file=settings.model_key_file,
                            mode=settings.model_mode,
                            capabilities=capabilities,
                            timeout_s=settings.model_timeout_s,
                            max_attempts=settings.model_max_attempts,
                            deadline_s=settings.model_deadline_s,
                        )
                    )
                )
            )
            pool = await stack.enter_async_context(
                await connect_pool(
                    settings.database_url,
                    password=password,
                    application_name="writ-planner",
                    max_size=pool_size(settings.concurrency),
                )
            )
            await stack.enter_async_context(
                window_key_pool(
                    journal, settings.database_url, password=password, service="planner"
                )
            )
            rt.health.watch_pool("postgres", pool)
            rt.endpoints.append(
                JournalVerifyEndpoint(  # the auditors' GET /audit/verify
                    service="planner", pool=pool, journal=journal, signing=signing
                ).endpoint()
            )
            svc = PlannerService(
                rt=rt,
                store=PlannerStore(pool, journal=journal),
                provider=provider,
                agents=agents,
                max_decisions=settings.max_decisions,
                concurrency=settings.concurrency,
                reserve_tokens=settings.model_reserve_tokens,
                lease_steps=settings.budget_lease_steps,
                sweep_stall_s=settings.run_sweep_stall_s,
                sweep_every_s=settings.run_sweep_every_s,
                reads=ReadClient(nc=rt.nc, timeout=settings.read_timeout_s),
                sessions=SessionTurns(
                    nc=rt.nc, js=rt.js, store=SessionStore(pool, journal=journal)
                ),
                sealer=Sealer(
                    pool=pool,
                    journal=journal,
                    signing=signing,
                    record=JetStreamRecord(rt.record_js),
                    registry=rt.registry,
                    interval=settings.journal_seal_interval_s,
                ),
            )
            await svc.run(task_status=task_status)

    run_service("planner", settings, start, description="Plans runs with the model")


if __name__ == "__main__":
    main()
