"""Running a candidate on a set, step mode: each decision point is asked of the candidate k
times, with the model input the baseline was given, and each answer judged (`_score.py`).

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

from services.planner.openai_provider import (
    MalformedDecision,
    ModelRefused,
    OpenAIProvider,
    ProviderError,
    load_capabilities,
)
from services.planner.provider import DecisionProvider, ScriptedProvider
from writ.eval._case import EvalSet
from writ.eval._guard import AllowList
from writ.eval._report import CaseResult, case_result
from writ.eval._score import Sample, judge

__all__ = ["CandidateConfig", "candidate_provider", "load_candidate", "run_step"]


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
    """A candidate config file, its relative paths made the file's."""
    path = Path(path)
    config = msgspec.json.decode(path.read_bytes(), type=CandidateConfig)
    def near(p: str) -> str:
        return str(path.parent / p) if p and not Path(p).is_absolute() else p
    return msgspec.structs.replace(config, script=near(config.script),
                                   key_file=near(config.key_file),
                                   capabilities_file=near(config.capabilities_file))


@contextlib.asynccontextmanager
async def candidate_provider(config: CandidateConfig, *, allow: tuple[str, ...] = ()
                             ) -> AsyncIterator[DecisionProvider]:
    """The candidate's provider; an HTTP one may reach its base URL (and `allow`) only."""
    if config.provider == "scripted":
        yield ScriptedProvider.from_file(config.script)
        return
    transport = AllowList((config.base_url, *allow))
    async with OpenAIProvider(
            base_url=config.base_url, model=config.model, key_file=config.key_file,
            mode=config.mode, timeout_s=config.timeout_s, max_attempts=config.max_attempts,
            backoff_s=0.05, max_backoff_s=0.2, max_wait_s=1.0,
            capabilities=(load_capabilities(config.capabilities_file)
                          if config.capabilities_file else ()),
            transport=transport) as provider:
        yield provider


async def _ask(provider: DecisionProvider, case_input: Any) -> Sample:
    before = getattr(provider, "calls", None)
    try:
        decision, tokens = await provider.decide_with_usage(case_input)
    except (MalformedDecision, ModelRefused) as exc:
        return Sample(error="invalid", detail=str(exc)[:500], calls=_calls(provider, before))
    except ProviderError as exc:
        return Sample(error="unavailable", detail=str(exc)[:500],
                      calls=_calls(provider, before))
    return Sample(decision=msgspec.to_builtins(decision), tokens=tokens,
                  calls=_calls(provider, before))


def _calls(provider: DecisionProvider, before: int | None) -> int:
    after = getattr(provider, "calls", None)
    return 1 if before is None or after is None else after - before


async def run_step(eval_set: EvalSet, provider: DecisionProvider, *, k: int
                   ) -> list[CaseResult]:
    """Ask each case of the set k times and judge every answer."""
    if k < 1:
        raise ValueError("k must be at least 1")
    results = []
    for case in eval_set.cases:
        samples = [await _ask(provider, case.input) for _ in range(k)]
        results.append(case_result(case.case_id, msgspec.to_builtins(case.expected), samples,
                                   [judge(case, s) for s in samples]))
    return results
