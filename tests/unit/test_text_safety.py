"""Every text field an outside party can send refuses what PostgreSQL text cannot hold.

The walk is generated from the schemas (`msgspec.inspect`), so a field added later is covered
without anyone remembering to: for every inbound Struct (every `Command` in `schemas/`, and the
decisions and verdicts a model answers), a valid message is built from its type, then each string
it can carry — a field, an item of a list, a key or a value of an open object, nested structs
included — is replaced by text with U+0000, and decoding must refuse it naming that field.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

import schemas
from schemas.base import Command, refuse_unstorable, storable, unstorable_at
from services.dispatcher.connectors.base import Result
from services.planner.provider import AnswerDirectly, CriticVerdict, ModelDecision

_CANDIDATES = ("a1", "acme", "0" * 64, "approve", "x", "1", "EUR")


def inbound_types() -> list[Any]:
    """Every Command subclass of every schemas module, and the model's answer types."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(schemas.__path__):
        module = importlib.import_module(f"schemas.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Command) and value is not Command:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [*found.values(), ModelDecision, CriticVerdict]


def _string(t: mi.StrType) -> str:
    for text in _CANDIDATES:
        if t.pattern is not None and re.search(t.pattern, text) is None:
            continue
        if len(text) >= (t.min_length or 0) and len(text) <= (t.max_length or 10**9):
            return text
    raise AssertionError(f"no example for {t}")


def example(t: mi.Type) -> Any:
    """A minimal valid value of `t` (as builtins)."""
    if isinstance(t, mi.StrType):
        return _string(t)
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.BoolType):
        return False
    if isinstance(t, (mi.IntType, mi.FloatType)):
        return t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 1)
    if isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        return [example(t.item_type) for _ in range(t.min_length or 0)]
    if isinstance(t, mi.DictType):
        return {}
    if isinstance(t, (mi.AnyType,)):
        return "x"
    if isinstance(t, mi.NoneType):
        return None
    if isinstance(t, mi.UnionType):
        if any(isinstance(o, mi.NoneType) for o in t.types):
            return None
        return example(t.types[0])
    if isinstance(t, mi.StructType):
        out: dict[str, Any] = {}
        if t.tag_field is not None:
            out[t.tag_field] = t.tag
        for field in t.fields:
            if field.required:
                out[field.encode_name] = example(field.type)
        return out
    raise AssertionError(f"no example for {t}")


BAD = "ok\u0000"


def mutants(t: mi.Type, value: Any, path: str) -> Iterator[tuple[Any, str]]:
    """`value` with one string it can hold made unstorable, and the field's path, for each."""
    if isinstance(t, mi.StrType):
        yield BAD, path
    elif isinstance(t, mi.AnyType):
        yield BAD, path
        yield {"k": BAD}, f"{path}.k"
        yield [BAD], f"{path}[0]"
    elif isinstance(t, mi.UnionType):
        for option in t.types:
            if not isinstance(option, mi.NoneType):
                yield from mutants(option, example(option), path)
    elif isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        if t.max_length == 0:
            return
        for sub, where in mutants(t.item_type, example(t.item_type), f"{path}[0]"):
            yield [sub], where
    elif isinstance(t, mi.DictType):
        if isinstance(t.key_type, mi.StrType) and t.key_type.pattern is None:
            yield {BAD: example(t.value_type)}, path
        for sub, where in mutants(t.value_type, example(t.value_type), f"{path}.k"):
            yield {"k": sub}, where
    elif isinstance(t, mi.StructType):
        for field in t.fields:
            inner = value.get(field.encode_name, example(field.type))
            for sub, where in mutants(field.type, inner, f"{path}.{field.encode_name}"):
                yield {**value, field.encode_name: sub}, where


def cases() -> Iterator[Any]:
    for kind in inbound_types():
        t = mi.type_info(kind)
        structs = t.types if isinstance(t, mi.UnionType) else (t,)
        for struct in structs:
            assert isinstance(struct, mi.StructType)
            for value, where in mutants(struct, example(struct), "$"):
                yield pytest.param(kind, value, where, id=f"{struct.cls.__name__}:{where}")


@pytest.mark.parametrize("kind", inbound_types(), ids=lambda k: getattr(k, "__name__", str(k)))
def test_the_example_of_every_inbound_type_decodes(kind: Any) -> None:
    t = mi.type_info(kind)
    for struct in t.types if isinstance(t, mi.UnionType) else (t,):
        msgspec.json.decode(msgspec.json.encode(example(struct)), type=kind)


@pytest.mark.parametrize(("kind", "value", "where"), list(cases()))
def test_every_string_field_refuses_unstorable_text_naming_the_field(
    kind: Any, value: Any, where: str
) -> None:
    raw = msgspec.json.encode(value)
    assert b"\\u0000" in raw
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(raw, type=kind)
    message = str(caught.value)
    # The field is named: as the path msgspec gives, or as ours.
    field = where.removeprefix("$.").split(".")[0].split("[")[0]
    assert field in message, (where, message)


def test_the_walk_covers_every_host_field() -> None:
    """The host contract's text fields are all among the cases (the walk is not vacuous)."""
    ids = {c.id for c in cases()}
    for expected in (
        "RunRequest:$.input",
        "SubmitCommand:$.arguments.k",
        "SubmitCommand:$.expected_revision",
        "HumanDecision:$.reason",
        "ApproveProposal:$.reason",
        "ReviewDecision:$.comment",
        "AnswerDecision:$.reason",
        "ProposeCommand:$.arguments.k",
        "AnswerDirectly:$.answer",
        "SelectCapability:$.arguments.k",
        "Replan:$.reason",
    ):
        assert expected in ids, expected


@pytest.mark.parametrize("raw", [rb'"\ud800"', rb'"a\udc00"', b'"\xed\xa0\x80"'])
def test_a_lone_surrogate_does_not_get_through_msgspec_json(raw: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(raw)


def test_a_surrogate_from_elsewhere_is_refused_too() -> None:
    """Python's own json (which HTTP clients use) makes lone surrogates: still refused."""
    assert unstorable_at({"a": ["fine", "x\ud800"]}) == "$.a[1]"
    assert unstorable_at({"k\x00": 1}) == "$ (a key)"
    with pytest.raises(msgspec.ValidationError, match="arguments"):
        msgspec.convert(
            {"decision": "select_capability", "capability": "x", "arguments": {"q": "\udfff"}},
            ModelDecision,
        )


def test_refusing_a_struct_names_its_field() -> None:
    class Note(msgspec.Struct):
        body: str

    with pytest.raises(ValueError, match=r"`\$\.body`"):
        refuse_unstorable(Note(body="a\x00"))
    refuse_unstorable(Note(body="fine"))


def test_a_provider_receipt_is_kept_storable() -> None:
    """A receipt proves an effect that happened: it is kept, with what text cannot hold
    replaced, rather than refused into endless retries."""
    result = Result(kind="succeeded", receipt="note\x00\ud8001", detail="x\x00")
    assert result.receipt == "note\ufffd\ufffd1" and result.detail == "x\ufffd"
    assert storable("plain") == "plain"


def test_a_literal_backslash_u0000_is_plain_text() -> None:
    """Six characters a person may well type: storable, and not refused."""
    assert unstorable_at({"body": "\\u0000 is how JSON writes NUL"}) is None
    raw = msgspec.json.encode({"decision": "answer_directly", "answer": "\\u0000"})
    decided = msgspec.json.decode(raw, type=ModelDecision)
    assert isinstance(decided, AnswerDirectly) and decided.answer == "\\u0000"
