"""The console's words for operators' MCP pages, sign-in refusals and a trail's composed rows,
in English and French: part of the one catalog (`_i18n.CATALOG`), kept apart to keep modules
short. `Msg` is the catalog's message type."""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["MORE", "Msg"]


class Msg(NamedTuple):
    """One message in each language (`{name}` fields are filled by `t`)."""

    en: str
    fr: str


MORE: Final[dict[str, Msg]] = {
    # Why a sign-in (or a session) is refused
    "refused_operator_link": Msg(
        "an operator signs in with a link of `writ console --operator`",
        "un opérateur se connecte avec un lien de `writ console --operator`",
    ),
    "refused_no_operator_key": Msg(
        "this console has no operators' key: nobody signs in as an operator",
        "cette console n'a pas de clé d'opérateurs : personne ne s'y connecte comme opérateur",
    ),
    "refused_operator_token": Msg("{why}", "lien d'opérateur refusé : {why}"),
    "refused_token": Msg("{code}: {why}", "jeton refusé ({code}) : {why}"),
    "refused_operator_role": Msg(
        "the role `operator` is Writ's to give (`writ console --operator`): a host's token "
        "cannot claim it",
        "seul Writ donne le rôle `operator` (`writ console --operator`) : le jeton d'un hôte ne "
        "peut pas s'en réclamer",
    ),
    "refused_no_role": Msg(
        "this console is for approvers and auditors: the token has neither role",
        "cette console est réservée aux approbateurs et aux auditeurs : le jeton n'a aucun de "
        "ces rôles",
    ),
    "refused_no_iat": Msg(
        "a sign-in link's token must say when it was issued (iat)",
        "le jeton d'un lien de connexion doit dire quand il a été émis (iat)",
    ),
    "refused_link_expired": Msg(
        "this sign-in link expired {minutes} minutes after it was made; ask for a new one",
        "ce lien de connexion a expiré {minutes} minutes après sa création ; demandez-en un "
        "nouveau",
    ),
    "refused_link_used": Msg(
        "this sign-in link was used already; ask for a new one",
        "ce lien de connexion a déjà servi ; demandez-en un nouveau",
    ),
    "refused_not_signed_in": Msg("not signed in", "vous n'êtes pas connecté"),
    "refused_session_ended": Msg(
        "the session ended; sign in again", "la session est terminée ; reconnectez-vous"
    ),
    "refused_session_token": Msg(
        "the session ended with its token; sign in again",
        "la session a pris fin avec son jeton ; reconnectez-vous",
    ),
    "operator_sign_in_hint": Msg(
        "{reason}. An operator signs in with a link of `writ console --operator`.",
        "{reason}. Un opérateur se connecte avec un lien de `writ console --operator`.",
    ),
    "operators_only": Msg(
        "these pages are for operators: an identity only Writ gives (`writ console "
        "--operator`), which no host's token carries",
        "ces pages sont réservées aux opérateurs : une identité que seul Writ donne (`writ "
        "console --operator`), qu'aucun jeton d'hôte ne porte",
    ),
    "operator_mcp_only": Msg(
        "an operator's session opens the MCP pages only",
        "une session d'opérateur n'ouvre que les pages MCP",
    ),
    # A trail's composed rows
    "trail_proposed": Msg("{agent} proposed {action}", "{agent} a proposé {action}"),
    "trail_refused_at_once": Msg("; refused at once: {reason}", " ; refusée d'emblée : {reason}"),
    "trail_line": Msg(
        "line {line} of decide, policy {policy}", "ligne {line} de decide, politique {policy}"
    ),
    "trail_allowed": Msg(
        "allowed by line {line}, policy {policy}",
        "autorisée par la ligne {line}, politique {policy}",
    ),
    "trail_receipt_signed": Msg(
        "approval receipt signed with key {kid}", "reçu d'approbation signé avec la clé {kid}"
    ),
    "trail_decided": Msg(
        "{verdict} — line {line} of decide, policy {policy}: {reason}",
        "{verdict} — ligne {line} de decide, politique {policy} : {reason}",
    ),
    "trail_sent": Msg(
        "sent to {connector} (lease {lease})", "envoyée à {connector} (bail {lease})"
    ),
    "trail_receipt": Msg(", receipt {receipt}", ", reçu {receipt}"),
    "trail_approved_by": Msg("approved by {who}", "approuvée par {who}"),
    "trail_record_approved": Msg(
        "the record says approved by {record}, the journal {journal}",
        "l'enregistrement dit approuvée par {record}, le journal {journal}",
    ),
    "trail_record_requested": Msg(
        "the record says requested by {record}, the journal {journal}",
        "l'enregistrement dit demandée par {record}, le journal {journal}",
    ),
    "trail_unsealed": Msg("{service} (unsealed)", "{service} (non scellée)"),
    # The operators' MCP pages
    "mcp_servers": Msg("MCP servers", "Serveurs MCP"),
    "mcp_index_intro": Msg(
        "Choose a server: it is listed now, and each of its tools shown with where it stands.",
        "Choisissez un serveur : il est listé maintenant, et chacun de ses outils est montré "
        "avec son état.",
    ),
    "mcp_none_registered": Msg(
        "No MCP server is registered for your tenant. An operator registers one with writ mcp add.",
        "Aucun serveur MCP n'est enregistré pour votre tenant. Un opérateur en enregistre un "
        "avec writ mcp add.",
    ),
    "mcp_servers_caption": Msg(
        "MCP servers registered for your tenant", "Serveurs MCP enregistrés pour votre tenant"
    ),
    "mcp_server_field": Msg("Server", "Serveur"),
    "mcp_transport": Msg("Transport", "Transport"),
    "mcp_exposed_column": Msg("Exposed to agents", "Exposés aux agents"),
    "mcp_server_title": Msg("MCP server {server}", "Serveur MCP {server}"),
    "mcp_listing": Msg(
        "Listing {digest}, recorded in the journal.",
        "Liste {digest}, enregistrée dans le journal.",
    ),
    "mcp_tools_caption": Msg(
        "Tools the server lists now", "Outils que le serveur liste maintenant"
    ),
    "mcp_tool": Msg("Tool", "Outil"),
    "mcp_state": Msg("State", "État"),
    "mcp_family": Msg("Family", "Famille"),
    "mcp_exposed_col": Msg("Exposed", "Exposé"),
    "mcp_digest": Msg("Digest", "Empreinte"),
    "mcp_flags": Msg("Flags", "Signalements"),
    "yes": Msg("yes", "oui"),
    "no": Msg("no", "non"),
    "mcp_not_listed": Msg(
        "The server does not list it now: it is never called.",
        "Le serveur ne le liste plus : il n'est jamais appelé.",
    ),
    "mcp_exposed": Msg("exposed", "exposé"),
    "mcp_not_exposed": Msg("not exposed", "non exposé"),
    "mcp_as_family": Msg(" as {family}", " comme {family}"),
    "mcp_digest_of": Msg("digest", "empreinte"),
    "mcp_flagged": Msg("Flagged: {flag}", "Signalé : {flag}"),
    "mcp_what_server_says": Msg("What the server says", "Ce que dit le serveur"),
    "mcp_server_text_note": Msg(
        "Everything in this section is the server's text: data from an untrusted party, shown "
        "as text. It decides nothing and never reaches a model's instructions.",
        "Tout ce qui suit est le texte du serveur : des données d'une partie non fiable, "
        "montrées comme du texte. Elles ne décident de rien et n'atteignent jamais les "
        "instructions d'un modèle.",
    ),
    "mcp_description": Msg("Description", "Description"),
    "mcp_input_schema": Msg("Input schema", "Schéma d'entrée"),
    "mcp_hints": Msg("Annotations (hints)", "Annotations (indications)"),
    "mcp_classified": Msg("Classified", "Classé"),
    "mcp_classified_by": Msg("{family} by {who}", "{family} par {who}"),
    "mcp_operator_description": Msg(
        "Operator's description: {words}", "Description de l'opérateur : {words}"
    ),
    "mcp_classify": Msg("Classify what is shown", "Classer ce qui est montré"),
    "mcp_words": Msg(
        "Your description for the model (the only words its instructions carry about this tool)",
        "Votre description pour le modèle (les seuls mots que ses instructions portent sur cet "
        "outil)",
    ),
    "mcp_classify_button": Msg("Classify this definition", "Classer cette définition"),
    "mcp_all_tools": Msg("All tools of {server}", "Tous les outils de {server}"),
    "mcp_no_parameters": Msg("No parameters.", "Aucun paramètre."),
    "mcp_parameters": Msg(
        "Parameters, as the server defines them", "Paramètres, tels que le serveur les définit"
    ),
    "mcp_name": Msg("Name", "Nom"),
    "mcp_required": Msg("Required", "Requis"),
    "mcp_schema": Msg("Schema", "Schéma"),
    "mcp_servers_words": Msg("Server's words", "Mots du serveur"),
    "mcp_changed": Msg("Changed since it was classified", "Modifié depuis son classement"),
    "mcp_changed_note": Msg(
        "Lines marked − were classified; lines marked + are what the server lists now.",
        "Les lignes marquées − ont été classées ; les lignes marquées + sont ce que le "
        "serveur liste maintenant.",
    ),
    "mcp_not_available": Msg("Not available", "Indisponible"),
    "mcp_no_such": Msg(
        "no MCP server or tool of your tenant by this name",
        "aucun serveur ni outil MCP de votre tenant ne porte ce nom",
    ),
    "mcp_invalid": Msg("Invalid answer", "Réponse invalide"),
    "mcp_nothing_classified": Msg("nothing was classified: {why}", "rien n'a été classé : {why}"),
    "mcp_refused_said": Msg("Refused: {why}", "Refusé : {why}"),
    "mcp_csrf": Msg(
        "this form's CSRF token is missing or wrong: nothing was classified. Reload the page.",
        "le jeton CSRF de ce formulaire manque ou est faux : rien n'a été classé. Rechargez "
        "la page.",
    ),
    "mcp_digest_changed": Msg(
        "Refused: the server lists this tool differently from what you were shown (its digest "
        "changed), so nothing was classified. Read it again below.",
        "Refusé : le serveur liste cet outil autrement que ce qui vous a été montré (son "
        "empreinte a changé), donc rien n'a été classé. Relisez-le ci-dessous.",
    ),
}
