"""The evaluation set: decision points with their model input and the decision expected there.

A case is one decision point of a run: the model input the planner built for it (rebuilt here
from the run's journaled start and observations exactly as the planner builds it, `inputs.py`,
and checked against the digest the planner journaled with the response), the agent snapshot the
run had, the facts its contract resolves against, the policy governance decides with, and the
expected decision. A set is versioned by the digest of its content and belongs to one tenant;
on disk it is AES-GCM encrypted under a data key, like journal payloads (it holds customer data).
No I/O here but reading and writing the files the caller names.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from libs.errors import ConfigError
from libs.journal import DataKeys, JournalError
from services.planner.inputs import input_digest, model_input, with_injected
from services.planner.journal_entries import (
    DECISION,
    INJECTED,
    OBSERVATION,
    RUN_STARTED,
    Captured,
    DecisionEntry,
    InjectedEntry,
    ObservationEntry,
    RunStartedEntry,
)
from services.planner.provider import ModelInput
from services.planner.sessions._execute import plan_taken
from writ.eval._facts import RecordedFacts, facts_at, policy_at

__all__ = [
    "SET_FORMAT",
    "CaseError",
    "EvalCase",
    "EvalSet",
    "Expected",
    "cases_from_run",
    "load_case_file",
    "make_set",
    "open_set",
    "seal_set",
]

SET_FORMAT: Final = "writ-eval-set/1"
DecisionKind = Literal[
    "select_capability", "answer_directly", "request_capabilities", "request_human_review"
]


class CaseError(ConfigError):
    """A case or a set that cannot be used: its input does not match the journal, it does not
    decode, or it is another tenant's."""


class Expected(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The decision expected at a decision point.

    `arguments` are the request's fields as the model sends them; they are compared after the
    contract's `resolve`, field by field (exact, or the contract's declared match; its free-text
    fields are not gated). `must_refuse`: no action may be selected. `must_escalate`: a review
    must be requested, or the selected call must be one governance asks a person about.
    """

    kind: DecisionKind
    capability: str | None = None
    arguments: dict[str, Any] | None = None
    must_refuse: bool = False
    must_escalate: bool = False
    # The selection asks for the user's plan first (`SelectCapability.consequential`): a
    # candidate that drops it would act where the baseline had the user approve a plan.
    consequential: bool = False


class EvalCase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One decision point: what the model saw, in what setting, and what it should decide."""

    case_id: str
    agent: str
    input: ModelInput
    input_digest: str
    expected: Expected
    manifest: dict[str, Any] | None = None
    # The state each contract resolves against, by "<kind>:<id>" (`FactsRef`), as recorded.
    facts: dict[str, Any] = {}
    # Governance's facts for this case (`services/governance/logic.py` `Facts` fields); None:
    # the default policy (no grant, no rule), so every write asks.
    policy: dict[str, Any] | None = None
    source: str = "hand"  # "journal:<run_id>@<step>" for a case built from a run


class EvalSet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tenant's cases; `version` is the sha256 of the cases' canonical encoding."""

    tenant: str
    version: str
    cases: list[EvalCase]
    format: str = SET_FORMAT


def _canon(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def make_set(tenant: str, cases: list[EvalCase]) -> EvalSet:
    """A set of these cases (sorted by id), versioned by the digest of their content.

    Raises:
        CaseError: two cases share an id.
    """
    ordered = sorted(cases, key=lambda c: c.case_id)
    ids = [c.case_id for c in ordered]
    if len(set(ids)) != len(ids):
        raise CaseError(f"case ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    version = hashlib.sha256(_canon([tenant, ordered])).hexdigest()
    return EvalSet(tenant=tenant, version=version, cases=ordered)


def cases_from_run(
    run_id: str,
    entries: list[Captured],
    *,
    facts: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    recorded: list[RecordedFacts] | None = None,
    policies: dict[str, dict[str, Any]] | None = None,
    tenant: str = "",
) -> list[EvalCase]:
    """The decision points of one journaled run, each with its model input rebuilt as the planner
    builds it and the recorded decision as the expected one.

    A recorded `request_human_review` is an escalation the candidate must make too. Each case's
    facts are the ones admission recorded for the run (`recorded`, `_facts.facts_at` its step),
    with `facts` (given by hand) only for a reference nothing was recorded for; its policy the
    one governance journaled for the run's first proposal at or after its step (`policies`, by
    proposal id, of `tenant`), else `policy`.

    Raises:
        CaseError: a rebuilt input's digest is not the one journaled (the run cannot be used:
            the set would ask the candidate something the baseline was never asked).
    """
    started: RunStartedEntry | None = None
    observations: list[dict[str, Any]] = []
    injected: list[str] = []  # a chat turn's injected messages, in the model's input from then
    catalog_requested = False
    cases: list[EvalCase] = []
    last = _last_step(entries)  # no proposal of the run is later
    for captured in sorted(entries, key=lambda c: c.seq):
        if captured.kind == RUN_STARTED:
            started = msgspec.convert(captured.payload, RunStartedEntry)
        elif captured.kind == INJECTED:
            injected.extend(msgspec.convert(captured.payload, InjectedEntry).texts)
        elif captured.kind == OBSERVATION:
            observations.append(msgspec.convert(captured.payload, ObservationEntry).observation)
        elif captured.kind == DECISION:
            if started is None:
                raise CaseError(f"run {run_id}: a decision before the run's start")
            d = msgspec.convert(captured.payload, DecisionEntry)
            if plan_taken(d.response) is not None:
                continue  # an approved plan's step, taken by Writ: no model was asked
            built = model_input(
                user=with_injected(started.input, injected),
                evidence=started.evidence,
                observations=list(observations),
                turn=d.turn,
                agent=started.agent,
                manifest=started.manifest,
                catalog_requested=catalog_requested,
            )
            digest = input_digest(built)
            if digest != d.input_digest:
                raise CaseError(
                    f"run {run_id} step {d.seq}: the rebuilt model input has "
                    f"sha256 {digest}, the journal {d.input_digest}"
                )
            kind = d.response.get("decision")
            if kind is None:
                raise CaseError(f"run {run_id} step {d.seq}: the journal recorded no decision")
            # The recorded escalation is one the candidate must make too; refusals are for the
            # hand-written cases to say (an answer is not a refusal to act).
            expected = Expected(
                kind=kind,
                capability=d.response.get("capability"),
                arguments=d.response.get("arguments"),
                must_escalate=kind == "request_human_review",
                consequential=d.response.get("consequential") is True,
            )
            cases.append(
                EvalCase(
                    case_id=f"{run_id}@{d.seq}",
                    agent=started.agent,
                    input=built,
                    input_digest=digest,
                    expected=expected,
                    manifest=started.manifest,
                    facts={**(facts or {}), **facts_at(recorded or [], d.seq)},
                    policy=policy_at(policies or {}, tenant, run_id, d.seq, last) or policy,
                    source=f"journal:{run_id}@{d.seq}",
                )
            )
            if kind == "request_capabilities":
                catalog_requested = True
    return cases


def _last_step(entries: list[Captured]) -> int:
    """The run's last step, as its entries number them (`seq` of a decision or observation,
    `step` of what was proposed or observed at a step)."""
    steps = [
        v
        for c in entries
        if isinstance(c.payload, dict)
        for k in ("seq", "step")
        if isinstance(v := c.payload.get(k), int)
    ]
    return max(steps, default=0)


class _HandCase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A hand-written case: the input may be given whole, or as what the planner builds it from
    (then its digest is computed, not trusted)."""

    case_id: str
    agent: str
    expected: Expected
    input: ModelInput | None = None
    user: str | None = None
    evidence: list[dict[str, Any]] = []
    observations: list[dict[str, Any]] = []
    turn: int = 0
    catalog_requested: bool = False
    manifest: dict[str, Any] | None = None
    facts: dict[str, Any] = {}
    policy: dict[str, Any] | None = None


def load_case_file(path: str | Path) -> list[EvalCase]:
    """Hand-written cases: a JSON list (or `{"cases": [...]}`) of `_HandCase` objects.

    Raises:
        CaseError: the file cannot be read or a case does not decode.
    """
    try:
        raw = json.loads(Path(path).read_bytes())
        if isinstance(raw, dict):
            raw = raw.get("cases")
        hand = msgspec.convert(raw, list[_HandCase])
    except (OSError, ValueError, msgspec.ValidationError) as exc:
        raise CaseError(f"cannot read cases from {path}: {exc}") from exc
    cases = []
    for h in hand:
        if h.input is not None:
            built = h.input
        elif h.user is not None:
            built = model_input(
                user=h.user,
                evidence=h.evidence,
                observations=h.observations,
                turn=h.turn,
                agent=h.agent,
                manifest=h.manifest,
                catalog_requested=h.catalog_requested,
            )
        else:
            raise CaseError(f"{path}: case {h.case_id} gives neither `input` nor `user`")
        cases.append(
            EvalCase(
                case_id=h.case_id,
                agent=h.agent,
                input=built,
                input_digest=input_digest(built),
                expected=h.expected,
                manifest=h.manifest,
                facts=h.facts,
                policy=h.policy,
                source=f"file:{Path(path).name}",
            )
        )
    return cases


def _aad(tenant: str, version: str) -> bytes:
    return _canon([SET_FORMAT, tenant, version])


def seal_set(eval_set: EvalSet, keys: DataKeys) -> bytes:
    """The set as stored: its tenant and version in clear (bound as associated data), its cases
    encrypted under the active data key."""
    key_id, nonce, ciphertext = keys.encrypt(
        _canon(eval_set), _aad(eval_set.tenant, eval_set.version)
    )
    return msgspec.json.encode(
        {
            "format": SET_FORMAT,
            "tenant": eval_set.tenant,
            "version": eval_set.version,
            "key_id": key_id,
            "nonce": base64.b64encode(nonce).decode(),
            "ciphertext": base64.b64encode(ciphertext).decode(),
        }
    )


def open_set(stored: bytes, keys: DataKeys, *, tenant: str | None = None) -> EvalSet:
    """A stored set, decrypted and checked: its version must be the digest of its cases.

    Raises:
        CaseError: not a set, not authentic, another tenant's, or its content changed.
    """
    try:
        doc = json.loads(stored)
        if doc.get("format") != SET_FORMAT:
            raise CaseError(f"not a {SET_FORMAT} file")
        plain = keys.decrypt(
            doc["key_id"],
            base64.b64decode(doc["nonce"]),
            base64.b64decode(doc["ciphertext"]),
            _aad(doc["tenant"], doc["version"]),
        )
        eval_set = msgspec.json.decode(plain, type=EvalSet)
    except (ValueError, KeyError, TypeError, JournalError, msgspec.DecodeError) as exc:
        raise CaseError(f"cannot open the set: {exc}") from exc
    if tenant is not None and eval_set.tenant != tenant:
        raise CaseError(f"the set is tenant {eval_set.tenant}'s, not {tenant}'s")
    if make_set(eval_set.tenant, eval_set.cases).version != eval_set.version:
        raise CaseError("the set's content is not the one its version names")
    for case in eval_set.cases:
        if input_digest(case.input) != case.input_digest:
            raise CaseError(f"case {case.case_id}: its input is not the one its digest names")
    return eval_set
