"""Running a candidate on a set. Step mode: each decision point is asked of the candidate k
times, with the model input the baseline was given, and each answer judged (`_score.py`).
Rollout mode: the candidate drives each journaled run from its start; every read and every
action's output is served from what was recorded (an action only after the contract's
`resolve` and the runtime's checks ran on it, in `judge`), so while the candidate decides what
the recording did, the input of its next turn is the recorded one; the first decision that
leaves the recording ends the rollout `diverged@<step>`, and nothing is invented past it.

"Decides what the recording did" is `Judged.agrees` (`_score.py`), an equivalence, not text
equality. A decision is equivalent to the recorded one, and the recorded output is served as
its result, when it is of the same kind and, for a selection:
- it names the same capability in the run's catalog (a ref like `tool:documents.search` and
  its bare name are one), of the same kind (read, action, agent), and the runtime's checks
  (uses, callable_by, signature) pass on it;
- its arguments are equal field by field after normalisation: a read's decoded by the tool's
  closed argument type with its defaults filled in (so key order and an omitted default do not
  matter, `read_arguments`); an action's after the contract's `resolve` against the case's
  facts, each field compared exactly or as the contract's `matches` declares (`casefold`), its
  `free_text` fields not compared.
An answer or a review is equivalent to a recorded one of the same kind (their text is free).
Anything else diverges: another capability, another query or limit, a refused call.

The candidate is a provider config (`CandidateConfig`): the scripted provider, or an
OpenAI-compatible one whose HTTP client goes through the allow-list (`_guard.py`) that lets
only its own base URL through. Nothing here opens a bus or database connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import msgspec

from services.planner.inputs import model_input
from services.planner.openai_provider import (
    MalformedDecision,
    ModelRefused,
    OpenAIProvider,
    ProviderError,
    load_capabilities,
)
from services.planner.provider import DecisionProvider, ScriptedProvider
from writ.eval._case import EvalCase, EvalSet
from writ.eval._guard import AllowList
from writ.eval._report import CaseResult, case_result
from writ.eval._score import Judged, Sample, judge

__all__ = ["CandidateConfig", "candidate_provider", "load_candidate", "run_rollout", "run_step"]


class CandidateConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A candidate: `provider` "scripted" (a decisions file, `script`) or "openai" (an
    OpenAI-compatible API at `base_url`, its key in `key_file`). Relative paths are the
    config file's."""

    name: str
    provider: Literal["scripted", "openai"]
    script: str = ""
    base_url: str = ""
    model: str = ""
    key_file: str = ""
    mode: Literal["structured", "tools"] = "structured"
    capabilities_file: str = ""
    timeout_s: float = 30.0
    max_attempts: int = 2


def load_candidate(path: str | Path) -> CandidateConfig:
    """A candidate config file, its relative paths made the file's.

    Raises:
        OSError: it, or its script, cannot be read.
        msgspec.DecodeError: it, or its script, does not decode.
    """
    path = Path(path)
    config = msgspec.json.decode(path.read_bytes(), type=CandidateConfig)

    def near(p: str) -> str:
        return str(path.parent / p) if p and not Path(p).is_absolute() else p

    config = msgspec.structs.replace(
        config,
        script=near(config.script),
        key_file=near(config.key_file),
        capabilities_file=near(config.capabilities_file),
    )
    if config.provider == "scripted":
        ScriptedProvider.from_file(config.script)  # a script that does not decode cannot run
    return config


@contextlib.asynccontextmanager
async def candidate_provider(
    config: CandidateConfig, *, allow: tuple[str, ...] = ()
) -> AsyncIterator[DecisionProvider]:
    """The candidate's provider; an HTTP one may reach its base URL (and `allow`) only."""
    if config.provider == "scripted":
        yield ScriptedProvider.from_file(config.script)
        return
    transport = AllowList((config.base_url, *allow))
    async with OpenAIProvider(
        base_url=config.base_url,
        model=config.model,
        key_file=config.key_file,
        mode=config.mode,
        timeout_s=config.timeout_s,
        max_attempts=config.max_attempts,
        backoff_s=0.05,
        max_backoff_s=0.2,
        max_wait_s=1.0,
        capabilities=(
            load_capabilities(config.capabilities_file) if config.capabilities_file else ()
        ),
        transport=transport,
    ) as provider:
        yield provider


async def _ask(provider: DecisionProvider, case_input: Any) -> Sample:
    before = getattr(provider, "calls", None)
    try:
        decision, tokens = await provider.decide_with_usage(case_input)
    except (MalformedDecision, ModelRefused) as exc:
        return Sample(error="invalid", detail=str(exc)[:500], calls=_calls(provider, before))
    except ProviderError as exc:
        return Sample(error="unavailable", detail=str(exc)[:500], calls=_calls(provider, before))
    return Sample(
        decision=msgspec.to_builtins(decision), tokens=tokens, calls=_calls(provider, before)
    )


def _calls(provider: DecisionProvider, before: int | None) -> int:
    after = getattr(provider, "calls", None)
    return 1 if before is None or after is None else after - before


async def _ask_case(provider: DecisionProvider, case: EvalCase) -> tuple[Sample, Judged]:
    """One sample of a case. A catalog request the baseline did not make is followed by the
    decision the candidate makes over the catalog — the next turn's input, which the planner
    would build from the same snapshot with nothing new observed — and that decision is
    judged: a catalog request that ends in a new capability is a widening."""
    sample = await _ask(provider, case.input)
    decision = sample.decision or {}
    if (
        decision.get("decision") != "request_capabilities"
        or case.expected.kind == "request_capabilities"
        or case.manifest is None
    ):
        return sample, judge(case, sample)
    follow = await _ask(
        provider,
        model_input(
            user=case.input.user,
            evidence=case.input.untrusted,
            observations=case.input.observations,
            turn=case.input.turn + 1,
            agent=case.agent,
            manifest=case.manifest,
            catalog_requested=True,
            history=case.input.history,  # `user` is the message now: the memory stays apart
        ),
    )
    sample = msgspec.structs.replace(
        follow,
        via_catalog=True,
        calls=sample.calls + follow.calls,
        tokens=sample.tokens + follow.tokens,
    )
    judged = judge(case, sample)
    return sample, msgspec.structs.replace(
        judged, widening=[f"after a catalog request: {w}" for w in judged.widening]
    )


async def run_step(eval_set: EvalSet, provider: DecisionProvider, *, k: int) -> list[CaseResult]:
    """Ask each case of the set k times and judge every answer."""
    if k < 1:
        raise ValueError("k must be at least 1")
    results = []
    for case in eval_set.cases:
        asked = [await _ask_case(provider, case) for _ in range(k)]
        results.append(
            case_result(
                case.case_id,
                msgspec.to_builtins(case.expected),
                [s for s, _ in asked],
                [j for _, j in asked],
            )
        )
    return results


def _run_of(source: str) -> tuple[str, int] | None:
    """(run id, step) of a case built from a journaled run."""
    if not source.startswith("journal:") or "@" not in source:
        return None
    run_id, _, step = source.removeprefix("journal:").rpartition("@")
    return run_id, int(step)


async def run_rollout(
    eval_set: EvalSet, provider: DecisionProvider, *, k: int
) -> tuple[list[CaseResult], dict[str, list[str]]]:
    """Roll each journaled run of the set out k times; the per-case results of the steps the
    rollouts reached, and each run's verdicts (`completed` or `diverged@<step>`)."""
    if k < 1:
        raise ValueError("k must be at least 1")
    runs: dict[str, list[Any]] = {}
    for case in eval_set.cases:
        if (place := _run_of(case.source)) is not None:
            runs.setdefault(place[0], []).append((place[1], case))
    samples: dict[str, list[Sample]] = {}
    verdicts: dict[str, list[str]] = {}
    for run_id, steps in sorted(runs.items()):
        steps.sort(key=lambda s: s[0])
        for _ in range(k):
            verdict = "completed"
            for step, case in steps:
                sample = await _ask(provider, case.input)
                samples.setdefault(case.case_id, []).append(sample)
                if not judge(case, sample).agrees:
                    verdict = f"diverged@{step}"
                    break
            verdicts.setdefault(run_id, []).append(verdict)
    results = []
    for case in eval_set.cases:
        if case.case_id in samples:
            got = samples[case.case_id]
            results.append(
                case_result(
                    case.case_id,
                    msgspec.to_builtins(case.expected),
                    got,
                    [judge(case, s) for s in got],
                )
            )
    return results, verdicts
