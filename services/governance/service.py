"""Governance: decides every capability call, keeps the pending decisions people answer, loads
the organisation's signed policy, and keeps run budgets. It holds the rule store, nothing that
acts.

Its parts: `deciding.py` decides calls (alone or together), `answers.py` takes people's answers,
`serving.py` serves a request/reply endpoint, `policy.py` loads signed policy, `store/` the SQL.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import anyio.abc
import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from nats.micro.request import Request
from prometheus_client import Counter

from libs.actor import run_actor
from libs.bus import ConsumerSpec
from libs.journal import Sealer
from libs.runtime import BatchEndpoint, Endpoint, Runtime
from schemas import subjects
from schemas.governance import (
    AnswerDecision,
    BudgetRefused,
    BudgetReserved,
    BudgetSettled,
    CapSpend,
    ListPending,
    ListSpend,
    PendingDecisions,
    RegisterRun,
    RegisterTurn,
    ReserveBudget,
    RunRegistered,
    SettleBudget,
    SpendReport,
)
from schemas.mcp import ClassifyTool, RecordListing
from services.governance.answers import Answers
from services.governance.budgets import BudgetDefaults
from services.governance.deciding import Decider
from services.governance.mcp import McpRegistry
from services.governance.policy import load_policy
from services.governance.registration import turn_run, widening
from services.governance.serving import NotFound, RegistrationRefused, endpoint
from services.governance.spend import PricesRefused, read_prices
from services.governance.spend_metrics import SpendGauges
from services.governance.store import GovernanceStore

__all__ = ["GovernanceService"]

INBOX = ConsumerSpec(
    stream="WRIT_INT", durable="governance", filter_subjects=subjects.GOVERNANCE_IN
)
log = logging.getLogger("writ.governance")


class GovernanceService:
    """Decides capability calls; an unreadable store or a refused policy denies what is
    sensitive, and an unanswered ask is a deny."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: GovernanceStore,
        policy_dir: Path | None = None,
        policy_keys: dict[str, Ed25519PublicKey] | None = None,
        policy_poll_s: float = 2.0,
        overdue_poll_s: float = 1.0,
        sealer: Sealer | None = None,
        budget_defaults: BudgetDefaults | None = None,
        mcp: McpRegistry | None = None,
        spend_label_tenants: Iterable[str] = (),
    ) -> None:
        self._rt, self._store, self._sealer, self._mcp = rt, store, sealer, mcp
        self._budget_defaults = budget_defaults or BudgetDefaults()
        self._policy_dir, self._policy_keys = policy_dir, policy_keys or {}
        self._policy_poll_s, self._overdue_poll_s = policy_poll_s, overdue_poll_s
        self._policy_seen: dict[str, tuple[float, int]] = {}
        self._prices_seen: dict[str, tuple[float, int]] = {}
        self._decider = Decider(rt=rt, store=store, mcp=mcp)
        self._answers = Answers(rt=rt, store=store)
        self._encoder = msgspec.json.Encoder()
        # `budget` is one of the BudgetKind values. (The planner's own
        # writ_planner_budget_* counter counts what it stopped; this counts what governance
        # refused.)
        self._exhausted = Counter(
            "writ_governance_budget_exhausted",
            "Budget reservations refused, by the budget that ran out",
            ["budget"],
            registry=rt.registry,
        )
        # By cap name only (at most 100 per price table, the same names across tenants), so
        # the labels stay bounded whatever the number of tenants.
        self._spend_refused = Counter(
            "writ_governance_spend_refused",
            "Reservations refused by a spend cap, by the cap's name",
            ["cap"],
            registry=rt.registry,
        )
        self._spend_gauges = SpendGauges(rt.registry, spend_label_tenants)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve `decide`, run registration and pending decisions; take answers; until stopped."""
        await self.load_policies()  # before the first decision, not after
        self._rt.endpoints += self.endpoints()
        async with anyio.create_task_group() as tg:
            if self._sealer is not None:
                await tg.start(self._sealer.run)  # chains and signs the audit journal
            tg.start_soon(self._every, self._policy_poll_s, self.load_policies)
            tg.start_soon(self._every, self._overdue_poll_s, self.deny_overdue)
            tg.start_soon(self._every, self._policy_poll_s, self.refresh_spend)
            await run_actor(
                js=self._rt.js,
                spec=INBOX,
                decoder=msgspec.json.Decoder(AnswerDecision),
                handler=self._answers.on_answer,
                metrics=self._rt.metrics,
                tracer=self._rt.tracer,
                stopping=self._rt.stopping,
                health=self._rt.health,
                task_status=task_status,
                backoff_max_s=self._rt.retry_backoff_max_s,
                outage_limit_s=self._rt.outage_limit_s,
            )
            tg.cancel_scope.cancel()

    # -- request/reply ----------------------------------------------------------------------

    def endpoints(self) -> list[Endpoint | BatchEndpoint]:
        """The request/reply endpoints `run` serves (tests may serve them alone)."""
        return [
            # Concurrent decides are decided together: their facts read in one statement, their
            # allows and denies recorded in one transaction (per decision, far fewer round
            # trips, commits and tasks under load; alone, a batch of one goes at once).
            BatchEndpoint("decide", subjects.DECIDE, self._decider.decide_requests),
            BatchEndpoint(
                "decide_batch", subjects.DECIDE_BATCH, self._decider.decide_batches, max_batch=16
            ),
            Endpoint(
                "register_run",
                subjects.REGISTER_RUN,
                self._endpoint("register_run", RegisterRun, self.register_run),
            ),
            Endpoint(
                "register_turn",
                subjects.REGISTER_TURN,
                self._endpoint("register_turn", RegisterTurn, self.register_turn),
            ),
            Endpoint(
                "pending",
                subjects.PENDING_LIST,
                self._endpoint("pending", ListPending, self.list_pending),
            ),
            Endpoint("answer", subjects.ANSWER, self._answers.answer_endpoint),
            Endpoint(
                "spend",
                subjects.SPEND_LIST,
                self._endpoint("spend", ListSpend, self.list_spend),
            ),
            Endpoint(
                "reserve", subjects.RESERVE, self._endpoint("reserve", ReserveBudget, self.reserve)
            ),
            Endpoint(
                "settle", subjects.SETTLE, self._endpoint("settle", SettleBudget, self.settle)
            ),
            *(
                []
                if self._mcp is None
                else [
                    Endpoint(
                        "mcp_listing",
                        subjects.MCP_LISTING,
                        self._endpoint("mcp_listing", RecordListing, self._mcp.record_listing),
                    ),
                    Endpoint(
                        "mcp_classify",
                        subjects.MCP_CLASSIFY,
                        self._endpoint("mcp_classify", ClassifyTool, self._mcp.classify),
                    ),
                ]
            ),
        ]

    def _endpoint(
        self, name: str, kind: type, handle: Callable[..., Awaitable[msgspec.Struct]]
    ) -> Callable[[Request], Awaitable[None]]:
        return endpoint(self._rt, self._encoder, name, kind, handle)

    async def register_run(self, run: RegisterRun) -> RunRegistered:
        """Record what ingress verified about a run before it starts, and its budget; refuse
        a registration of a known run that asks more than it was registered with."""
        wider = widening(await self._store.registered(run.tenant, run.run_id), run)
        if wider:
            raise RegistrationRefused(
                f"run {run.run_id} is registered already; this would widen {wider}"
            )
        await self._store.register_run(run, self._budget_defaults.limits_for(run.agent, run.budget))
        return RunRegistered(run_id=run.run_id)

    async def register_turn(self, turn: RegisterTurn) -> RunRegistered:
        """Register a chat turn's run (from the planner): no grants of its own
        (`registration.turn_run`)."""
        run = turn_run(turn)
        if run is None:
            raise RegistrationRefused(
                f"run {turn.run_id} is not a turn of session {turn.session_id}"
            )
        return await self.register_run(run)

    async def reserve(self, ask: ReserveBudget) -> BudgetReserved | BudgetRefused:
        """Reserve a step's budget, or refuse naming what ran out; a store that cannot be read
        reserves nothing (fail closed)."""
        try:
            answer = await self._store.reserve(
                tenant=ask.tenant,
                run_id=ask.run_id,
                step_key=ask.step_key,
                provider_calls=ask.provider_calls,
                tokens=ask.tokens,
                capability_calls=ask.capability_calls,
                limit=ask.limit,
                settle=ask.settle,
                up_to=ask.up_to,
                model=ask.model,
                action=ask.action,
                amount=ask.amount,
                currency=ask.currency,
            )
        except Exception as exc:  # cannot know what is left: nothing is left (nor settled)
            log.warning("budget store unreadable: %r", exc)
            return BudgetRefused(
                run_id=ask.run_id,
                step_key=ask.step_key,
                budget="unavailable",
                reason="governance cannot read its budget store",
            )
        if isinstance(answer, BudgetRefused) and answer.budget not in (
            "unavailable",
            "unknown_run",
        ):
            self._exhausted.labels(answer.budget).inc()
            if answer.cap is not None:
                self._spend_refused.labels(answer.cap).inc()
        return answer

    async def list_spend(self, ask: ListSpend) -> SpendReport:
        """The tenant's spend against its caps, newest windows first."""
        rows = await self._store.spend(ask.tenant, ask.cap)
        return SpendReport(spend=[msgspec.convert(r, CapSpend) for r in rows])

    async def settle(self, ask: SettleBudget) -> BudgetSettled:
        """Close a reservation with what the step used, or with `credit` give back its spend
        charge (404: no such reservation)."""
        if ask.credit:
            credited = await self._store.credit(ask.tenant, ask.run_id, ask.reservation_id)
            if credited is None:
                raise NotFound("no such reservation for this run")
            return credited
        settled = await self._store.settle(
            tenant=ask.tenant,
            run_id=ask.run_id,
            reservation_id=ask.reservation_id,
            provider_calls=ask.provider_calls,
            tokens=ask.tokens,
            capability_calls=ask.capability_calls,
            release=ask.release,
            input_tokens=ask.input_tokens,
            output_tokens=ask.output_tokens,
        )
        if settled is None:
            raise NotFound("no such reservation for this run")
        return settled

    async def list_pending(self, ask: ListPending) -> PendingDecisions:
        """The tenant's decisions waiting for a person."""
        decisions, total, cursor = await self._store.pending_page(ask)
        return PendingDecisions(decisions=decisions, total=total, next_cursor=cursor)

    async def deny_overdue(self) -> None:
        """An ask nobody answered in time is a deny (`Answers.deny_overdue`)."""
        await self._answers.deny_overdue()

    # -- policy -----------------------------------------------------------------------------

    async def load_policies(self) -> None:
        """(Re)load every changed `<tenant>.json` in the policy folder."""
        if self._policy_dir is None or not self._policy_dir.is_dir():
            return
        present = {path.stem for path in self._policy_dir.glob("*.json")}
        known = (
            set(self._policy_seen) if self._policy_seen else set(await self._store.policy_tenants())
        )  # on start: what an earlier process loaded
        for tenant in sorted(known - present):
            # The organisation withdrew the file: back to no org policy (the defaults).
            await self._store.drop_policy(tenant)
            self._policy_seen.pop(tenant, None)
            log.info("policy for %s withdrawn", tenant)
        for path in sorted(self._policy_dir.glob("*.json")):
            stat = path.stat()
            stamp = (stat.st_mtime, stat.st_size)
            tenant = path.stem
            if self._policy_seen.get(tenant) == stamp:
                continue
            policy = load_policy(path, tenant, self._policy_keys)
            await self._store.save_policy(policy)
            self._policy_seen[tenant] = stamp
            if policy.status == "valid":
                log.info("policy %s loaded for %s", policy.version, tenant)
            else:
                log.warning(
                    "policy for %s REFUSED (%s): sensitive calls denied", tenant, policy.refusal
                )
        self.load_prices()

    async def refresh_spend(self) -> None:
        """Read every cap's current window into the spend gauges (`spend_metrics.py`)."""
        self._spend_gauges.update(await self._store.current())

    def load_prices(self) -> None:
        """(Re)load every changed `prices/<tenant>.json` (a signed price table and its spend
        caps) in the policy folder. A file that does not verify changes nothing: the caps
        signed before it stay in force."""
        folder = self._policy_dir / "prices" if self._policy_dir is not None else None
        if folder is None or not folder.is_dir():
            return
        for path in sorted(folder.glob("*.json")):
            stat = path.stat()
            stamp = (stat.st_mtime, stat.st_size)
            if self._prices_seen.get(path.stem) == stamp:
                continue
            self._prices_seen[path.stem] = stamp
            try:
                table, digest = read_prices(path, path.stem, self._policy_keys)
            except PricesRefused as exc:
                log.error("price table for %s REFUSED (%s): earlier caps kept", path.stem, exc)
                continue
            self._store.set_prices(path.stem, table, digest)
            log.info("price table %s loaded for %s", table.version, path.stem)

    async def _every(self, period: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await anyio.sleep(period)
            try:
                await job()
            except Exception as exc:
                log.warning("%s failed: %r", getattr(job, "__name__", "job"), exc)
