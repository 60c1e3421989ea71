"""The tree speaks of what Writ is and does, never of how the work on it was organised.

Every tracked file (code, comments, docstrings, tests, documentation, deployment files) is
scanned for words that belong to a tracker, a branch, a work period, the people who worked in
parallel, the machine a figure was taken on or a time of day, and for the source documents cited
by their file numbers rather than by what they say. A chat session and a host ticket's issue are
Writ's own words, so the patterns name numbers and phrases, not the bare words.
"""

from __future__ import annotations

import codecs
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each pattern with what it betrays; `(?i:...)` where case does not matter.
FORBIDDEN: tuple[tuple[str, str], ...] = (
    (r"(?i:\bissues?\s*#?\d+)", "a tracker number"),
    (r"(?i:\bstops?\s+\d+\b)", "a work period"),
    (r"(?i:\bbranch(?:es)?\s+i\d+\b)", "a branch"),
    (r"\bi\d{2}\b", "a branch's name"),
    (r"(?i:\bsessions?\s+\d+\b(?!\s*(?:s|ms|turns?|messages?)\b))", "a work period"),
    (r"(?i:\bthis (?:shared )?machine\b)", "the machine it was measured on"),
    (r"(?i:\bthis (?:stop|session|evening|morning|afternoon|night)\b)", "a work period"),
    (r"(?i:\b(?:tonight|last evening|last night)\b)", "a work period"),
    (r"(?i:\bhelpers?')", "who worked in parallel"),
    (r"(?i:\bother engineers\b)", "who worked in parallel"),
    (r"(?i:\bseeds?\s+0\d\d\b)", "a source document by its file number"),
    (r"\bseeds/", "a folder outside the repository"),
    (r"\.\./shared/DESIGN\.md", "a document outside the repository"),
    (r"\b\d{1,2}:\d{2}\s*(?:UTC|GMT)\b", "a time of day"),
    (r"\b(?:at|about|from|until|around|since)\s+\d{1,2}:\d{2}\b(?!:\d)", "a time of day"),
)
# One pass over each file: a named group per pattern.
SCAN = re.compile("|".join(f"(?P<p{i}>{pattern})" for i, (pattern, _) in enumerate(FORBIDDEN)))

# Not prose of Writ's: the licence's text, the lock file, third-party schemas vendored for the
# tests, and this file, which must spell the patterns.
SKIPPED = {"LICENSE", "uv.lock", "tests/unit/test_vocabulary.py"}
VENDORED = ("tests/data/", "deploy/schemas/")


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [
        ROOT / name
        for name in listed.split("\0")
        if name and name not in SKIPPED and not name.startswith(VENDORED)
    ]


def offences(text: str) -> list[tuple[int, str, str]]:
    """Each offence as (line number, what it betrays, the words)."""
    found = []
    for match in SCAN.finditer(text):
        index = int((match.lastgroup or "p0")[1:])
        number = text.count("\n", 0, match.start()) + 1
        found.append((number, FORBIDDEN[index][1], match.group(0)))
    return found


def test_the_tree_speaks_only_of_what_writ_is() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing tracked to scan")
    report = []
    scanned = 0
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # images and other binaries; a file deleted but not yet staged
        scanned += 1
        for number, why, words in offences(text):
            report.append(f"{path.relative_to(ROOT)}:{number}: {words!r} ({why})")
    assert scanned > 100, f"only {scanned} files scanned: is `git ls-files` seeing the tree?"
    assert not report, "say what Writ is and does instead:\n" + "\n".join(report)


# The offences are written in rot13 and decoded at run time, so that the tree itself never
# says them.
@pytest.mark.parametrize(
    "line",
    [
        codecs.decode(line, "rot13")
        for line in (
            "Granagf vfbyngrq ba gur ohf (vffhr 12, qrsrpgf 4 naq 11).",
            "Fgbc 33 (2026-12-06, avtug): gjb shyy ehaf",
            "zretrq sebz oenapu v21",
            "gur v20 phg bs gur cynaare",
            "nf frffvba 14 zrnfherq",
            "qvssre ol n guveq ba guvf znpuvar",
            "bgure urycref' grfgf",
            "Gur zbqry'f erdhrfg vf abg gur cebcbfny (frrq 003).",
            "vgf fbhepr qbphzragf ner va `../funerq/frrqf/`",
            "eha U 20:32 HGP",
            "nf guvf frffvba sbhaq",
            "na rneyvre fvggvat ng 19:26 tnir",
        )
    ],
)
def test_each_kind_of_offence_is_caught(line: str) -> None:
    assert offences(line), line


@pytest.mark.parametrize(
    "line",
    [
        "A chat session's turn is a run of the session's agent.",
        "the host's ticket has an issue the agent comments on",
        "node SIGSTOP 12, kill -9 23",
        "32 sessions of `chat-assistant` over HTTP",
        "fix for nats-io/nats.py#933",
        "Writ-Deadline: 2026-12-06T20:32:00Z",
        "a soak with seed 2131 and seed 21",
        "8 sessions 3 s apart",
    ],
)
def test_the_products_own_words_pass(line: str) -> None:
    assert not offences(line), offences(line)
