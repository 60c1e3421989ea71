"""The console's words in English and French: one typed catalog, the locale a page is rendered
in, and amounts and dates written the way that locale writes them ("49.00 EUR" in English,
"49,00 €" in French).

The locale comes from the `writ_lang` cookie the switch sets, else from the browser's
`Accept-Language`, else English. A page renders under `rendering(locale)`; `t(key)` reads the
catalog in that locale. Only what this module knows is ever chosen: a header or a cookie names
a locale, it never supplies text."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Final, Literal, get_args

from services.ingress.console._codes import COMPOSED, REASONS, TITLES, composed
from services.ingress.console._words import MORE, Msg

__all__ = [
    "CATALOG",
    "LABELS",
    "LANG_COOKIE",
    "LOCALES",
    "Locale",
    "Msg",
    "amount",
    "current",
    "here",
    "caption",
    "said",
    "stamp",
    "negotiate",
    "rendering",
    "t",
    "shown",
    "title_of",
]

Locale = Literal["en", "fr"]
LOCALES: Final[tuple[Locale, ...]] = get_args(Locale)
LANG_COOKIE: Final = "writ_lang"
_current: ContextVar[Locale] = ContextVar("writ_console_locale", default="en")
_here: ContextVar[str] = ContextVar("writ_console_here", default="/console/")


CATALOG: Final[dict[str, Msg]] = {
    # The frame of every page
    "brand": Msg("Writ · approvals", "Writ · approbations"),
    "site": Msg("Writ console", "Console Writ"),
    "sign_out": Msg("Sign out", "Se déconnecter"),
    "language": Msg("Language", "Langue"),
    "pages_nav": Msg("Console pages", "Pages de la console"),
    "nav_inbox": Msg("Approvals", "Approbations"),
    "nav_spend": Msg("Spend", "Dépenses"),
    # Spans of time
    "no_expiry": Msg("no expiry", "sans échéance"),
    "expired": Msg("expired", "expirée"),
    # The spend page
    "spend_title": Msg("Spend against caps", "Dépenses et plafonds"),
    "spend_intro": Msg(
        "What {tenant}'s runs spent and hold in flight, against each cap of its signed price "
        "table, in the current and earlier windows.",
        "Ce que les exécutions de {tenant} ont dépensé et réservent en cours, face à chaque "
        "plafond de sa grille de prix signée, dans la fenêtre en cours et les précédentes.",
    ),
    "spend_caption": Msg("Spend per cap and window", "Dépenses par plafond et fenêtre"),
    "spend_cap": Msg("Cap", "Plafond"),
    "spend_agent": Msg("Agent", "Agent"),
    "spend_all_agents": Msg("every agent", "tous les agents"),
    "spend_window": Msg("Window", "Fenêtre"),
    "spend_settled": Msg("Settled", "Réglé"),
    "spend_held": Msg("Held", "Réservé"),
    "spend_limit": Msg("Limit", "Plafond fixé"),
    "spend_left": Msg("Left", "Restant"),
    "spend_share": Msg("Used", "Utilisé"),
    "spend_none": Msg(
        "No spend caps: this tenant has no signed price table.",
        "Aucun plafond : ce locataire n'a pas de grille de prix signée.",
    ),
    # Refusals and messages
    "not_signed_in": Msg("Not signed in", "Non connecté"),
    "not_allowed": Msg("Not allowed", "Non autorisé"),
    "sign_in_hint": Msg(
        "{reason}. The console takes your identity from your organisation's sign-in proxy; "
        "locally, `writ console` prints a one-time link.",
        "{reason}. La console reçoit votre identité du proxy d'authentification de votre "
        "organisation ; en local, `writ console` affiche un lien à usage unique.",
    ),
    "refused": Msg("Refused", "Refusé"),
    "csrf_refused": Msg(
        "this form's CSRF token is missing or wrong: nothing was done. Reload the page and "
        "answer again.",
        "le jeton CSRF de ce formulaire manque ou est faux : rien n'a été fait. Rechargez la "
        "page et répondez à nouveau.",
    ),
    "invalid_answer": Msg("Invalid answer", "Réponse invalide"),
    "nothing_done": Msg("nothing was done: {problem}", "rien n'a été fait : {problem}"),
    "not_found": Msg("Not found", "Introuvable"),
    "no_such": Msg(
        "no {what} of your tenant under this id",
        "aucun élément ({what}) de votre organisation sous cet identifiant",
    ),
    "nothing_done_dash": Msg("Nothing was done — {problem}", "Rien n'a été fait — {problem}"),
    "invalid_request": Msg("Invalid request", "Requête invalide"),
    "gone": Msg("Gone", "Plus là"),
    "proposal_gone": Msg(
        "the proposal this decision is about no longer waits",
        "la proposition dont parle cette décision n'attend plus",
    ),
    "no_decision": Msg(
        "no decision of your tenant is waiting under this id",
        "aucune décision de votre organisation n'attend sous cet identifiant",
    ),
    "no_review": Msg(
        "no review of your tenant is waiting under this id",
        "aucune relecture de votre organisation n'attend sous cet identifiant",
    ),
    "no_run": Msg(
        "no run of your tenant under this id",
        "aucune exécution de votre organisation sous cet identifiant",
    ),
    "revision_sent": Msg(
        "Sent back for a revision: the agent gets your reason.",
        "Renvoyée pour révision : l'agent reçoit votre motif.",
    ),
    "not_approved": Msg("Not approved — {code}: {why}", "Non approuvée — {code} : {why}"),
    "not_rejected": Msg("Not rejected — {code}: {why}", "Non rejetée — {code} : {why}"),
    "not_revised": Msg("Not revised — {code}: {why}", "Non renvoyée — {code} : {why}"),
    "not_taken": Msg("Not taken — {code}: {why}", "Non prise en compte — {code} : {why}"),
    "answered_as": Msg("Answered {answer}.", "Réponse : {answer}."),
    "answer_once": Msg("once", "une fois"),
    "answer_always": Msg("always", "toujours"),
    "answer_deny": Msg("deny", "refuser"),
    "answer_approve": Msg("approve", "approuver"),
    "answer_reject": Msg("reject", "rejeter"),
    # A run
    "run_title": Msg("Run {id}", "Exécution {id}"),
    "writ_recorded": Msg("Writ recorded {what}", "Writ a enregistré {what}"),
    "agent_wrote": Msg("The agent wrote:", "L'agent a écrit :"),
    "waiting_person": Msg("Waiting for a person:", "En attente d'une personne :"),
    "timeline": Msg("Timeline", "Chronologie"),
    "decision": Msg("Decision", "Décision"),
    "target": Msg("Target", "Cible"),
    "verdict": Msg("Verdict", "Verdict"),
    "summary": Msg("Summary", "Résumé"),
    "actions": Msg("Actions", "Actions"),
    "operation": Msg("Operation", "Opération"),
    "state": Msg("State", "État"),
    "outcome": Msg("Outcome", "Résultat"),
    "receipt_head": Msg("Receipt", "Reçu"),
    "why": Msg("Why", "Pourquoi"),
    "audit_journal": Msg("Audit journal", "Journal d'audit"),
    "replay_run": Msg("Replay this run", "Rejouer cette exécution"),
    "replay": Msg("Replay", "Rejeu"),
    "journal_ok": Msg("ok", "vérifié"),
    "journal_not_ok": Msg("NOT OK", "NON vérifié"),
    "entries": Msg("{n} entries", "{n} entrées"),
    "replayed": Msg("{n} entries replayed", "{n} entrées rejouées"),
    # The trail
    "trail": Msg("Trail", "Historique"),
    "trail_unread": Msg(
        "The trail could not be read from the journals just now.",
        "L'historique n'a pas pu être lu dans les journaux à l'instant.",
    ),
    "trail_failed": Msg(
        "{n} of {total} rows failed verification: ",
        "{n} ligne(s) sur {total} échouent à la vérification : ",
    ),
    "trail_ok": Msg(
        "All {total} rows check out against the signed journals.",
        "Les {total} lignes concordent avec les journaux signés.",
    ),
    "verified": Msg("verified", "vérifiée"),
    "not_verified": Msg("NOT verified", "NON vérifiée"),
    "step": Msg("Step", "Étape"),
    "who": Msg("Who", "Qui"),
    "when": Msg("When", "Quand"),
    "what": Msg("What", "Quoi"),
    "journal": Msg("Journal", "Journal"),
    "check": Msg("Check", "Contrôle"),
    "sign_in_refused": Msg("Sign-in refused", "Connexion refusée"),
    "signed_out": Msg("Signed out", "Déconnecté"),
    "session_ended": Msg("Your session ended.", "Votre session est terminée."),
    # Answers
    "answered_claimed": Msg(
        "Approved: the one execution started.", "Approuvée : l'unique exécution a commencé."
    ),
    "answered_already_completed": Msg(
        "Approved before: this is its recorded outcome (nothing ran twice).",
        "Déjà approuvée : voici son résultat enregistré (rien n'a été exécuté deux fois).",
    ),
    "answered_rejected": Msg("Rejected.", "Rejetée."),
    "answered_approval_recorded": Msg(
        "Your approval is recorded: another approver must approve it too.",
        "Votre approbation est enregistrée : un autre approbateur doit aussi l'approuver.",
    ),
    # The inbox
    "inbox": Msg("Inbox", "À traiter"),
    "nothing_waiting": Msg("Nothing is waiting for you.", "Rien ne vous attend."),
    "kind_all": Msg("everything", "tout"),
    "kind_proposal": Msg("proposals", "propositions"),
    "kind_decision": Msg("decisions", "décisions"),
    "kind_review": Msg("reviews", "relectures"),
    "row_proposal": Msg("proposal", "proposition"),
    "row_decision": Msg("decision", "décision"),
    "row_review": Msg("review", "relecture"),
    "all_agents": Msg("all agents", "tous les agents"),
    "all_actions": Msg("all actions", "toutes les actions"),
    "open_run": Msg("Open a run", "Ouvrir une exécution"),
    "open": Msg("Open", "Ouvrir"),
    "older_decisions": Msg("Older decisions", "Décisions plus anciennes"),
    "older_proposals": Msg("Older proposals", "Propositions plus anciennes"),
    "all_decisions": Msg("All {n} decisions", "Les {n} décisions"),
    "newest": Msg("Newest", "Les plus récentes"),
    "waiting": Msg("Waiting: {count}", "En attente : {count}"),
    "nothing": Msg("nothing", "rien"),
    "kind": Msg("Kind", "Type"),
    "agent": Msg("Agent", "Agent"),
    "action": Msg("Action", "Action"),
    "requester": Msg("Requester", "Demandeur"),
    "older_than": Msg("Older than (minutes)", "Plus ancien que (minutes)"),
    "filter": Msg("Filter", "Filtrer"),
    "action_or_tool": Msg("Action or tool", "Action ou outil"),
    "age": Msg("Age", "Âge"),
    "time_left": Msg("Time left", "Temps restant"),
    "pages": Msg("Pages", "Pages"),
    # A proposal
    "proposal_title": Msg("Proposal {action}", "Proposition {action}"),
    "preview_mismatch": Msg(
        "This proposal's preview does not match the contract {action} as this console knows "
        "it; it cannot be shown.",
        "L'aperçu de cette proposition ne correspond pas au contrat {action} tel que cette "
        "console le connaît ; il ne peut pas être affiché.",
    ),
    "payload_expired": Msg(
        "payload expired: this proposal's arguments and preview were erased under the "
        "retention policy; it cannot be approved.",
        "payload expired : les arguments et l'aperçu de cette proposition ont été effacés "
        "selon la politique de rétention ; elle ne peut pas être approuvée.",
    ),
    "waiting_expired": Msg(
        "expired: it can no longer be approved; the agent must propose it again",
        "expirée : elle ne peut plus être approuvée ; l'agent doit la proposer à nouveau",
    ),
    "waiting_for_approver": Msg(
        "waiting for an approver ({left} left)", "en attente d'un approbateur ({left} restant)"
    ),
    "approved_outcome": Msg(
        "approved by {who}; outcome: {outcome}", "approuvée par {who} ; résultat : {outcome}"
    ),
    "receipt": Msg(" (receipt {receipt})", " (reçu {receipt})"),
    "reconcile": Msg(
        "; nobody knows yet whether it happened: an operator reconciles it",
        "; personne ne sait encore si elle a eu lieu : un opérateur la rapproche",
    ),
    "terminal": Msg(
        "; it will not be retried: quote the correlation id {id} to an operator",
        "; elle ne sera pas retentée : donnez l'identifiant de corrélation {id} à un opérateur",
    ),
    "cannot_approve": Msg(
        "it can no longer be approved; the agent must propose it again",
        "elle ne peut plus être approuvée ; l'agent doit la proposer à nouveau",
    ),
    "refused_summary": Msg(
        "the system of record refused it (its answer is in the operators' records)",
        "le système de référence l'a refusée (sa réponse est dans les journaux des opérateurs)",
    ),
    "line_of_decide": Msg(" — line {line} of decide", " — ligne {line} de decide"),
    "policy": Msg(", policy {version}", ", politique {version}"),
    "none": Msg("none", "aucun"),
    "what_it_stands_on": Msg("What it stands on", "Sur quoi elle repose"),
    "reads_nothing": Msg(
        "This action reads no outside state: the preview is its arguments.",
        "Cette action ne lit aucun état extérieur : l'aperçu, ce sont ses arguments.",
    ),
    "read_at": Msg(
        "Read at {at}; the dispatcher reads it again before executing and stops if anything "
        "shown changed.",
        "Lu le {at} ; le répartiteur le relit avant d'exécuter et s'arrête si quoi que ce soit "
        "d'affiché a changé.",
    ),
    "approvals_of": Msg("{n} of {needed} approvals", "{n} approbation(s) sur {needed}"),
    "approvals_by": Msg(" (by {who})", " (par {who})"),
    "state_because": Msg("{state}: {reason}", "{state} : {reason}"),
    "approval_counts": Msg("approved; counts", "a approuvé ; compte"),
    "approval_void": Msg("approved, no longer counts: {why}", "a approuvé, ne compte plus : {why}"),
    "four_eyes": Msg(
        ": four eyes, {needed} distinct approvers, neither of them the requester.",
        " : quatre yeux, {needed} approbateurs distincts, dont aucun n'est le demandeur.",
    ),
    "what_approving_does": Msg("What approving it does", "Ce que fait l'approbation"),
    "where_from": Msg("Where it comes from", "D'où elle vient"),
    "proposal": Msg("Proposal", "Proposition"),
    "request_hash": Msg("Request hash", "Empreinte de la requête"),
    "requested_by": Msg("Requested by", "Demandée par"),
    "proposed": Msg("Proposed", "Proposée"),
    "ago": Msg("{span} ago", "il y a {span}"),
    "expires": Msg("Expires", "Expire"),
    "decision_that_asked": Msg("Decision that asked", "Décision qui a demandé"),
    "approved": Msg("Approved", "Approuvée"),
    "approved_by_at": Msg("by {who} at {at}", "par {who} le {at}"),
    "run": Msg("Run", "Exécution"),
    "run_is": Msg("The run is {status}.", "L'exécution est : {status}."),
    "only_approvers": Msg(
        "Only approvers answer proposals.", "Seuls les approbateurs répondent aux propositions."
    ),
    "proposal_expired": Msg(
        "This proposal expired: it can no longer be approved.",
        "Cette proposition a expiré : elle ne peut plus être approuvée.",
    ),
    "own_request": Msg(
        "You requested this run: separation of duties says another approver must approve it. "
        "Writ refuses your approval; you may still reject it.",
        "Vous avez demandé cette exécution : la séparation des tâches veut qu'un autre "
        "approbateur l'approuve. Writ refuse votre approbation ; vous pouvez encore la rejeter.",
    ),
    "own_approval": Msg(
        "You approved it: another approver must approve it too.",
        "Vous l'avez approuvée : un autre approbateur doit aussi l'approuver.",
    ),
    "approve_always": Msg(
        "Approve, and always allow this agent's {family} calls",
        "Approuver, et toujours autoriser les appels {family} de cet agent",
    ),
    "approve_once": Msg("Approve exactly this", "Approuver exactement ceci"),
    "reason_required": Msg("Reason (required)", "Motif (obligatoire)"),
    "reject": Msg("Reject", "Rejeter"),
    "what_to_change": Msg(
        "What the agent should change (required)", "Ce que l'agent doit changer (obligatoire)"
    ),
    "ask_revision": Msg("Ask for a revision", "Demander une révision"),
    "evidence": Msg("Evidence", "Pièces"),
    "host_command_no_run": Msg(
        "none: the host submitted this command itself",
        "aucune : l'hôte a soumis cette commande lui-même",
    ),
    "no_run_evidence": Msg(
        "A host's own command: no run of an agent, no evidence.",
        "Une commande propre à un hôte : pas d'exécution d'agent, pas de pièces.",
    ),
    "untrusted": Msg("untrusted", "non fiable"),
    # Outcomes and states (values the API gives, shown in words)
    "st_pending": Msg("pending", "en attente"),
    "st_executing": Msg("executing", "en cours"),
    "st_completed": Msg("completed", "terminée"),
    "st_rejected": Msg("rejected", "rejetée"),
    "st_expired": Msg("expired", "expirée"),
    "oc_succeeded": Msg("succeeded", "réussie"),
    "oc_needs_reconciliation": Msg("needs reconciliation", "à rapprocher"),
    "oc_revision_required": Msg("revision required", "révision demandée"),
    "oc_denied": Msg("denied", "refusée"),
    "oc_expired": Msg("expired", "expirée"),
    "oc_terminal_failure": Msg("terminal failure", "échec définitif"),
    "oc_pending": Msg("pending", "en attente"),
    # A decision and a review
    "decision_title": Msg("Decision: {tool}", "Décision : {tool}"),
    "decision_page": Msg("Decision {tool}", "Décision {tool}"),
    "allow_once": Msg("Allow once", "Autoriser une fois"),
    "allow_always": Msg(
        "Always allow (this agent, this family)", "Toujours autoriser (cet agent, cette famille)"
    ),
    "deny": Msg("Deny", "Refuser"),
    "tool": Msg("Tool", "Outil"),
    "first_argument": Msg("First argument", "Premier argument"),
    "why_it_asks": Msg("Why it asks", "Pourquoi elle demande"),
    "asked": Msg("Asked", "Demandée"),
    "reason": Msg("Reason", "Motif"),
    "review_title": Msg("Review {id}", "Relecture {id}"),
    "review_intro": Msg(
        "asks a person to review its work before it goes on.",
        "demande qu'une personne relise son travail avant de continuer.",
    ),
    "agent_of_run": Msg("The agent of run", "L'agent de l'exécution"),
    "what_it_asks": Msg("What it asks", "Ce qu'il demande"),
    "comment": Msg("Comment", "Commentaire"),
    "approve": Msg("Approve", "Approuver"),
    # Operators' MCP pages, sign-in refusals, a trail's composed rows (`_words.py`)
    **MORE,
    # Stable codes: a problem's title, a refusal's meaning, the sentences composed around
    # them (`_codes.py`)
    **{f"title:{code}": msg for code, msg in TITLES.items()},
    **{f"code:{code}": msg for code, msg in REASONS.items()},
    **{f"composed:{key}": msg for key, msg in COMPOSED.items()},
}

# The labels action contracts give their previews (`ActionContract.describe`) and the fixed
# words of a proposal's trail, in French. Text this table lacks is shown as it was written.
LABELS: Final[dict[str, str]] = {
    "Audience": "Destinataires",
    "Subject": "Objet",
    "Body": "Corps",
    "Participant": "Participant",
    "Product": "Produit",
    "Discount": "Remise",
    "Payment": "Paiement",
    "Payment method": "Moyen de paiement",
    "Amount to refund": "Montant à rembourser",
    "Destination": "Destination",
    "Current order total": "Total actuel de la commande",
    "Resulting order total": "Total de la commande après",
    "Currency": "Devise",
    "Customer": "Client",
    "Amount to charge": "Montant à débiter",
    "Description": "Description",
    "Customer record": "Fiche client",
    "Note": "Note",
    # A trail's steps, and the fixed words its rows say
    "Proposed": "Proposée",
    "Rejected": "Rejetée",
    "Approved": "Approuvée",
    "Revision asked": "Révision demandée",
    "Approval": "Approbation",
    "Expired": "Expirée",
    "Admitted": "Admise",
    "Receipt signed": "Reçu signé",
    "Decided": "Décidée",
    "Answered": "Répondue",
    "Attempt": "Tentative",
    "Attempt released": "Tentative libérée",
    "Reconciled": "Rapprochée",
    "Outcome": "Résultat",
    "the proposal": "la proposition",
    "one of the approvals it needs": "une des approbations qu'il lui faut",
    "nobody answered before it expired": "personne n'a répondu avant son expiration",
    "released": "libérée",
    "the record says so, and no journal entry proves it": (
        "l'enregistrement le dit, et aucune entrée de journal ne le prouve"
    ),
}

_SYMBOLS: Final = {"EUR": "€", "USD": "$US", "GBP": "£", "CHF": "CHF", "CAD": "$CA"}
_MONEY: Final = re.compile(r"(-?)([0-9][0-9,]*)\.([0-9]{2}) ([A-Z]{3})")
_NBSP, _NNBSP = "\u00a0", "\u202f"
_MONTHS_FR: Final = (
    "janv.", "févr.", "mars", "avr.", "mai", "juin",
    "juil.", "août", "sept.", "oct.", "nov.", "déc.",
)  # fmt: skip


def current() -> Locale:
    """The locale the page being rendered speaks."""
    return _current.get()


def here() -> str:
    """The console page being rendered (where the language switch comes back to)."""
    return _here.get()


@contextmanager
def rendering(locale: Locale, path: str = "/console/") -> Iterator[None]:
    """Render what runs inside in `locale`, as the page at `path`."""
    token, at = _current.set(locale), _here.set(path)
    try:
        yield
    finally:
        _current.reset(token)
        _here.reset(at)


def t(key: str, **fields: object) -> str:
    """The catalog's message `key` in the current locale, its fields filled."""
    text: str = getattr(CATALOG[key], _current.get())
    return text.format(**fields) if fields else text


def negotiate(cookie: str | None, accept_language: str | None) -> Locale:
    """The switch's choice if it names a known locale, else the best of `Accept-Language`
    (by q, then order) that Writ speaks, else English. Malformed parts are skipped."""
    if cookie in LOCALES:
        return cookie
    ranked: list[tuple[float, int, Locale]] = []
    for i, part in enumerate((accept_language or "")[:512].split(",")[:32]):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                continue
        base = tag.strip().lower().split("-")[0]
        if base in LOCALES and q > 0:
            ranked.append((-q, i, base))
    return min(ranked)[2] if ranked else "en"


def _group(whole: str, sep: str) -> str:
    digits = whole.replace(",", "")
    head = len(digits) % 3 or 3
    return sep.join([digits[:head]] + [digits[i : i + 3] for i in range(head, len(digits), 3)])


def amount(text: str) -> str:
    """An amount as `actions.base.money` writes it ("1,500.00 EUR"), in the current locale:
    French writes "1 500,00 €". Anything else is returned as it is."""
    found = _MONEY.fullmatch(text)
    if found is None or _current.get() == "en":
        return text
    sign, whole, cents, currency = found.groups()
    symbol = _SYMBOLS.get(currency, currency)
    return f"{sign}{_group(whole, _NNBSP)},{cents}{_NBSP}{symbol}"


def stamp(iso: str | None) -> str:
    """A time the API gave (ISO 8601) in the current locale: English shows it as given,
    French as "7 déc. 2026 à 14:05:09 (UTC)". What is not a time is returned as it is."""
    if not iso or _current.get() == "en":
        return "" if iso is None else iso
    try:
        at = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    return f"{at.day} {_MONTHS_FR[at.month - 1]} {at.year} à {at:%H:%M:%S} (UTC)"


def caption(text: str) -> str:
    """A preview's label in the current locale."""
    return text if _current.get() == "en" else LABELS.get(text, text)


def shown(text: str) -> str:
    """A preview's value in the current locale (amounts are written its way)."""
    return amount(text)


def title_of(code: str, locale: Locale) -> str:
    """A problem document's `title` for `code` in `locale` (the code in words when the catalog
    has no title for it)."""
    msg = CATALOG.get(f"title:{code}")
    return code.replace("_", " ").lower() if msg is None else str(getattr(msg, locale))


def said(code: str | None, text: str | None, locale: Locale | None = None) -> str:
    """A refusal's reason in `locale` (default: the page's). English: as it was recorded.
    French: the sentence Writ composed, in French with the same fields; else what its stable
    code means, from the catalog; else the text as it was recorded (free text: an approver's
    reason, a host's message, which nobody can translate)."""
    locale = locale or _current.get()
    msg = CATALOG.get(f"code:{code}") if code else None
    if locale == "en" or msg is None and not text:
        return text or (msg.en if msg is not None else "")
    return composed(text or "", locale) or (str(getattr(msg, locale)) if msg else text or "")
