"""Is this shell text one simple command, and does an allow rule's prefix cover it? Pure, no I/O.

docs/design.md §4, line 4: a call that executes code is allowed only in developer mode, by a fine
allow rule whose prefix matches a *simple single command*. This module decides what that phrase
means, and it fails closed: anything it cannot prove simple is refused, so the call asks a person.

Structure comes from `bashlex`, a port of GNU bash's own parser, never from a regex. The input must
parse to exactly one `CommandNode` whose parts are all plain `WordNode`s without expansion parts.
That refuses chaining (`;`, `&&`, `||`, `&`, newline), pipes (`|`, `|&`), redirections of every
form (including here-docs and here-strings), command and process substitution, subshells, groups,
compound commands (`if`, `for`, `while`, `until`, `case`, `select`, functions, `!`, `time`,
`coproc`) and assignments prefixing the command (`FOO=1 cmd`).

Our reading of "simple" goes further than the design's list; each rule below is deliberate:

- No parameter, arithmetic or ANSI-C expansion: an unquoted or double-quoted `$` or backtick is
  refused (`$VAR`, `${...}`, `$((...))`, `$'...'`, `$"..."`), because its value is only known
  when it runs. A `$` is fine inside single quotes or escaped by a backslash: bash keeps it.
- No glob or brace expansion, which can widen what the command touches: unquoted `*`, `?`, `[`,
  `{` and `}` are refused. Quoting makes them literal and is accepted: single quotes, double
  quotes and a backslash all stop bash from expanding them. The one exception is an unquoted
  empty pair `{}` (find's placeholder), which bash never expands.
- No tilde expansion: an unquoted `~` is refused unless it follows an ASCII letter or digit
  (`HEAD~1`, `notes~` stay literal in bash; `~root`, `a=~`, `PATH=x:~` do not).
- No `!` outside single quotes: history expansion rewrites it in interactive shells.
- No comments: bashlex silently drops `# ...`, so the words must cover the whole input with only
  spaces between them; anything the parser skipped is refused.
- Only printable characters and the ASCII space (`str.isprintable`): no NUL, tab, newline, `\\r`,
  escape sequences, no-break or zero-width spaces, or bidi overrides. That also rules out
  backslash-newline continuations, which bashlex splices into one word (`ls\\<NL>rm` -> `lsrm`).
- Unicode look-alikes of operators (`；` U+FF1B, `｜` U+FF5C, ...) are accepted as plain words:
  bash's metacharacters are ASCII only, so `ls ；rm` runs `ls` with the argument `；rm`, and the
  token-wise prefix check below keeps that from matching anything but an `ls` rule.
- Input is bounded by `MAX_COMMAND_CHARS`; an empty command name is refused.
- `${` is refused anywhere, even single-quoted, before bashlex sees it: bashlex hangs on some
  such words (see `simple_command`).
- `eval`, `exec`, `sh -c '...'` and the like are plain words here: whether they may run is the
  allow rule's business, and `prefix_allows` compares whole words, so a rule for `git status`
  never covers `eval ...`.

Quote removal is done twice: bashlex gives each word, and a small bash-rules scanner over the
word's source text gives it again. bashlex gets mixed quoting wrong (`"a"'b'` comes back as
`a'b'`, `"a\\b"` as `ab`), and a rule compared against a misread word could match a command the
person never saw, so when the two disagree the command is refused.
"""

from __future__ import annotations

import re
from typing import Any, Final

import bashlex
import msgspec

__all__ = ["MAX_COMMAND_CHARS", "SimpleCommand", "prefix_allows", "simple_command"]

MAX_COMMAND_CHARS: Final = 4096

# Shell metacharacters and expansion triggers that may never appear unquoted inside a word.
# bashlex would normally have split on them or flagged them; seeing one here means it did not.
_REFUSED_UNQUOTED: Final = frozenset("$`!*?[;&|<>() \t")
# Inside double quotes bash still expands `$` and backticks; `!` is history expansion.
_REFUSED_DOUBLE_QUOTED: Final = frozenset("$`!")
# Inside double quotes a backslash only escapes these; before anything else it is kept.
_DOUBLE_QUOTE_ESCAPABLE: Final = frozenset('$`"\\\n')
# bash treats `NAME=`, `NAME+=` and `NAME[...]=` as an assignment in command position.
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")


class SimpleCommand(msgspec.Struct, frozen=True, kw_only=True):
    """One simple shell command: its words after quote removal, command name first."""

    argv: tuple[str, ...]


def simple_command(text: str) -> SimpleCommand | None:
    """Parse `text` as exactly one simple command, or return None if it is anything else."""
    if len(text) > MAX_COMMAND_CHARS or not text.isprintable() or not text.strip(" "):
        return None
    # bashlex 0.18 loops forever on a `${` it cannot close inside a word that starts with a
    # double quote (`""'${'`); our rules refuse every real `${...}` anyway, so never hand it one.
    if "${" in text:
        return None
    try:
        trees = bashlex.parse(text)
    except Exception:  # ParsingError, NotImplementedError, AttributeError, RecursionError, ...
        return None
    if len(trees) != 1 or trees[0].kind != "command":
        return None
    words = trees[0].parts
    if not words or any(w.kind != "word" or getattr(w, "parts", None) for w in words):
        return None
    # bashlex drops comments without a trace; a skipped span would run (or hide) unseen by the rule.
    if not _covers(text, words):
        return None
    argv: list[str] = []
    for w in words:
        start, end = w.pos
        raw = text[start:end]
        word = _unquote(raw)
        # bashlex's own quote removal is unreliable; a disagreement means one reading is wrong.
        if word is None or word != getattr(w, "word", None):
            return None
        argv.append(word)
    if not argv[0] or _ASSIGNMENT.match(text[words[0].pos[0] : words[0].pos[1]]):
        return None
    return SimpleCommand(argv=tuple(argv))


def prefix_allows(prefix: str, command: str) -> bool:
    """Is `command` a simple command whose words start with the words of simple command `prefix`?"""
    allowed = simple_command(prefix)
    if allowed is None:
        return False
    candidate = simple_command(command)
    if candidate is None:
        return False
    n = len(allowed.argv)
    # Whole words, not characters: `git status` must not cover `git statusx`.
    return candidate.argv[:n] == allowed.argv


def _covers(text: str, words: list[Any]) -> bool:
    """Do the words tile the input with nothing but spaces around and between them?"""
    cursor = 0
    for w in words:
        start, end = w.pos
        if start < cursor or text[cursor:start].strip(" "):
            return False
        cursor = end
    return not text[cursor:].strip(" ")


def _unquote(raw: str) -> str | None:
    """Quote removal on one word's source by bash's rules, or None if it could expand."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            if end < 0:
                return None
            out.append(raw[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    return None
                c = raw[i]
                if c == '"':
                    i += 1
                    break
                if c in _REFUSED_DOUBLE_QUOTED:
                    return None
                if c == "\\" and i + 1 < n and raw[i + 1] in _DOUBLE_QUOTE_ESCAPABLE:
                    out.append(raw[i + 1])
                    i += 2
                    continue
                out.append(c)
                i += 1
        elif c == "\\":
            if i + 1 >= n:
                return None
            out.append(raw[i + 1])
            i += 2
        elif c in _REFUSED_UNQUOTED:
            return None
        elif c == "{":
            # An empty pair is never brace-expanded; any other unquoted brace might be.
            if raw[i + 1 : i + 2] != "}":
                return None
            out.append("{}")
            i += 2
        elif c == "}":
            return None
        elif c == "~" and not (i > 0 and raw[i - 1].isascii() and raw[i - 1].isalnum()):
            return None
        elif c == "#" and i == 0:
            return None
        else:
            out.append(c)
            i += 1
    return "".join(out)
