"""Stable codes and the texts Writ composes around them, in English and French: part of the
one catalog (`_i18n.CATALOG`), kept apart to keep modules short.

- `TITLES`: a problem document's `title` for each code the HTTP API answers with (in English,
  the code in words, as the API always said it).
- `REASONS`: what a refusal with a stable code means, as a sentence, for the codes whose
  meaning does not depend on the case (an approval's refusal, an approval that no longer
  counts): the console says them from the code.
- `COMPOSED`: sentences the API and the services compose in English, with their fields. A
  text that is one of them is said in the other language with the same fields; anything else
  (a validation error's words, an approver's reason, a host's message) is free text and stays
  as it was recorded. The first sentence that matches wins, so a narrower one comes before a
  wider one ("... approver or auditor role" before "... {role} role").

The machine `code` itself is never translated."""

from __future__ import annotations

import re
from typing import Final

from services.ingress.console._words import Msg

__all__ = ["COMPOSED", "REASONS", "TITLES", "composed"]

TITLES: Final[dict[str, Msg]] = {
    "INVALID_REQUEST": Msg("invalid request", "Requête invalide"),
    "UNAUTHENTICATED": Msg("unauthenticated", "Non authentifié"),
    "UNKNOWN_TENANT": Msg("unknown tenant", "Organisation inconnue"),
    "BAD_SIGNATURE": Msg("bad signature", "Signature invalide"),
    "TOKEN_EXPIRED": Msg("token expired", "Jeton expiré"),
    "INVALID_TOKEN": Msg("invalid token", "Jeton invalide"),
    "WRONG_TENANT": Msg("wrong tenant", "Mauvaise organisation"),
    "FORBIDDEN": Msg("forbidden", "Interdit"),
    "NOT_FOUND": Msg("not found", "Introuvable"),
    "METHOD_NOT_ALLOWED": Msg("method not allowed", "Méthode non autorisée"),
    "CONFLICT": Msg("conflict", "Conflit"),
    "TOO_LARGE": Msg("too large", "Trop volumineux"),
    "UNSUPPORTED_MEDIA_TYPE": Msg("unsupported media type", "Type de contenu non pris en charge"),
    "INTERNAL": Msg("internal", "Erreur interne"),
    "UNAVAILABLE": Msg("unavailable", "Indisponible"),
    "TIMEOUT": Msg("timeout", "Pas de réponse à temps"),
    "SESSION_BUSY": Msg("session busy", "Session occupée"),
    "SESSION_PAUSED": Msg("session paused", "Session en pause"),
    "SESSION_CLOSED": Msg("session closed", "Session fermée"),
    "PLAN_ANSWERED": Msg("plan answered", "Plan déjà répondu"),
    "INVALID_TRANSITION": Msg("invalid transition", "Transition invalide"),
    "UNKNOWN_AGENT": Msg("unknown agent", "Agent inconnu"),
}

REASONS: Final[dict[str, Msg]] = {
    "SEPARATION_OF_DUTIES": Msg(
        "the principal who requested the run cannot approve its proposals; another approver must",
        "la personne qui a demandé l'exécution ne peut pas approuver ses propositions ; un "
        "autre approbateur doit le faire",
    ),
    "ALREADY_APPROVED": Msg(
        "you approved it already: it needs distinct approvers, another approver must approve it",
        "vous l'avez déjà approuvée : il lui faut des approbateurs distincts, un autre "
        "approbateur doit l'approuver",
    ),
    "EXPIRED": Msg("the proposal expired", "la proposition a expiré"),
    "UNKNOWN_PROPOSAL": Msg("no such proposal", "aucune proposition sous cet identifiant"),
    "PROPOSAL_MISMATCH": Msg(
        "the decision is not about this proposal",
        "la décision ne porte pas sur cette proposition",
    ),
    "PROPOSAL_REQUIRED": Msg(
        "this decision is about a proposal: answer it on the proposal, where its preview is shown",
        "cette décision porte sur une proposition : répondez-y sur la proposition, là où son "
        "aperçu est affiché",
    ),
    "TERMINAL_FAILURE": Msg(
        "the stored proposal cannot be executed",
        "la proposition enregistrée ne peut pas être exécutée",
    ),
    "UNKNOWN_PENDING": Msg(
        "no such pending decision", "aucune décision en attente sous cet identifiant"
    ),
    "APPROVER_REVOKED": Msg(
        "the approver's access was revoked after they approved",
        "l'accès de l'approbateur a été révoqué après son approbation",
    ),
    "TOKEN_EXPIRED": Msg("the token has expired", "le jeton a expiré"),
    "BAD_SIGNATURE": Msg(
        "the token's signature does not verify with the tenant's key",
        "la signature du jeton ne se vérifie pas avec la clé de l'organisation",
    ),
    "WRONG_TENANT": Msg(
        "the token was issued for another tenant",
        "le jeton a été émis pour une autre organisation",
    ),
}

COMPOSED: Final[dict[str, Msg]] = {
    # What governance's `decide` gives as the reason of its ruling (services/governance/logic.py).
    "decide_plain_read_unavailable": Msg(
        "plain read; policy unavailable", "simple lecture ; politique indisponible"
    ),
    "decide_store_unreadable": Msg(
        "governance store unreadable: sensitive calls are denied",
        "registre de la gouvernance illisible : les appels sensibles sont refusés",
    ),
    "decide_policy_refused": Msg(
        "the organisation policy was refused: sensitive calls are denied",
        "la politique de l'organisation a été refusée : les appels sensibles sont refusés",
    ),
    "decide_revoked": Msg(
        "the principal's access was revoked", "l'accès de cette personne a été révoqué"
    ),
    "decide_org_policy": Msg(
        "refused by organisation policy", "refusé par la politique de l'organisation"
    ),
    "decide_deny_rule": Msg(
        "a deny rule matches the call", "une règle de refus correspond à l'appel"
    ),
    "decide_own_context": Msg(
        "reads, or acts only on its own context",
        "lit, ou n'agit que sur son propre contexte",
    ),
    "decide_approved": Msg(
        "approved by a person for this call", "approuvé par une personne pour cet appel"
    ),
    "decide_developer_mode": Msg(
        "developer mode: an allow rule covers this simple command",
        "mode développeur : une règle d'autorisation couvre cette commande simple",
    ),
    "decide_code_execution": Msg(
        "code execution needs a person", "l'exécution de code demande une personne"
    ),
    "decide_profile_fact": Msg(
        "a profile fact is asked every time", "un fait de profil est demandé à chaque fois"
    ),
    "decide_consequential": Msg(
        "a consequential action (money, access, sending outside) is asked every time",
        "une action lourde de conséquences (argent, accès, envoi à l'extérieur) est demandée"
        " à chaque fois",
    ),
    "decide_pinned_grant": Msg(
        "standing grant for {family} of {source} pinned to {digest}",
        "accord permanent pour {family} de {source}, épinglé à {digest}",
    ),
    "decide_standing_grant": Msg("standing grant for {family}", "accord permanent pour {family}"),
    "decide_run_grant": Msg(
        "granted for this run: {family}", "accordé pour cette exécution : {family}"
    ),
    "decide_unclassified": Msg(
        "unclassified tool: asked every time",
        "outil non classé : demandé à chaque fois",
    ),
    "decide_no_grant": Msg("no grant covers the call", "aucun accord ne couvre l'appel"),
    "awaiting_decision": Msg(
        "{action} needs a person's decision: {reason}",
        "{action} attend la décision d'une personne : {reason}",
    ),
    "needs_approver_or_auditor": Msg(
        "this needs the approver or auditor role",
        "il faut pour cela le rôle approver ou auditor",
    ),
    "needs_role": Msg("this needs the {role} role", "il faut pour cela le rôle {role}"),
    "answering_needs_role": Msg(
        "answering {kind} needs the {role} role",
        "répondre ({kind}) demande le rôle {role}",
    ),
    "no_answer_in_time": Msg(
        "no answer came in time; ask again with the same Idempotency-Key",
        "aucune réponse n'est venue à temps ; redemandez avec la même Idempotency-Key",
    ),
    "bearer_required": Msg(
        "an `Authorization: Bearer <token>` header is required",
        "un en-tête `Authorization: Bearer <jeton>` est requis",
    ),
    "no_such_run": Msg("no such run", "aucune exécution sous cet identifiant"),
    "no_such_proposal": Msg("no such proposal", "aucune proposition sous cet identifiant"),
    "no_such_command": Msg(
        "no command under this operation id", "aucune commande sous cet identifiant d'opération"
    ),
    "failed_inside": Msg(
        "the request failed inside Writ", "la requête a échoué à l'intérieur de Writ"
    ),
    "key_required": Msg("header `Idempotency-Key`: required", "en-tête `Idempotency-Key` : requis"),
    "no_issuer": Msg(
        "no issuer is configured for tenant {tenant}",
        "aucun émetteur n'est configuré pour l'organisation {tenant}",
    ),
    "revoked": Msg("the approver's access was revoked", "l'accès de l'approbateur a été révoqué"),
    "sod_governance": Msg(
        "the principal who requested the run cannot approve its proposals",
        "la personne qui a demandé l'exécution ne peut pas approuver ses propositions",
    ),
    "already_approved": Msg(
        "you approved it already: it needs {needed} distinct approvers, another approver must "
        "approve it",
        "vous l'avez déjà approuvée : il lui faut {needed} approbateurs distincts, un autre "
        "approbateur doit l'approuver",
    ),
    "approvals_recorded": Msg(
        "{n} of {needed} approvals: another approver must approve it",
        "{n} approbation(s) sur {needed} : un autre approbateur doit l'approuver",
    ),
    "revision_asked_by": Msg(
        "revision asked by {who}: {why}", "révision demandée par {who} : {why}"
    ),
    "rejected_by_because": Msg("rejected by {who}: {why}", "rejetée par {who} : {why}"),
    "rejected_by": Msg("rejected by {who}", "rejetée par {who}"),
    "expired_unanswered_because": Msg(
        "the proposal expired unanswered ({why})", "la proposition a expiré sans réponse ({why})"
    ),
    "no_answer_before_expiry": Msg(
        "no answer before the proposal expired",
        "aucune réponse avant l'expiration de la proposition",
    ),
    "already_answered": Msg("already answered {answer}", "déjà répondue : {answer}"),
    "proposal_is": Msg("the proposal is {state}", "la proposition est : {state}"),
    "expired_unanswered": Msg(
        "the decision expired unanswered: nothing may be answered now",
        "la décision a expiré sans réponse : plus rien ne peut y être répondu",
    ),
}

_FIELD = re.compile(r"\\\{([a-z_]+)\\\}")
# Each composed English sentence as a pattern whose groups are its fields.
_PATTERNS: Final = [
    (re.compile(_FIELD.sub(lambda m: f"(?P<{m.group(1)}>.+?)", re.escape(msg.en))), msg)
    for msg in COMPOSED.values()
]


def composed(text: str, locale: str) -> str | None:
    """`text` in `locale` if it is one of the sentences Writ composes (its fields kept as
    they were), else None: it is free text."""
    for pattern, msg in _PATTERNS:
        found = pattern.fullmatch(text)
        if found is not None:
            said: str = getattr(msg, locale)
            # A field may itself be a sentence Writ composed ("expired unanswered (<why>)").
            fields = {k: composed(v, locale) or v for k, v in found.groupdict().items()}
            return said.format(**fields)
    return None
