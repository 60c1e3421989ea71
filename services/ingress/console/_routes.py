"""The console's routes (`/console/...`): pages and forms over the HTTP API, nothing else."""

from __future__ import annotations

import inspect
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final
from urllib.parse import quote

import anyio
import msgspec
from litestar import Request, Response, Router, get, post
from litestar.datastructures import Cookie
from litestar.params import FromPath, QueryParameter

from actions import ACTIONS
from schemas.base import ID_PATTERN
from services.ingress.console import _asks as asks
from services.ingress.console import _pages as pages
from services.ingress.console import _run_pages as run_pages
from services.ingress.console._client import ApiAnswer, ApiClient
from services.ingress.console._i18n import LANG_COOKIE, LOCALES, Locale, negotiate, rendering, t
from services.ingress.console._i18n import said as reason_said
from services.ingress.console._inbox import inbox_items, inbox_query
from services.ingress.console._mcp import McpBus, mcp_handlers
from services.ingress.console._operators import OPERATOR_ROLE
from services.ingress.console._session import COOKIE, ConsoleRefused, Sessions, Viewer
from services.ingress.console._spend import spend_page
from services.ingress.console._web import (
    CSP,
    HEADERS,
    ApproveForm,
    Bad,
    DecideForm,
    Form,
    RejectForm,
    ReviewForm,
    html_page,
)
from services.ingress.logic import APPROVER_ROLE, AUDITOR_ROLE, unstorable_parameter

__all__ = ["CSP", "HEADERS", "console_router"]

_STATIC: Final = Path(__file__).parent / "static"
_TYPES: Final = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
_MAX_TOKEN: Final = 8192
_BACK: Final = re.compile(r"/console/[A-Za-z0-9/_.~-]{0,300}")


def _locale(request: Request[Any, Any, Any]) -> Locale:
    """The viewer's language: the switch's cookie, else the browser's Accept-Language."""
    return negotiate(request.cookies.get(LANG_COOKIE), request.headers.get("accept-language"))


def console_router(sessions: Sessions, client: ApiClient, mcp: McpBus | None = None) -> Router:
    """`/console`: the approval console over `client` (the API as each viewer), and the
    operators' MCP pages over `mcp` (none: not served)."""
    static = {name: (_STATIC / name).read_bytes() for name in _TYPES}

    async def _viewer(request: Request[Any, Any, Any]) -> Viewer:
        try:
            viewer = await sessions.viewer(request)
        except ConsoleRefused as exc:
            raise Bad(
                exc.status,
                t("not_signed_in") if exc.status == 401 else t("not_allowed"),
                t("sign_in_hint", reason=exc.reason),
            ) from exc
        # An operator's identity is Writ's, not a host's: it has no API access.
        if OPERATOR_ROLE in viewer.roles and request.url.path != "/console/sign-out":
            raise Bad(403, t("not_allowed"), t("operator_mcp_only"))
        return viewer

    async def _form(request: Request[Any, Any, Any], viewer: Viewer, kind: type[Any]) -> Any:
        raw = dict(await request.form())
        sent = raw.get("csrf")
        if not isinstance(sent, str) or not viewer.csrf_ok(sent):
            raise Bad(403, t("refused"), t("csrf_refused"))
        try:
            return msgspec.convert(raw, kind, strict=False)
        except msgspec.ValidationError as exc:
            raise Bad(400, t("invalid_answer"), t("nothing_done", problem=exc)) from exc

    def _page(handler: Any) -> Any:
        """Render refusals as pages (the wrapped handler returns a page's HTML)."""

        async def wrapped(request: Request[Any, Any, Any], **kw: Any) -> Response[str]:
            viewer: Viewer | None = None
            with rendering(_locale(request), request.url.path):
                try:
                    viewer = await _viewer(request)
                    return await handler(request, viewer, **kw)
                except Bad as exc:
                    return html_page(pages.message_page(exc.title, exc.text, viewer), exc.status)

        # Litestar reads the route's parameters from the signature: the handler's, without
        # the viewer this wrapper supplies.
        signature = inspect.signature(handler)
        wrapped.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[v for k, v in signature.parameters.items() if k != "viewer"]
        )
        wrapped.__annotations__ = {
            k: v for k, v in handler.__annotations__.items() if k != "viewer"
        }
        wrapped.__name__, wrapped.__doc__ = handler.__name__, handler.__doc__
        return wrapped

    def _not_found(answer: ApiAnswer, what: str) -> Bad:
        # A malformed id gets what an unknown or another tenant's one gets: not found.
        if answer.status in (400, 404):
            return Bad(404, t("not_found"), t("no_such", what=what))
        return Bad(answer.status, t("refused"), answer.problem)

    @get("/", include_in_schema=False)
    @_page
    async def inbox(request: Request[Any, Any, Any], viewer: Viewer) -> Response[str]:
        """Everything waiting for the viewer."""
        f = inbox_query(request)
        items, page = await inbox_items(client, viewer, f)
        return html_page(
            pages.inbox_page(
                viewer,
                items,
                filters=msgspec.structs.asdict(f),
                agents=sorted(page["agents"]),
                actions=sorted(ACTIONS),
                counts=page["counts"],
                next_cursor=page["next"],
                more_decisions=page["more_decisions"],
                problems=page["problems"],
                now=datetime.now(UTC),
            )
        )

    @get("/inbox/rows", include_in_schema=False)
    @_page
    async def inbox_rows(request: Request[Any, Any, Any], viewer: Viewer) -> Response[str]:
        """The inbox's rows, for the page to poll."""
        items, page = await inbox_items(client, viewer, inbox_query(request))
        return html_page(pages.inbox_rows(items, datetime.now(UTC), page["counts"]))

    async def _proposal(viewer: Viewer, proposal_id: str) -> dict[str, Any]:
        got = await client.get(viewer, f"/proposals/{proposal_id}")
        if not got.ok:
            raise _not_found(got, "proposal")
        return got.body

    async def _run_of(viewer: Viewer, p: dict[str, Any]) -> dict[str, Any] | None:
        """The run that proposed it (None: a host's own command, which no agent ran)."""
        got = await client.get(viewer, f"/runs/{p['run_id']}")
        return got.body if got.ok else None

    async def _trail(viewer: Viewer, proposal_id: str) -> dict[str, Any] | None:
        """The proposal's trail, checked against the journals (None: it could not be read)."""
        got = await client.get(viewer, f"/proposals/{proposal_id}/trail")
        return got.body if got.ok else None

    async def _options(viewer: Viewer, p: dict[str, Any]) -> list[str]:
        """The answers the proposal's pending decision offers ("always" only where no
        contract forbids a standing grant); none once it is answered."""
        if p["state"] != "pending" or APPROVER_ROLE not in viewer.roles:
            return []
        d = await _decision(viewer, p.get("decision_id") or "")
        return list(d["options"]) if d is not None else ["once", "deny"]

    @get("/proposals/{proposal_id:str}", include_in_schema=False)
    @_page
    async def proposal(
        request: Request[Any, Any, Any], viewer: Viewer, proposal_id: str
    ) -> Response[str]:
        """One proposal, in words."""
        p = await _proposal(viewer, proposal_id)
        return html_page(
            pages.proposal_page(
                viewer,
                p,
                now=datetime.now(UTC),
                run=await _run_of(viewer, p),
                options=await _options(viewer, p),
                trail=await _trail(viewer, proposal_id),
            )
        )

    @get("/proposals/{proposal_id:str}/outcome", include_in_schema=False)
    @_page
    async def outcome(
        request: Request[Any, Any, Any], viewer: Viewer, proposal_id: str
    ) -> Response[str]:
        """Where the proposal stands, for the page to follow."""
        p = await _proposal(viewer, proposal_id)
        return html_page(pages.outcome_box(p, datetime.now(UTC)))

    async def _answer_proposal(
        request: Request[Any, Any, Any], viewer: Viewer, proposal_id: str, answer: str
    ) -> Response[str]:
        if answer == "approve":
            # "always" only where the decision offers it: governance refuses it otherwise.
            body: dict[str, Any] = {"grant": (await _form(request, viewer, ApproveForm)).grant}
        else:
            body = {"reason": (await _form(request, viewer, RejectForm)).reason}
        # The proposal's id and, to reject, a reason: nothing that was approved is sent
        # again. A fresh key per click: admission's one claim says which click executes.
        got = await client.post(
            viewer, f"/proposals/{proposal_id}/{answer}", body, key=str(uuid.uuid4())
        )
        if not got.ok:
            if (
                got.status in (400, 404)
                and isinstance(got.body, dict)
                and (got.body.get("code") in ("NOT_FOUND", None))
            ):
                raise _not_found(got, "proposal")
            said = t("nothing_done_dash", problem=got.problem)
        elif got.body.get("code") == "REVISION_ASKED":
            said = t("revision_sent")
        elif got.body["status"] == "not_approvable":
            code = got.body.get("code")
            said = t(f"not_{answer}d", code=code, why=reason_said(code, got.body.get("reason")))
        else:
            said = t("answered_" + got.body["status"])
        p = await _proposal(viewer, proposal_id)
        return html_page(
            pages.proposal_page(
                viewer,
                p,
                now=datetime.now(UTC),
                answered=said,
                run=await _run_of(viewer, p),
                options=await _options(viewer, p),
                trail=await _trail(viewer, proposal_id),
            )
        )

    @post("/proposals/{proposal_id:str}/approve", include_in_schema=False, status_code=200)
    @_page
    async def approve(
        request: Request[Any, Any, Any], viewer: Viewer, proposal_id: str
    ) -> Response[str]:
        """Approve exactly the frozen proposal, by its id."""
        return await _answer_proposal(request, viewer, proposal_id, "approve")

    @post("/proposals/{proposal_id:str}/revise", include_in_schema=False, status_code=200)
    @_page
    async def revise(
        request: Request[Any, Any, Any], viewer: Viewer, proposal_id: str
    ) -> Response[str]:
        """Send a proposal back for a revision, with what to change."""
        return await _answer_proposal(request, viewer, proposal_id, "revise")

    @post("/proposals/{proposal_id:str}/reject", include_in_schema=False, status_code=200)
    @_page
    async def reject(
        request: Request[Any, Any, Any], viewer: Viewer, proposal_id: str
    ) -> Response[str]:
        """Reject a proposal, with a reason."""
        return await _answer_proposal(request, viewer, proposal_id, "reject")

    async def _decision(viewer: Viewer, pending_id: str) -> dict[str, Any] | None:
        # By its id: found however many decisions wait.
        if not re.fullmatch(ID_PATTERN, pending_id):
            return None
        got = await client.get(viewer, "/pending-decisions", pending_id=pending_id, limit="1")
        if not got.ok:
            raise Bad(got.status, t("refused"), got.problem)
        return next((d for d in got.body["decisions"] if d["pending_id"] == pending_id), None)

    async def _proposal_asked_by(viewer: Viewer, pending_id: str) -> str | None:
        """The pending proposal a decision is about: it is answered there, beside its
        preview (one door per effect)."""
        # By the decision's id: found however many proposals wait.
        got = await client.get(
            viewer, "/proposals", state="pending", decision_id=pending_id, limit="1"
        )
        if not got.ok:
            raise Bad(got.status, t("refused"), got.problem)
        return next(
            (
                p["proposal_id"]
                for p in got.body["proposals"]
                if (p.get("decision_id") or "") == pending_id
            ),
            None,
        )

    @get("/decisions/{pending_id:str}", include_in_schema=False)
    @_page
    async def decision(
        request: Request[Any, Any, Any], viewer: Viewer, pending_id: str
    ) -> Response[str]:
        """A pending decision and the answers its case allows; one about a proposal is its
        proposal's page, where the frozen preview is shown."""
        d = await _decision(viewer, pending_id)
        if d is None:
            raise Bad(404, t("not_found"), t("no_decision"))
        if (proposal_id := await _proposal_asked_by(viewer, pending_id)) is not None:
            return Response(
                "",
                status_code=303,
                headers={"Location": f"/console/proposals/{proposal_id}"},
                media_type="text/html",
            )
        if d.get("about_proposal"):
            # Its proposal is no longer waiting (it expired a moment ago): nothing to answer.
            raise Bad(410, t("gone"), t("proposal_gone"))
        return html_page(asks.decision_page(viewer, d, now=datetime.now(UTC)))

    @post("/decisions/{pending_id:str}", include_in_schema=False, status_code=200)
    @_page
    async def decide(
        request: Request[Any, Any, Any], viewer: Viewer, pending_id: str
    ) -> Response[str]:
        """Answer a pending decision."""
        form = await _form(request, viewer, DecideForm)
        d = await _decision(viewer, pending_id)
        if d is None:
            raise Bad(404, t("not_found"), t("no_decision"))
        got = await client.post(
            viewer,
            "/pending-decisions/decide",
            {"pending_id": pending_id, "answer": form.answer, "reason": form.reason},
            key=str(uuid.uuid4()),
        )
        if got.ok:
            said = (
                t("answered_as", answer=t("answer_" + form.answer))
                if got.body.get("accepted")
                else t(
                    "not_taken",
                    code=got.body.get("code"),
                    why=reason_said(got.body.get("code"), got.body.get("message")),
                )
            )
        else:
            said = t("nothing_done_dash", problem=got.problem)
        return html_page(asks.decision_page(viewer, d, now=datetime.now(UTC), answered=said))

    @get("/reviews/{pending_id:str}", include_in_schema=False)
    @_page
    async def review(
        request: Request[Any, Any, Any], viewer: Viewer, pending_id: str
    ) -> Response[str]:
        """A review the run's agent asked for; an id no run waits on is not found, with no
        form to answer it."""
        if not re.fullmatch(ID_PATTERN, pending_id):
            raise Bad(404, t("not_found"), t("no_review"))
        # By its id: found however many reviews wait.
        got = await client.get(viewer, "/reviews", pending_id=pending_id, limit="1")
        if not got.ok:
            raise Bad(got.status, t("refused"), got.problem)
        waiting = {r["pending_id"]: r for r in got.body["reviews"]}
        if pending_id not in waiting:
            raise Bad(404, t("not_found"), t("no_review"))
        return html_page(
            asks.review_page(viewer, pending_id, prompt=waiting[pending_id].get("prompt", ""))
        )

    @post("/reviews/{pending_id:str}", include_in_schema=False, status_code=200)
    @_page
    async def answer_review(
        request: Request[Any, Any, Any], viewer: Viewer, pending_id: str
    ) -> Response[str]:
        """Approve or reject a review, with a comment."""
        form = await _form(request, viewer, ReviewForm)
        got = await client.post(
            viewer,
            f"/reviews/{pending_id}",
            {"answer": form.answer, "comment": form.comment},
            key=str(uuid.uuid4()),
        )
        if got.ok:
            said = (
                t("answered_as", answer=t("answer_" + form.answer))
                if got.body.get("accepted")
                else t(
                    "not_taken",
                    code=got.body.get("code"),
                    why=reason_said(got.body.get("code"), got.body.get("message")),
                )
            )
        else:
            said = t("nothing_done_dash", problem=got.problem)
        return html_page(asks.review_page(viewer, pending_id, answered=said))

    async def _run(
        request: Request[Any, Any, Any],
        viewer: Viewer,
        run_id: str,
        replay: dict[str, Any] | None = None,
    ) -> Response[str]:
        got = await client.get(viewer, f"/runs/{run_id}")
        if not got.ok:
            raise _not_found(got, "run")
        steps = await _timeline(client, viewer, run_id)
        journals = None
        if AUDITOR_ROLE in viewer.roles:
            verified = await client.get(viewer, "/audit/verify")
            journals = verified.body if verified.ok else {"ok": False, "journals": []}
        return html_page(
            run_pages.run_page(viewer, got.body, steps, journals=journals, replay=replay)
        )

    @get("/spend", include_in_schema=False)
    @_page
    async def spend(request: Request[Any, Any, Any], viewer: Viewer) -> Response[str]:
        """The tenant's spend against its caps (approvers)."""
        got = await client.get(viewer, "/spend")
        if not got.ok:
            raise Bad(got.status, t("refused"), got.problem)
        return html_page(spend_page(viewer, got.body["spend"]))

    @get("/runs", include_in_schema=False)
    @_page
    async def find_run(
        request: Request[Any, Any, Any],
        viewer: Viewer,
        run_id: Annotated[str, QueryParameter(max_length=128)] = "",
    ) -> Response[str]:
        """A run by its id (the inbox's form): its page."""
        if not run_id:
            raise Bad(404, t("not_found"), t("no_run"))
        return html_page("", 303, headers={"Location": f"/console/runs/{quote(run_id, safe='')}"})

    @get("/runs/{run_id:str}", include_in_schema=False)
    @_page
    async def run(request: Request[Any, Any, Any], viewer: Viewer, run_id: str) -> Response[str]:
        """A run's timeline, actions and outcomes; the journal for auditors."""
        return await _run(request, viewer, run_id)

    @get("/runs/{run_id:str}/status", include_in_schema=False)
    @_page
    async def run_state(
        request: Request[Any, Any, Any], viewer: Viewer, run_id: str
    ) -> Response[str]:
        """Where the run stands, for its page to follow."""
        got = await client.get(viewer, f"/runs/{run_id}")
        if not got.ok:
            raise _not_found(got, "run")
        return html_page(run_pages.run_status(got.body))

    @post("/runs/{run_id:str}/replay", include_in_schema=False, status_code=200)
    @_page
    async def replay(request: Request[Any, Any, Any], viewer: Viewer, run_id: str) -> Response[str]:
        """Replay the run offline from the journal (auditors)."""
        await _form(request, viewer, Form)
        got = await client.post(viewer, f"/audit/replay/{run_id}", None)
        if not got.ok:
            raise _not_found(got, "run")
        return await _run(request, viewer, run_id, replay=got.body)

    @get("/sign-in", include_in_schema=False)
    async def sign_in(
        request: Request[Any, Any, Any],
        token: Annotated[str, QueryParameter(max_length=_MAX_TOKEN)] = "",
    ) -> Response[str]:
        """Use a one-time sign-in link: a session bound to the token's expiry."""
        try:
            session_id, viewer = await sessions.sign_in(token)
        except ConsoleRefused as exc:
            with rendering(_locale(request)):
                return html_page(pages.message_page(t("sign_in_refused"), exc.reason), exc.status)
        max_age = max(1, int(viewer.expires - datetime.now(UTC).timestamp()))
        secure = request.url.scheme == "https" or (
            request.headers.get("x-forwarded-proto", "") == "https"
        )
        cookie = Cookie(
            key=COOKIE,
            value=session_id,
            path="/console",
            max_age=max_age,
            httponly=True,
            samesite="strict",
            secure=secure,
        )
        return html_page(
            pages.message_page("Signed in", "Opening your inbox…"),  # followed at once
            303,
            cookies=[cookie],
            headers={"Location": "/console/mcp" if OPERATOR_ROLE in viewer.roles else "/console/"},
        )

    @post("/sign-out", include_in_schema=False, status_code=200)
    @_page
    async def sign_out(request: Request[Any, Any, Any], viewer: Viewer) -> Response[str]:
        """End the session."""
        await _form(request, viewer, Form)
        await sessions.sign_out(request)
        gone = Cookie(
            key=COOKIE, value="", path="/console", max_age=0, httponly=True, samesite="strict"
        )
        return html_page(pages.message_page(t("signed_out"), t("session_ended")), cookies=[gone])

    @get("/static/{name:str}", include_in_schema=False)
    async def asset(name: FromPath[str]) -> Response[bytes]:
        """The console's script and style sheet."""
        if name not in static:
            return Response(b"not found", status_code=404, media_type="text/plain", headers=HEADERS)
        return Response(
            static[name], media_type=_TYPES[name], headers={**HEADERS, "Cache-Control": "no-cache"}
        )

    @get("/lang/{to:str}", include_in_schema=False)
    async def language(
        to: FromPath[str], back: Annotated[str, QueryParameter(max_length=320)] = "/console/"
    ) -> Response[str]:
        """The language switch: a cookie that keeps the choice, and back to the page (only
        ever a console page)."""
        if to not in LOCALES:
            with rendering("en"):
                return html_page(pages.message_page(t("not_found"), to), 404)
        cookie = Cookie(
            key=LANG_COOKIE,
            value=to,
            path="/console",
            max_age=365 * 24 * 3600,
            httponly=True,
            samesite="lax",
        )
        where = back if _BACK.fullmatch(back) and "//" not in back else "/console/"
        return html_page("", 303, cookies=[cookie], headers={"Location": where})

    async def guard(request: Request[Any, Any, Any]) -> Response[str] | None:
        """Refuse a path id or query parameter no page could look up (as the API does)."""
        said = unstorable_parameter(request.path_params, request.query_params.multi_items())
        if said is None:
            return None
        with rendering(_locale(request), request.url.path):
            return html_page(
                pages.message_page(t("invalid_request"), t("nothing_done", problem=said)), 400
            )

    return Router(
        "/console",
        before_request=guard,
        route_handlers=[
            inbox,
            inbox_rows,
            proposal,
            outcome,
            approve,
            reject,
            revise,
            decision,
            decide,
            review,
            answer_review,
            find_run,
            run,
            run_state,
            spend,
            replay,
            sign_in,
            sign_out,
            asset,
            language,
            *(mcp_handlers(sessions, mcp) if mcp is not None else []),
        ],
    )


async def _timeline(client: ApiClient, viewer: Viewer, run_id: str) -> list[dict[str, Any]]:
    """The run's committed steps, from its event stream (what has come within a moment)."""
    steps: list[dict[str, Any]] = []
    with anyio.move_on_after(3.0):
        async with client.stream(viewer, f"/runs/{run_id}/events") as response:
            if response.status_code != 200:
                return steps
            event, data = "", ""
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif not line:
                    if event == "step" and data:
                        steps.append(msgspec.json.decode(data))
                    if event == "result":
                        break
                    event, data = "", ""
    return steps
