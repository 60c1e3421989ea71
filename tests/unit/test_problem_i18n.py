"""Problems and refusal reasons in the approver's language: every code the API answers with has
a title in English and French, the sentences Writ composes around codes are said in French with
the same fields, free text stays as it was recorded, and the machine code never changes."""

from __future__ import annotations

import string

import msgspec
import pytest

from schemas.api import Problem
from services.ingress.console._codes import COMPOSED, REASONS, TITLES, composed
from services.ingress.console._i18n import CATALOG, said, title_of
from services.ingress.http._problems import STATUS, problem


def _fields(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name]


def test_every_code_the_api_answers_with_has_a_title_in_both_languages() -> None:
    assert set(STATUS) <= set(TITLES)
    for code in STATUS:
        msg = CATALOG[f"title:{code}"]
        assert msg.en == code.replace("_", " ").lower()  # English says what it always said
        assert msg.fr.strip() and msg.fr != msg.en, code


def test_every_reason_and_composed_sentence_has_both_languages_with_the_same_fields() -> None:
    for key, msg in {**REASONS, **COMPOSED}.items():
        assert msg.en.strip() and msg.fr.strip() and msg.en != msg.fr, key
        assert sorted(_fields(msg.en)) == sorted(_fields(msg.fr)), key
        assert f"code:{key}" in CATALOG or f"composed:{key}" in CATALOG


@pytest.mark.parametrize("key", sorted(COMPOSED))
def test_a_composed_sentence_is_said_in_french_with_its_fields(key: str) -> None:
    msg = COMPOSED[key]
    fields = {name: f"<{name}-1>" for name in _fields(msg.en)}
    assert composed(msg.en.format(**fields), "fr") == msg.fr.format(**fields)
    assert composed(msg.en.format(**fields), "en") == msg.en.format(**fields)


def test_a_reason_comes_from_its_code_else_the_sentence_else_the_recorded_text() -> None:
    # The sentence Writ composed, in French, its fields kept (nested sentences too).
    assert said(
        "ALREADY_APPROVED",
        "you approved it already: it needs 2 distinct approvers, another approver must approve it",
        "fr",
    ) == (
        "vous l'avez déjà approuvée : il lui faut 2 approbateurs distincts, un autre "
        "approbateur doit l'approuver"
    )
    assert (
        said(None, "the proposal expired unanswered (no answer before the proposal expired)", "fr")
        == "la proposition a expiré sans réponse (aucune réponse avant l'expiration de la "
        "proposition)"
    )
    # A code whose meaning is fixed, whatever its text says.
    assert said("APPROVER_REVOKED", None, "fr") == (
        "l'accès de l'approbateur a été révoqué après son approbation"
    )
    assert (
        said("SEPARATION_OF_DUTIES", "something else", "fr") == REASONS["SEPARATION_OF_DUTIES"].fr
    )
    # Free text nobody can translate: as recorded; an approver's words inside Writ's, as written.
    assert said("FORBIDDEN", "the host says no", "fr") == "the host says no"
    assert said(None, "rejected by bob@acme.example: trop cher", "fr") == (
        "rejetée par bob@acme.example : trop cher"
    )
    # English: the recorded text as it is.
    assert said("ALREADY_APPROVED", "as recorded", "en") == "as recorded"
    assert said("APPROVER_REVOKED", None, "en") == REASONS["APPROVER_REVOKED"].en


def test_a_french_problem_has_french_words_and_the_same_code() -> None:
    english = msgspec.json.decode(
        problem("FORBIDDEN", "this needs the approver role").content, type=Problem
    )
    french_response = problem("FORBIDDEN", "this needs the approver role", locale="fr")
    french = msgspec.json.decode(french_response.content, type=Problem)
    assert (english.code, english.title, english.detail) == (
        "FORBIDDEN",
        "forbidden",
        "this needs the approver role",
    )
    assert (french.code, french.status, french.title, french.detail) == (
        "FORBIDDEN",
        403,
        "Interdit",
        "il faut pour cela le rôle approver",
    )
    assert french_response.headers["Content-Language"] == "fr"
    # A validation error's words are free text: kept, under a French title.
    free = msgspec.json.decode(
        problem("INVALID_REQUEST", "Object contains unknown field `x`", locale="fr").content,
        type=Problem,
    )
    assert (free.code, free.title, free.detail) == (
        "INVALID_REQUEST",
        "Requête invalide",
        "Object contains unknown field `x`",
    )
    assert title_of("NO_SUCH_CODE", "fr") == "no such code"
