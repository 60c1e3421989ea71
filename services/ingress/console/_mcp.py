"""The operators' MCP pages (`/console/mcp/...`): what a host's MCP server says of each tool,
and the form that classifies it, for a viewer with the role `operator` only (`_operators.py`).

Every page lists the server now (retrieval answers `writ.int.retrieval.mcp.list`, and the
listing is journaled), so what is shown is what the server serves. The server's description,
parameters and schemas are shown as what they are: an untrusted party's text, escaped, in a
box of their own. A tool that changed since it was classified shows a diff against what was
classified. The classify form carries the digest of the definition shown; on submit the
server is listed again first, and a tool listed differently since is refused (governance
refuses a digest that is not the latest listing's as well): a person binds only what they saw.
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any, Final, get_args

import msgspec
from litestar import Request, Response, get, post
from nats.aio.client import Client

from libs.deadline import timed_request
from schemas import subjects
from schemas.base import Digest, Family
from schemas.mcp import (
    CAPABILITY,
    ClassifyTool,
    ListedTool,
    ListServer,
    ListServers,
    RegisteredServers,
    ServerListing,
    ToolClassified,
)
from services.ingress.console._i18n import LANG_COOKIE, negotiate, rendering, t
from services.ingress.console._operators import OPERATOR_ROLE
from services.ingress.console._pages import csrf_field, h, layout, message_page
from services.ingress.console._session import ConsoleRefused, Sessions, Viewer
from services.ingress.console._web import Bad, Form, html_page

__all__ = ["McpBus", "mcp_handlers"]

_FAMILIES: Final = get_args(Family)


class ClassifyForm(Form, frozen=True):
    family: Family
    digest: Digest
    description: Annotated[str, msgspec.Meta(max_length=2000)] = ""


class McpBus:
    """Retrieval's listing and governance's classification, asked on the bus as ingress."""

    def __init__(self, nc: Client, *, timeout_s: float = 30.0) -> None:
        self._nc, self._timeout = nc, timeout_s

    async def _ask(self, subject: str, message: msgspec.Struct, answer: type[Any]) -> Any:
        try:
            reply = await timed_request(
                self._nc, subject, msgspec.json.encode(message), timeout=self._timeout
            )
        except Exception as exc:  # no responder, a timeout: the page says so, nothing is done
            raise Bad(
                503, t("mcp_not_available"), f"no answer on {subject} ({type(exc).__name__})"
            ) from None
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            raise Bad(400, t("refused"), reply.headers.get("Nats-Service-Error", "")[:500])
        return msgspec.json.decode(reply.data, type=answer)

    async def listing(self, tenant: str, server: str, tool: str | None = None) -> ServerListing:
        """The server listed now (journaled), with `tool` shown in full."""
        try:
            ask = msgspec.convert({"tenant": tenant, "server": server, "tool": tool}, ListServer)
        except msgspec.ValidationError:
            raise Bad(404, t("not_found"), t("mcp_no_such")) from None
        listing: ServerListing = await self._ask(subjects.MCP_LIST, ask, ServerListing)
        return listing

    async def servers(self, tenant: str) -> RegisteredServers:
        """The servers registered for `tenant` (retrieval alone reads the registrations)."""
        answer: RegisteredServers = await self._ask(
            subjects.MCP_SERVERS, ListServers(tenant=tenant), RegisteredServers
        )
        return answer

    async def classify(self, ask: ClassifyTool) -> ToolClassified:
        """Record a classification, bound to the digest the operator was shown."""
        answer: ToolClassified = await self._ask(subjects.MCP_CLASSIFY, ask, ToolClassified)
        return answer


def _definition(tool: ListedTool) -> list[str]:
    """A tool's definition as lines, for the diff (description, parameters, schemas)."""
    lines = ["description:", *(f"  {line}" for line in (tool.description or "-").splitlines())]
    lines.append("input schema:")
    lines += [
        f"  {line}" for line in json.dumps(tool.input_schema, indent=2, sort_keys=True).split("\n")
    ]
    lines.append(f"output schema: {json.dumps(tool.output_schema, sort_keys=True)}")
    return lines


def _parameters(tool: ListedTool) -> str:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    params = schema.get("properties", {})
    if not isinstance(params, dict) or not params:
        return f"<p>{t('mcp_no_parameters')}</p>"
    required = (
        set(schema.get("required", [])) if isinstance(schema.get("required"), list) else set()
    )
    rows = []
    for name, spec in params.items():
        spec = spec if isinstance(spec, dict) else {}
        rest = {k: v for k, v in spec.items() if k not in ("description", "title")}
        said = " ".join(str(spec[k]) for k in ("title", "description") if spec.get(k))
        rows.append(
            f'<tr><th scope="row"><code>{h(name)}</code></th>'
            f"<td>{t('yes') if name in required else t('no')}</td>"
            f'<td><code class="untrusted">{h(json.dumps(rest, sort_keys=True))}</code></td>'
            f'<td class="untrusted">{h(said) or "-"}</td></tr>'
        )
    return (
        f'<table class="parameters"><caption>{t("mcp_parameters")}</caption>'
        f'<thead><tr><th scope="col">{t("mcp_name")}</th><th scope="col">{t("mcp_required")}'
        f'</th><th scope="col">{t("mcp_schema")}</th><th scope="col">'
        f"{h(t('mcp_servers_words'))}</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _diff(was: ListedTool, now: ListedTool) -> str:
    lines = []
    for line in difflib.unified_diff(
        _definition(was), _definition(now), "classified", "listed now", lineterm="", n=2
    ):
        if line.startswith("+") and not line.startswith("+++"):
            lines.append(f"<ins>{h(line)}</ins>")
        elif line.startswith("-") and not line.startswith("---"):
            lines.append(f"<del>{h(line)}</del>")
        else:
            lines.append(h(line))
    return (
        f'<section aria-labelledby="changed"><h2 id="changed">{t("mcp_changed")}'
        f'</h2><p>{t("mcp_changed_note")}</p><pre class="untrusted" id="diff" tabindex="0">'
        + "\n".join(lines)
        + "</pre></section>"
    )


def tool_page(
    viewer: Viewer, server: str, tool: str, listing: ServerListing, *, answered: str = ""
) -> str:
    """One tool, as the server lists it now, and the form that classifies what is shown."""
    name = f"mcp:{server}/{tool}"
    parts = [f"<h1>{h(name)}</h1>"]
    if answered:
        parts.append(f'<p class="answered" id="answered" role="status">{h(answered)}</p>')
    if not listing.ok:
        parts.append(f'<p class="message" id="message">{h(listing.error)}</p>')
        return layout(name, "".join(parts), viewer)
    shown, classified = listing.shown, listing.classified
    status = next((t for t in listing.tools if t.name == tool), None)
    if shown is None:
        parts.append(f'<p id="state">{t("mcp_not_listed")}</p>')
    else:
        state = status.state if status else "unclassified"
        family = t("mcp_as_family", family=status.family) if status and status.family else ""
        exposed = t("mcp_exposed") if tool in listing.exposed else t("mcp_not_exposed")
        parts.append(
            f'<p id="state">{h(state)}{h(family)}, {h(exposed)} · {t("mcp_digest_of")} '
            f'<code id="digest">{h(shown.digest)}</code></p>'
        )
        parts += [
            f'<p class="flag">{h(t("mcp_flagged", flag=flag))}</p>'
            for flag in (status.flags if status else [])
        ]
        hints = ", ".join(f"{k}={v}" for k, v in sorted(shown.hints.items()) if v is not None)
        parts.append(
            f'<section aria-labelledby="served"><h2 id="served">{t("mcp_what_server_says")}</h2>'
            f"<p>{h(t('mcp_server_text_note'))}</p>"
            f"<h3>{t('mcp_description')}</h3>"
            '<pre class="untrusted" id="description" tabindex="0">'
            f"{h(shown.description or '-')}</pre>{_parameters(shown)}"
            f"<h3>{h(t('mcp_input_schema'))}</h3>"
            '<pre class="untrusted" id="input-schema" tabindex="0">'
            f"{h(json.dumps(shown.input_schema, indent=2, sort_keys=True))}</pre>"
            f'<h3>{t("mcp_hints")}</h3><p class="untrusted">{h(hints or "-")}</p></section>'
        )
    if classified is not None:
        parts.append(
            '<section aria-labelledby="classification">'
            f'<h2 id="classification">{t("mcp_classified")}</h2><p id="classified">'
            + h(
                t(
                    "mcp_classified_by",
                    family=classified.family,
                    who=classified.classified_by or "?",
                )
            )
            + f" · {t('mcp_digest_of')} <code>{h(classified.digest)}</code></p>"
            + "<p>"
            + h(t("mcp_operator_description", words=classified.operator_description or "-"))
            + "</p>"
            "</section>"
        )
        if shown is not None and classified.digest != shown.digest:
            was = ListedTool(
                name=tool,
                description=classified.description,
                input_schema=classified.input_schema,
                output_schema=classified.output_schema,
                digest=classified.digest,
            )
            parts.append(_diff(was, shown))
    if shown is not None:
        options = "".join(
            f'<option value="{h(f)}"{" selected" if classified and classified.family == f else ""}'
            f">{h(f)}</option>"
            for f in _FAMILIES
        )
        words = classified.operator_description if classified else ""
        parts.append(
            f'<section aria-labelledby="classify"><h2 id="classify">{t("mcp_classify")}</h2>'
            f'<form method="post" action="/console/mcp/{h(server)}/{h(tool)}" id="classify-form">'
            f'{csrf_field(viewer)}<input type="hidden" name="digest" value="{h(shown.digest)}">'
            f'<p><label for="family">{t("mcp_family")}</label> '
            f'<select id="family" name="family">{options}'
            f'</select></p><p><label for="words">{t("mcp_words")}</label><br>'
            f'<textarea id="words" name="description" maxlength="2000" rows="3" cols="60">'
            f"{h(words)}</textarea></p>"
            f'<p><button type="submit">{t("mcp_classify_button")}</button></p></form></section>'
        )
    parts.append(
        f'<p><a href="/console/mcp/{h(server)}">{h(t("mcp_all_tools", server=server))}</a></p>'
    )
    return layout(name, "".join(parts), viewer)


def server_page(viewer: Viewer, server: str, listing: ServerListing) -> str:
    """A server's tools as listed now, each with where it stands."""
    parts = [f"<h1>{h(t('mcp_server_title', server=server))}</h1>"]
    if not listing.ok:
        parts.append(f'<p class="message" id="message">{h(listing.error)}</p>')
        return layout(server, "".join(parts), viewer)
    rows = []
    for tool in listing.tools:
        family = tool.family or "-"
        exposed = t("yes") if tool.name in listing.exposed else t("no")
        flags = "; ".join(tool.flags) or "-"
        rows.append(
            f'<tr><th scope="row"><a href="/console/mcp/{h(server)}/{h(tool.name)}">'
            f"{h(tool.name)}</a></th><td>{h(tool.state)}</td><td>{h(family)}</td>"
            f"<td>{exposed}</td><td><code>{h(tool.digest[:12])}</code></td><td>{h(flags)}</td>"
            "</tr>"
        )
    parts.append(
        "<p>"
        + t("mcp_listing", digest=f"<code>{h(listing.digest[:12])}</code>")
        + f'</p><table class="tools"><caption>{t("mcp_tools_caption")}</caption><thead><tr>'
        + "".join(
            f'<th scope="col">{t(k)}</th>'
            for k in ("mcp_tool", "mcp_state", "mcp_family", "mcp_exposed_col", "mcp_digest")
        )
        + f'<th scope="col">{t("mcp_flags")}</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return layout(server, "".join(parts), viewer)


def index_page(viewer: Viewer, registered: RegisteredServers) -> str:
    """The tenant's registered MCP servers, to choose one from."""
    if registered.error:  # the registration file is refused: say so, not "none registered"
        body = f'<p class="message" id="message">{h(registered.error)}</p>'
    elif not registered.servers:
        body = f'<p class="message" id="message">{t("mcp_none_registered")}</p>'
    else:
        rows = "".join(
            f'<tr><th scope="row"><a href="/console/mcp/{h(server.name)}">{h(server.name)}</a>'
            f"</th><td>{h(server.transport)}</td>"
            f"<td>{h(', '.join(server.exposed)) or '-'}</td></tr>"
            for server in registered.servers
        )
        body = (
            f"<p>{h(t('mcp_index_intro'))}</p>"
            f'<table class="servers"><caption>{h(t("mcp_servers_caption"))}</caption>'
            f'<thead><tr><th scope="col">{h(t("mcp_server_field"))}</th>'
            f'<th scope="col">{h(t("mcp_transport"))}</th>'
            f'<th scope="col">{h(t("mcp_exposed_column"))}</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>"
        )
    return layout(t("mcp_servers"), f"<h1>{t('mcp_servers')}</h1>{body}", viewer)


def mcp_handlers(sessions: Sessions, bus: McpBus) -> list[Any]:
    """The operators' MCP routes, for the console's router."""

    async def _operator(request: Request[Any, Any, Any]) -> Viewer:
        try:
            viewer = await sessions.viewer(request)
        except ConsoleRefused as exc:
            raise Bad(
                exc.status,
                t("not_signed_in") if exc.status == 401 else t("not_allowed"),
                t("operator_sign_in_hint", reason=exc.reason),
            ) from exc
        if OPERATOR_ROLE not in viewer.roles:
            raise Bad(403, t("not_allowed"), t("operators_only"))
        return viewer

    async def _guarded(request: Request[Any, Any, Any], render: Any) -> Response[str]:
        viewer: Viewer | None = None
        locale = negotiate(request.cookies.get(LANG_COOKIE), request.headers.get("accept-language"))
        with rendering(locale, request.url.path):  # in the console's languages, as every page
            try:
                viewer = await _operator(request)
                return await render(viewer)
            except Bad as exc:
                return html_page(message_page(exc.title, exc.text, viewer), exc.status)

    @get("/mcp", include_in_schema=False)
    async def mcp_index(request: Request[Any, Any, Any]) -> Response[str]:
        """The tenant's registered servers, to choose one from."""

        async def render(viewer: Viewer) -> Response[str]:
            return html_page(index_page(viewer, await bus.servers(viewer.tenant)))

        return await _guarded(request, render)

    @get("/mcp/{server:str}", include_in_schema=False)
    async def mcp_server(request: Request[Any, Any, Any], server: str) -> Response[str]:
        """A server's tools, listed now."""

        async def render(viewer: Viewer) -> Response[str]:
            listing = await bus.listing(viewer.tenant, server)
            return html_page(server_page(viewer, server, listing))

        return await _guarded(request, render)

    @get("/mcp/{server:str}/{tool:str}", include_in_schema=False)
    async def mcp_tool(request: Request[Any, Any, Any], server: str, tool: str) -> Response[str]:
        """One tool in full, with its diff and the classify form."""

        async def render(viewer: Viewer) -> Response[str]:
            listing = await bus.listing(viewer.tenant, server, tool)
            return html_page(tool_page(viewer, server, tool, listing))

        return await _guarded(request, render)

    @post("/mcp/{server:str}/{tool:str}", include_in_schema=False, status_code=200)
    async def mcp_classify(
        request: Request[Any, Any, Any], server: str, tool: str
    ) -> Response[str]:
        """Classify the definition shown, if the server still lists exactly it."""

        async def render(viewer: Viewer) -> Response[str]:
            raw = dict(await request.form())
            sent = raw.get("csrf")
            if not isinstance(sent, str) or not viewer.csrf_ok(sent):
                raise Bad(403, t("refused"), t("mcp_csrf"))
            try:
                form = msgspec.convert(raw, ClassifyForm, strict=False)
            except msgspec.ValidationError as exc:
                raise Bad(400, t("mcp_invalid"), t("mcp_nothing_classified", why=exc)) from exc
            if CAPABILITY.fullmatch(f"mcp:{server}/{tool}") is None:
                raise Bad(404, t("not_found"), t("mcp_no_such"))
            # Listed again now: the digest bound is the one the server serves, or nothing is.
            listing = await bus.listing(viewer.tenant, server, tool)
            if listing.shown is None or listing.shown.digest != form.digest:
                said = t("mcp_digest_changed")
                return html_page(tool_page(viewer, server, tool, listing, answered=said), 409)
            answer = await bus.classify(
                ClassifyTool(
                    tenant=viewer.tenant,
                    server=server,
                    tool=tool,
                    family=form.family,
                    classified_by=viewer.principal,
                    digest=form.digest,
                    description=form.description,
                )
            )
            listing = await bus.listing(viewer.tenant, server, tool)
            said = answer.message if answer.ok else t("mcp_refused_said", why=answer.message)
            page = tool_page(viewer, server, tool, listing, answered=said)
            return html_page(page, 200 if answer.ok else 409)

        return await _guarded(request, render)

    return [mcp_index, mcp_server, mcp_tool, mcp_classify]
