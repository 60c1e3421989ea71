"""The journal's fast canonical encoding writes exactly what `rfc8785.dumps` writes, for every
shape the journal hashes and authenticates, and defers to it for anything else: a byte of
difference would make every row sealed with one unverifiable with the other."""

from __future__ import annotations

import random
from typing import Any

import pytest
import rfc8785

from libs.journal._codec import canonical

# Every character class JCS treats apart: controls (short and \u forms), quote, backslash,
# slash, DEL, Latin-1, the JS line separators, BMP beyond, astral, and the largest code points.
SPECIAL = [
    '"',
    "\\",
    "/",
    "\b",
    "\f",
    "\n",
    "\r",
    "\t",
    "\x00",
    "\x1f",
    "\x7f",
    "\x80",
    "é",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\uffff",
    "€",
    "𝄞",
    "\U0010ffff",
    " ",
    "'",
    "<>&",
]


def _text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 12)):
        roll = rng.random()
        if roll < 0.4:
            pieces.append(rng.choice(SPECIAL))
        elif roll < 0.7:
            pieces.append(chr(rng.randint(0, 0x7F)))
        elif roll < 0.9:
            pieces.append(chr(rng.choice([rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0xFFFF)])))
        else:
            pieces.append(chr(rng.randint(0x10000, 0x10FFFF)))
    return "".join(pieces)


@pytest.mark.parametrize("seed", range(20))
def test_lists_and_dicts_of_text_and_integers_encode_as_rfc8785(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(250):
        items = [
            _text(rng) if rng.random() < 0.8 else rng.randint(-(2**53) + 1, 2**53 - 1)
            for _ in range(rng.randint(0, 10))
        ]
        assert canonical(items) == rfc8785.dumps(items)
        keys = [
            "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(0, 6))) for _ in items
        ]
        doc = dict(zip(keys, items, strict=True))
        assert canonical(doc) == rfc8785.dumps(doc)


def test_the_journals_own_documents_encode_as_rfc8785() -> None:
    aad = [
        "writ-journal/2",
        "planner",
        "acme",
        "step.decision",
        "run-1/0",
        "run-1",
        "k1",
        "1764633600123456",
    ]
    assert canonical(aad) == rfc8785.dumps(aad)
    entry: dict[str, Any] = {
        "v": 1,
        "service": "governance",
        "seq": "42",
        "id": "7",
        "xid": "812",
        "tenant": "acme",
        "kind": "budget.reserved",
        "subject": "3f2a",
        "run_id": "run-1",
        "recorded_at": "1764633600123456",
        "key_id": "g1",
        "nonce": "AAEC",
        "ciphertext": "q+/=",
        "rejected": "payload does not authenticate\n",
    }
    assert canonical(entry) == rfc8785.dumps(entry)


@pytest.mark.parametrize(
    "value",
    [
        {"é": "a", "e": "b"},  # a key outside ASCII: JCS sorts by UTF-16 code units
        {"\U0001d11e": "x", "\uffff": "y"},
        ["a", 1.5],
        ["a", True],
        ["a", None],
        ["a", ["nested"]],
    ],
)
def test_other_shapes_are_rfc8785s_own(value: object) -> None:
    assert canonical(value) == rfc8785.dumps(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [["\ud800"], {"k": "a\udfffb"}, [2**53], {"n": -(2**53)}])
def test_what_rfc8785_refuses_is_refused(value: object) -> None:
    """A lone surrogate, an integer a JSON number cannot hold exactly."""
    with pytest.raises(rfc8785.CanonicalizationError):
        rfc8785.dumps(value)  # type: ignore[arg-type]
    with pytest.raises(rfc8785.CanonicalizationError):
        canonical(value)  # type: ignore[arg-type]
