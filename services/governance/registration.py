"""Who may register a run, and with what: pure decisions, no I/O.

A run's grants come only from a verified host's request: ingress registers it
(`subjects.REGISTER_RUN`, which only ingress may publish). The planner registers chat turns
(`subjects.REGISTER_TURN`, which only the planner may publish) with no grants of their own: a
session is opened without run grants, so a turn holds what governance itself holds for the
session's agent (its standing grants, read at each decision). A registration of a run governance
knows already may repeat it, or ask less, never more.
"""

from __future__ import annotations

from schemas.governance import RegisterRun, RegisterTurn

__all__ = ["turn_run", "widening"]

Registered = tuple[str, str, bool, frozenset[str]]  # principal, agent, attended, run grants


def widening(known: Registered | None, run: RegisterRun) -> str:
    """What `run` would widen in a registration governance holds already ("" for nothing)."""
    if known is None:
        return ""
    principal, agent, attended, grants = known
    added = sorted(set(run.grants) - grants)
    wider = [
        what
        for what, widens in (
            ("its principal", run.principal != principal),
            ("its agent", run.agent != agent),
            ("its attendance", run.attended and not attended),
            (f"its grants by {', '.join(added)}", bool(added)),
        )
        if widens
    ]
    return "; ".join(wider)


def turn_run(turn: RegisterTurn) -> RegisterRun | None:
    """The run a chat turn registers (no grants, no budget of its own); None when its run id
    is not a turn of its session (`<session_id>-t<n>`)."""
    prefix = f"{turn.session_id}-t"
    if not (turn.run_id.startswith(prefix) and turn.run_id[len(prefix) :].isdigit()):
        return None
    return RegisterRun(
        tenant=turn.tenant,
        run_id=turn.run_id,
        principal=turn.principal,
        agent=turn.agent,
        attended=turn.attended,
    )
