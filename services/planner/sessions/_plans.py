"""Plan-mode (docs/design.md §6, the agent-OS runtime view's scenario B): a plan-mode turn first
plans, then, once the user approved the plan by its id, acts — every call still decided by `decide`
where it is made (approving is consent, not an authorisation: "a plan step carries no approval of
its own").

- Which turns plan: every turn of a session opened in plan-mode (asked for by the session, or
  by the agent's manifest), and a turn in which the model marked a selection `consequential`
  (`SelectCapability.consequential`): that selection and every later one of the turn are
  planned. The mark can only ask for a plan: a `false` never leaves plan-mode, and a turn the
  session or the manifest makes plan is planned whatever the model marks.
- Planning: each `select_capability` the model makes is recorded as the plan's next step
  and observed as `PLANNED` — nothing runs. The step holds what the action's contract
  resolves (`_resolve.py`): the request as it will be sent, the frozen arguments and the
  preview, read-only, from the facts admission would read for it; for a read or an agent call,
  its arguments normalised. When the model answers, the steps are frozen, hashed (sha256 of
  their canonical JSON) and given an opaque id; the turn waits for the user (`pending_id` =
  the plan's id).
- Approved: the plan is a contract (as the seeds put it: the application turns the proposal into a
  contract, a person approves the contract). Writ takes its frozen steps itself, in order,
  without asking the model (`plan_next`): each is recorded as a decision marked with its index
  (`PLAN_STEP_KEY`, no model call, no model turn) and goes through `decide`, admission and the
  dispatcher like any selection; its outcome is the model's next observation. A facts-bound
  step has its facts read and resolved again as it is taken (once, in the transaction that
  records it): if its arguments or preview differ from the approved ones, it is refused as
  `PLAN_STALE` (fail closed: nothing reaches admission). A step that cannot run (stale,
  refused) or whose command does not succeed ends the plan and the turn, `failed` with a typed
  code (`plan_next`'s stop); the steps after it are not run, and any change needs a new plan.
  Only once every step has run is the model asked again, for what comes after (its answer):
  a model's answer can never stand in for an approved step. `plan_outcomes` lists every step
  with its outcome for the turn's end (`TurnEnded.plan_steps`).
- Revised: a selection the model makes once every approved step ran is beyond the plan:
  refused as `NOT_IN_PLAN` and recorded as a step of a revised plan. If the model answers with
  such drafts recorded, they are frozen as a new plan (its own id and digest, its previews
  from the facts now) and the turn waits for the user again: a revised plan runs only once
  approved, by Writ again, and then governs the rest of the turn. (A turn recorded before Writ
  took the steps itself may hold a model's own selection of a step; `plan_refusal` still
  judges it as it did, so such turns replay as they ran.)
- Rejected: the turn ends `REJECTED` with the user's reason, which Writ writes into the session
  as the next turn's context.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, Final, Literal

import msgspec

from schemas.planner import preview_digest
from schemas.sessions import (
    PlanDecided,
    PlanProposed,
    PlanStep,
    PlanStepOutcome,
    PlanView,
    WriterNote,
)
from services.planner.observations import ReviewAnswered, observation_of
from services.planner.provider import SelectCapability
from services.planner.sessions._execute import (
    PLAN_STEP_FAILED,
    PLAN_STEP_KEY,
    _approved_at,
    model_payload,
    plan_next,
    plan_outcomes,
    plan_taken,
)
from services.planner.sessions._resolve import (
    PlanFacts,
    canonical,
    changed,
    contract_of,
    request_of,
    resolve,
)
from services.planner.sessions._store import SessionRow, SessionStore
from services.planner.sessions.logic import is_turn_run, turn_of
from services.planner.store import PlannerStore, RunRow, Step

__all__ = [
    "NOT_IN_PLAN",
    "PLAN_STEP_FAILED",
    "PLAN_STEP_KEY",
    "PLANNED",
    "HELD_CODE",
    "PAUSE_PREFIX",
    "PLAN_PREFIX",
    "PLAN_REJECTED",
    "PLAN_STALE",
    "PLAN_WAIT",
    "PlanAnsweredAlready",
    "SessionClosedAlready",
    "PlanCheck",
    "Plans",
    "facts_bound",
    "marked",
    "plan_digest",
    "plan_drafts",
    "plan_outline",
    "plan_next",
    "plan_outcomes",
    "plan_refusal",
    "plan_taken",
    "model_payload",
]

PLAN_PREFIX: Final = "plan-"
# What a turn waits on when its selection is held by a paused session (`planner.runs.pending_id`).
PAUSE_PREFIX: Final = "pause-"
HELD_CODE: Final = "SESSION_PAUSED"  # (its status's code)
# What a turn says while its plan waits for the user, and a rejection's reason when none given.
PLAN_WAIT: Final = "the plan waits for the user's approval"
PLAN_REJECTED: Final = "the user rejected the plan"
PLANNED: Final = "PLANNED"
NOT_IN_PLAN: Final = "NOT_IN_PLAN"
# An approved facts-bound step whose facts changed since: refused, a revised plan may follow.
PLAN_STALE: Final = "PLAN_STALE"
_DEVIATIONS: Final = (NOT_IN_PLAN, PLAN_STALE)
_COLUMNS: Final = "plan_id, session_id, tenant, turn, run_id, step, state, digest, steps, reason"


def plan_digest(steps: list[PlanStep]) -> str:
    """sha256 of the plan's canonical steps: what an approval consents to."""
    return hashlib.sha256(msgspec.json.encode(steps, order="sorted")).hexdigest()


class PlanCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What a plan makes of a selection: refused (`(check, reason)`), or `decision` to act on,
    with `plan_preview` for admission (the digest of the preview the plan showed for it)."""

    decision: SelectCapability
    refused: tuple[str, str] | None = None
    plan_preview: str | None = None


def marked(steps: list[Step]) -> bool:
    """Whether the model marked a selection of this run `consequential` (the turn plans)."""
    return any(s.kind == "decision" and s.payload.get("consequential") is True for s in steps)


def _view(row: Any) -> PlanView:
    return PlanView(
        plan_id=row["plan_id"],
        session_id=row["session_id"],
        turn=row["turn"],
        state=row["state"],
        digest=row["digest"],
        steps=msgspec.convert(json.loads(row["steps"]), list[PlanStep]),
        reason=row["reason"],
    )


def _selections(steps: list[Step], *checks: str, after: int = -1) -> list[Step]:
    """The decisions after `after` whose observation was one of the runtime's `checks`
    refusals."""
    by_seq = {s.seq: s for s in steps}
    return [
        by_seq[s.seq - 1]
        for s in steps
        if s.seq > after
        and s.kind == "observation"
        and s.payload.get("refused") in checks
        and by_seq.get(s.seq - 1) is not None
    ]


def _progress(steps: list[Step], plan_step: int) -> tuple[list[Step], list[Step]]:
    """Under the approved plan frozen at `plan_step`: (the observations of its steps taken
    since it was approved, the deviations recorded since the last step taken — a revised
    plan's drafts)."""
    approved_at = max(
        (s.seq for s in steps if s.kind == "observation" and s.payload.get("review") == "approve"),
        default=plan_step,
    )
    done = [
        s
        for s in steps
        if s.seq > approved_at
        and s.kind == "observation"
        and s.payload.get("refused") is None
        and s.payload.get("review") is None
    ]
    since = done[-1].seq if done else approved_at
    return done, _selections(steps, *_DEVIATIONS, after=since)


def plan_refusal(
    steps: list[Step], approved: tuple[list[PlanStep], int] | None, decision: SelectCapability
) -> tuple[str, str] | PlanStep | None:
    """A planning turn's selection at the end of `steps`, given the plan approved for the
    turn (its steps and the step it was frozen at) if any: refused `PLANNED` while planning,
    `NOT_IN_PLAN` if it is not the approved plan's next step (same capability, a request that
    decodes the same however the model wrote it); else the approved step it takes (pure: the
    loop and `writ audit replay` both ask it; the loop then reads a facts-bound step's facts
    again, which replay cannot)."""
    if approved is None:
        index = len(_selections(steps, PLANNED)) + 1
        return PLANNED, (
            f"recorded as step {index} of the plan; nothing runs before the user approves the plan"
        )
    planned, plan_step = approved
    done, drafts = _progress(steps, plan_step)
    index = len(done)
    revision = (
        f"; recorded as step {len(drafts) + 1} of a revised plan, which runs only "
        "once the user approves it (answer to propose it)"
    )
    if index >= len(planned):
        return NOT_IN_PLAN, (f"the approved plan has {len(planned)} steps, all taken" + revision)[
            :512
        ]
    expected = planned[index]
    request, _ = request_of(decision.capability, decision.arguments)
    if expected.capability != decision.capability or (
        canonical(expected.request if expected.request is not None else expected.arguments)
        != canonical(request)
    ):
        return NOT_IN_PLAN, (
            f"step {index + 1} of the approved plan is {expected.capability} "
            "with its own arguments; this call is not in the plan" + revision
        )[:512]
    return expected


def plan_drafts(steps: list[Step], approved_step: int | None) -> list[tuple[str, dict[str, Any]]]:
    """(capability, arguments as the model wrote them) of each step a planning turn's answer
    freezes as a plan (empty: it planned nothing): its `PLANNED` selections, or under the plan
    approved at `approved_step` the revised plan's drafts (pure, like `plan_refusal`)."""
    return [_draft(s) for s in _drafted(steps, approved_step)]


def _drafted(steps: list[Step], approved_step: int | None) -> list[Step]:
    """The selections `plan_drafts` freezes, as recorded."""
    if approved_step is None:
        return _selections(steps, PLANNED)
    return _progress(steps, approved_step)[1]


def _draft(s: Step) -> tuple[str, dict[str, Any]]:
    return str(s.payload.get("capability", ""))[:512], dict(s.payload.get("arguments") or {})


class PlanAnsweredAlready(Exception):
    """The plan was approved or rejected already: an answer does not change it."""


class SessionClosedAlready(Exception):
    """The plan's session is closed: nothing answers its plans any more."""


def facts_bound(capability: str, arguments: dict[str, Any]) -> bool:
    """Whether an approved step's selection reads facts when taken (and may then be refused
    `PLAN_STALE`, which replay, reading no facts, accepts in place of its proposal)."""
    contract = contract_of(capability)
    _, typed = request_of(capability, arguments)
    return contract is not None and typed is not None and contract.facts_ref(typed) is not None


def plan_outline(drafts: list[tuple[str, dict[str, Any]]]) -> bytes:
    """What of a plan its drafts alone decide (each step's capability and request; the
    arguments and preview stand on facts read when it was frozen): how replay checks a
    captured plan."""
    return canonical([[c, request_of(c, a)[0]] for c, a in drafts])


class Plans:
    """Plans of plan-mode sessions, read and written in the run's or the session's
    transaction."""

    def __init__(self, *, sessions: SessionStore, facts: PlanFacts | None = None) -> None:
        self._sessions, self._facts = sessions, facts

    async def _planning_session(
        self, conn: Any, run: RunRow, steps: list[Step]
    ) -> SessionRow | None:
        """The session whose turn this run is, if the turn plans: the session (or its agent's
        manifest) asks for plan-mode, or the model marked a selection of the turn
        consequential (a mark can only add a plan, never skip one)."""
        if not is_turn_run(run.run_id):
            return None
        session = await self._sessions.get(conn, turn_of(run.run_id)[0])
        if session is None:
            return None
        return session if session.plan_mode or marked(steps) else None

    async def planning(self, conn: Any, run: RunRow, steps: list[Step]) -> bool:
        """Whether this run is a turn that plans (its answer may freeze a plan)."""
        return await self._planning_session(conn, run, steps) is not None

    async def _resolve(
        self, tenant: str, capability: str, arguments: dict[str, Any], **kept: Any
    ) -> Any:
        """`kept`: what admission kept for the plan's steps as it was proposed, and `step`."""
        read = None if self._facts is None else self._facts.reader(tenant, **kept)
        return await resolve(capability, arguments, read)

    async def approved(self, conn: Any, run_id: str) -> Any:
        """The plan approved for this turn's run, if any."""
        return await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM planner.plans WHERE run_id = $1 "
            "AND state = 'approved' ORDER BY created_at DESC LIMIT 1",
            run_id,
        )

    async def next_step(
        self, conn: Any, run: RunRow, steps: list[Step]
    ) -> SelectCapability | tuple[str, str] | None:
        """What Writ does next under the turn's approved plan (`plan_next`), if one governs."""
        if await self._planning_session(conn, run, steps) is None:
            return None
        plan = await self.approved(conn, run.run_id)
        if plan is None:
            return None
        return plan_next(steps, msgspec.convert(json.loads(plan["steps"]), list[PlanStep]))

    async def take(
        self,
        conn: Any,
        store: PlannerStore,
        run: RunRow,
        steps: list[Step],
        planned: SelectCapability,
        *,
        turn: int,
    ) -> None:
        """Record the approved plan's next step as the run's next decision, taken by Writ with
        no model call (`turn`: the model's decisions so far, unchanged); it is then acted on
        as any selection is, once committed."""
        approved_at = _approved_at(steps) or 0
        index = sum(
            1
            for s in steps
            if s.seq > approved_at and s.kind == "decision" and plan_taken(s.payload) is not None
        )
        payload = {**msgspec.to_builtins(planned), PLAN_STEP_KEY: index}
        seq = steps[-1].seq + 1 if steps else 0
        await store.add_decision(
            conn, run, seq, payload, turn=turn, input_digest=f"plan:{index}", proposal=None
        )
        steps.append(Step(seq=seq, kind="decision", payload=payload))

    async def outcomes(
        self, conn: Any, run: RunRow, steps: list[Step]
    ) -> list[PlanStepOutcome] | None:
        """Every step of the turn's approved plan with its outcome (None: no plan approved)."""
        if not is_turn_run(run.run_id):
            return None
        plan = await self.approved(conn, run.run_id)
        if plan is None:
            return None
        return plan_outcomes(steps, msgspec.convert(json.loads(plan["steps"]), list[PlanStep]))

    async def check(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        decision: SelectCapability,
        *,
        read_facts: bool,
    ) -> PlanCheck:
        """A plan-mode turn's selection: recorded as a step while planning, refused if it is
        not the approved plan's next step or, for a facts-bound step about to be taken
        (`read_facts`: its selection is committed, so a failed read is retried without asking
        the model again), if its facts no longer resolve to what was approved; else to be acted on
        with the plan's frozen request in place of the model's spelling of it, and its
        preview's digest for admission to hold it to."""
        if await self._planning_session(conn, run, steps) is None:
            return PlanCheck(decision=decision)
        plan = await self.approved(conn, run.run_id)
        approved = (
            None
            if plan is None
            else (msgspec.convert(json.loads(plan["steps"]), list[PlanStep]), int(plan["step"]))
        )
        taken = plan_refusal(steps, approved, decision)
        if not isinstance(taken, PlanStep):
            return PlanCheck(decision=decision, refused=taken)
        expected = taken
        if expected.request is None:  # a plan frozen before its requests were kept
            return PlanCheck(decision=decision)
        contract = contract_of(decision.capability)
        if read_facts and facts_bound(decision.capability, decision.arguments):
            now = await self._resolve(run.tenant, decision.capability, expected.request)
            stale = changed(expected.arguments, expected.preview, now)
            if stale is not None:
                _, drafts = _progress(steps, int(plan["step"]))
                return PlanCheck(
                    decision=decision,
                    refused=(
                        PLAN_STALE,
                        (
                            f"step {expected.index + 1} of the approved plan is stale: "
                            f"{stale}; nothing runs; recorded as step {len(drafts) + 1} "
                            "of a revised plan, which runs only once the user approves "
                            "it (answer to propose it)"
                        )[:512],
                    ),
                )
        return PlanCheck(
            decision=msgspec.structs.replace(decision, arguments=expected.request),
            plan_preview=preview_digest(expected.preview)
            if contract is not None and expected.preview
            else None,
        )

    async def freeze(self, conn: Any, run: RunRow, steps: list[Step], seq: int) -> str | None:
        """A planning turn's answer: its recorded steps frozen as a plan (its id), or None if
        the run is not planning or planned nothing."""
        session = await self._planning_session(conn, run, steps)
        if session is None:
            return None
        frozen = await conn.fetchval(
            "SELECT plan_id FROM planner.plans WHERE run_id = $1 AND step = $2", run.run_id, seq
        )
        if frozen is not None:  # frozen already (a redelivery): its facts are not read again
            return str(frozen)
        approved = await self.approved(conn, run.run_id)
        chosen = _drafted(steps, None if approved is None else int(approved["step"]))
        drafts = [_draft(s) for s in chosen]
        if not drafts:
            return None
        # Admission keeps each step's facts for evaluation; the previews stand on that read.
        planned = [(s.seq, *d) for s, d in zip(chosen, drafts, strict=True)]
        kept = (
            {} if self._facts is None else await self._facts.keep(run.tenant, run.run_id, planned)
        )
        plan_steps = []
        for i, (capability, arguments) in enumerate(drafts):
            step = await self._resolve(
                run.tenant, capability, arguments, kept=kept, step=chosen[i].seq
            )
            plan_steps.append(
                PlanStep(
                    index=i,
                    capability=capability,
                    arguments=step.arguments,
                    preview=step.preview,
                    request=step.request,
                )
            )
        digest = plan_digest(plan_steps)
        plan_id = await conn.fetchval(
            "INSERT INTO planner.plans (plan_id, session_id, tenant, turn, run_id, step, state, "
            "digest, steps) VALUES ($1, $2, $3, $4, $5, $6, 'proposed', $7, $8::jsonb) "
            "ON CONFLICT (run_id, step) DO NOTHING RETURNING plan_id",
            PLAN_PREFIX + str(uuid.uuid4()),
            session.session_id,
            run.tenant,
            turn_of(run.run_id)[1],
            run.run_id,
            seq,
            digest,
            msgspec.json.encode(plan_steps).decode(),
        )
        if plan_id is None:  # frozen already (a redelivery)
            return str(
                await conn.fetchval(
                    "SELECT plan_id FROM planner.plans WHERE run_id = $1 AND step = $2",
                    run.run_id,
                    seq,
                )
            )
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM planner.plans WHERE plan_id = $1", plan_id
        )
        locked = await self._sessions.lock(conn, session.session_id)
        assert locked is not None
        await self._sessions.add_event(
            conn,
            locked,
            f"plan:{plan_id}",
            lambda n: PlanProposed(
                session_id=session.session_id, n=n, turn=row["turn"], plan=_view(row)
            ),
        )
        return str(plan_id)

    async def answered(
        self, conn: Any, store: PlannerStore, run: RunRow, steps: list[Step]
    ) -> str | None:
        """A turn waiting on its plan was woken: `approved` (the approval is recorded as the
        model's next observation), `rejected` (with `reason` in the plan), or None (still
        proposed, or not a plan's wait)."""
        if not (run.pending_id or "").startswith(PLAN_PREFIX):
            return None
        plan = await conn.fetchrow(
            "SELECT state, reason, answered_by, step FROM planner.plans "
            "WHERE plan_id = $1 AND run_id = $2",
            run.pending_id,
            run.run_id,
        )
        if plan is None or plan["state"] == "proposed":
            return None
        if plan["state"] == "approved":
            seq = steps[-1].seq + 1
            output = ReviewAnswered(
                run_id=run.run_id,
                step=plan["step"],
                answer="approve",
                reviewer=plan["answered_by"] or "",
                reason="the user approved the plan: Writ takes its steps, in order, "
                "and each outcome follows; answer once they are all taken",
            )
            observation = observation_of(output)
            if await store.add_observation(
                conn,
                run,
                seq,
                step=plan["step"],
                output=msgspec.to_builtins(output),
                observation=observation,
            ):
                steps.append(Step(seq=seq, kind="observation", payload=observation))
        return str(plan["state"])

    async def reason(self, conn: Any, plan_id: str) -> str:
        """The user's reason for rejecting a plan."""
        return str(
            await conn.fetchval("SELECT reason FROM planner.plans WHERE plan_id = $1", plan_id)
            or ""
        )

    async def answer(
        self,
        conn: Any,
        session_store: SessionStore,
        *,
        tenant: str,
        principal: str,
        plan_id: str,
        approve: bool,
        reason: str,
        approver: bool = False,
    ) -> tuple[SessionRow, PlanView, str]:
        """An answer to a proposed plan, by its id only, in the session's transaction: (the
        session, the plan as answered, the run to wake). The session's own principal answers
        it, or an `approver` of the tenant (the checker of another's plan; `answered_by` says
        who).

        Raises:
            LookupError: no plan of this principal has this id.
            PlanAnsweredAlready: it has, and it was answered already (nothing changes).
        """
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM planner.plans WHERE plan_id = $1", plan_id
        )
        if row is None or row["tenant"] != tenant:
            raise LookupError("no plan waits under this id")
        session = await session_store.lock(conn, row["session_id"])
        if session is None or (session.principal != principal and not approver):
            raise LookupError("no plan waits under this id")
        if session.state == "closed":
            raise SessionClosedAlready("the session is closed: its plans take no answer")
        if row["state"] != "proposed":
            raise PlanAnsweredAlready(f"the plan was {row['state']} already")
        state: Literal["approved", "rejected"] = "approved" if approve else "rejected"
        await conn.execute(
            "UPDATE planner.plans SET state = $2, reason = $3, answered_by = $4 "
            "WHERE plan_id = $1 AND state = 'proposed'",
            plan_id,
            state,
            reason,
            principal,
        )
        sid = session.session_id
        session, _ = await session_store.add_event(
            conn,
            session,
            f"plan-answer:{plan_id}",
            lambda n: PlanDecided(
                session_id=sid, n=n, plan_id=plan_id, answer=state, reason=reason
            ),
        )
        if not approve:  # the next turn's context, written by Writ
            text = f"The user rejected the plan: {reason or 'no reason given'}"[:512]
            session, _ = await session_store.add_event(
                conn,
                session,
                f"plan-note:{plan_id}",
                lambda n: WriterNote(
                    session_id=session.session_id, n=n, turn=row["turn"], text=text
                ),
            )
        view = msgspec.structs.replace(_view(row), state=state, reason=reason)
        return session, view, str(row["run_id"])

    async def of_session(self, conn: Any, session_id: str) -> list[PlanView]:
        """The session's plans, oldest first."""
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM planner.plans WHERE session_id = $1 ORDER BY created_at",
            session_id,
        )
        return [_view(r) for r in rows]
