"""`writ chat <agent>`: an interactive terminal chat with an agent, through the SDK's `Session`.

Two loops in one task group: one prints the session's events as they arrive (model text as its
deltas come, a reset marker when an attempt is abandoned, capabilities, outcomes, plans and
asks in place), the other reads lines from standard input. A line is a message, the answer to
what the session asks (a plan or a proposal: `y` approves, anything else rejects with that
reason; a person's decision: `y` / `once`, `always`, `n` / `deny`, which needs a token with the
approver role: `--roles approver`), or a command: `/pause`, `/resume`, `/inject <text>`,
`/fork [turn]` (the chat goes on in the fork), `/close`, `/help`, `/quit` (leaves the session
as it is). Rendering and parsing are pure functions (`render`, `parse`), so their rules are
tested without a terminal.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
from anyio.abc import TaskGroup

from actions import ACTIONS
from writ_client import Client, Issuer, Session, WritError
from writ_client.types import (
    AnySessionEvent,
    CapabilitySelected,
    ChildSession,
    DecisionAsked,
    DecisionTaken,
    Observed,
    PlanDecided,
    PlanProposed,
    ProposalMade,
    SessionClosed,
    SessionForked,
    SessionInjected,
    SessionOpened,
    SessionPaused,
    SessionResumed,
    StepAdmitted,
    StepDispatched,
    StepOutcome,
    TextDelta,
    TextReset,
    TurnEnded,
    TurnStarted,
    UserMessage,
    WriterNote,
)

__all__ = ["Action", "ChatView", "parse", "render", "run_chat"]

HELP: Final = (
    "commands: /pause  /resume  /inject <text>  /fork [turn]  /close  /quit  /help; "
    "anything else is a message"
)
_YES: Final = frozenset({"y", "yes", "/approve"})
_DECISION_ANSWERS: Final = {
    "y": "once",
    "yes": "once",
    "once": "once",
    "always": "always",
    "n": "deny",
    "no": "deny",
    "deny": "deny",
}


@dataclass
class ChatView:
    """What the printer remembers between events: whether model text is mid-line, whether
    this turn's answer was streamed, and what the session asks the person: `asking` is
    ("plan" | "proposal" | "decision", its id)."""

    in_text: bool = False
    streamed: str = ""  # the text of the last model step that streamed, resets applied
    step: tuple[int, int] | None = None  # (turn, step) of that text
    asking: tuple[str, str] | None = None
    # The proposal a decision that follows is about: its id, and whether "always" may be
    # offered for it (never for money, access or sending outside).
    proposal: tuple[str, bool] | None = None
    turn: int = 0
    closed: bool = False
    forks: list[str] = field(default_factory=list)


def _line(view: ChatView, text: str) -> str:
    """`text` on a line of its own, ending model text that was mid-line first."""
    prefix = "\n" if view.in_text else ""
    view.in_text = False
    return f"{prefix}{text}\n"


def render(event: AnySessionEvent, view: ChatView) -> str:
    """What the terminal shows for `event` (possibly nothing), updating `view`."""
    if isinstance(event, TextDelta):
        prefix = "" if view.in_text else "agent: "
        if view.step != (event.turn, event.step):
            view.step, view.streamed = (event.turn, event.step), ""
        view.in_text = True
        view.streamed += event.text
        return prefix + event.text
    if isinstance(event, TextReset):
        view.streamed = ""
        return _line(
            view,
            f"[the model's answer was interrupted ({event.reason or 'retry'}); it starts again]",
        )
    if isinstance(event, SessionOpened):
        return _line(view, f"[session {event.session_id} with {event.agent}]")
    if isinstance(event, UserMessage):
        return _line(view, f"you: {event.text}")
    if isinstance(event, TurnStarted):
        view.turn, view.streamed, view.proposal = event.turn, "", None
        return _line(view, f"[turn {event.turn}]")
    if isinstance(event, CapabilitySelected):
        return _line(view, f"  · using {event.capability}")
    if isinstance(event, Observed):
        return _line(view, f"  · {event.summary}")
    if isinstance(event, ProposalMade):
        if event.proposal_id is None:
            return _line(view, f"  · proposes {event.action}")
        view.asking = ("proposal", event.proposal_id)
        contract = ACTIONS.get(event.action)
        view.proposal = (event.proposal_id, contract is not None and contract.grant_may_cover())
        preview = f" {_args(event.preview)}" if event.preview else ""
        return (
            _line(view, f"[proposal {event.proposal_id}: {event.action}{preview}]")
            + "approve this action? y to approve, anything else rejects it with that reason\n"
        )
    if isinstance(event, StepAdmitted):
        return _line(view, f"  · admitted (operation {event.operation_id})")
    if isinstance(event, StepDispatched):
        return _line(view, "  · dispatched")
    if isinstance(event, StepOutcome):
        return _line(view, f"  · {event.action}: {event.state}")
    if isinstance(event, WriterNote):
        return _line(view, f"writ: {event.text}")
    if isinstance(event, PlanProposed):
        view.asking = ("plan", event.plan.plan_id)
        steps = "".join(
            f"    {s.index + 1}. {s.capability}{' ' + _args(s.arguments) if s.arguments else ''}\n"
            for s in event.plan.steps
        )
        return (
            _line(view, f"[plan {event.plan.plan_id}]")
            + steps
            + "approve this plan? y to approve, anything else rejects it with that reason\n"
        )
    if isinstance(event, PlanDecided):
        if view.asking == ("plan", event.plan_id):
            view.asking = None
        return _line(view, f"[plan {event.answer}{': ' + event.reason if event.reason else ''}]")
    if isinstance(event, DecisionAsked):
        view.asking = ("decision", event.pending_id)
        return _line(
            view,
            f"[waiting for a person's decision {event.pending_id}"
            f"{': ' + event.message if event.message else ''}]",
        ) + (
            "allow it? y (once), or n (deny)\n"
            if view.proposal is not None and not view.proposal[1]
            else "allow it? y (once), always, or n (deny)\n"
        )
    if isinstance(event, DecisionTaken):
        if view.asking == ("decision", event.pending_id):
            view.asking, view.proposal = None, None
        return _line(view, f"[decision {event.pending_id}: {event.answer}]")
    if isinstance(event, TurnEnded):
        view.asking, view.proposal = None, None
        # An answer already streamed whole is not printed again.
        answer = (
            ""
            if not event.answer or event.answer == view.streamed
            else _line(view, f"agent: {event.answer}")
        )
        status = f"[turn {event.turn} {event.status}"
        if event.code:
            status += f": {event.code}"
        if event.correlation_id:
            status += f" (correlation id {event.correlation_id})"
        # Under an approved plan: what became of each of its steps.
        steps = "".join(
            f"    {s.index + 1}. {s.capability}: {s.outcome}\n" for s in event.plan_steps or ()
        )
        return answer + _line(view, status + "]") + steps
    if isinstance(event, SessionPaused):
        return _line(view, "[paused]")
    if isinstance(event, SessionResumed):
        return _line(view, "[resumed]")
    if isinstance(event, SessionInjected):
        return _line(view, f"[injected: {event.text}]")
    if isinstance(event, SessionForked):
        view.forks.append(event.fork_session_id)
        return _line(view, f"[forked at turn {event.turn}: {event.fork_session_id}]")
    if isinstance(event, ChildSession):
        return _line(view, f"[child session {event.child_session_id} ({event.agent})]")
    if isinstance(event, SessionClosed):
        view.closed = True
        return _line(view, "[closed]")
    return ""


def _args(arguments: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return text if len(text) <= 200 else text[:199] + "…"


@dataclass(frozen=True)
class Action:
    """What a line of input asks for: `kind` and its text (a message, a reason, a turn)."""

    kind: str  # message | pause | resume | inject | fork | close | quit | help | approve |
    # reject | decide | invalid | nothing
    text: str = ""


def parse(line: str, view: ChatView) -> Action:
    """The action of one input line, given what the session asks (`view.asking`)."""
    text = line.strip()
    if not text:
        return Action("nothing")
    asking = view.asking[0] if view.asking else None
    if asking == "decision" and text.lower() in _DECISION_ANSWERS:
        return Action("decide", _DECISION_ANSWERS[text.lower()])
    if asking in ("plan", "proposal") and (
        text.lower() in _YES or not text.startswith("/") or text.startswith("/reject")
    ):
        if text.lower() in _YES:
            return Action("approve")
        reason = text.removeprefix("/reject").strip()
        return Action("reject", reason or "rejected in the chat")
    if not text.startswith("/"):
        return Action("message", text)
    command, _, rest = text.partition(" ")
    rest = rest.strip()
    if command in ("/pause", "/resume", "/close", "/quit", "/help") and not rest:
        return Action(command[1:])
    if command == "/inject" and rest:
        return Action("inject", rest)
    if command == "/fork" and (not rest or rest.isdigit()):
        return Action("fork", rest)
    return Action("invalid", text)


class _Chat:
    def __init__(self, client: Client, session: Session, out: TextIO) -> None:
        self.client, self.session, self.out = client, session, out
        self.view = ChatView()
        self._printer: anyio.CancelScope | None = None
        self.done = anyio.Event()

    def say(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    async def show(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.CancelScope() as scope:
            self._printer = scope
            task_status.started()
            async for event in self.session.events():
                self.say(render(event, self.view))
                if self.view.closed:
                    self.done.set()
                    return

    async def act(self, action: Action, tg: TaskGroup) -> bool:
        """Carry out `action`; False when the chat should end."""
        s = self.session
        if action.kind == "quit":
            return False
        if action.kind == "help":
            self.say(HELP + "\n")
        elif action.kind == "invalid":
            self.say(f"[not understood: {action.text}] {HELP}\n")
        elif action.kind == "message":
            await s.send(action.text)
        elif action.kind in ("pause", "resume", "close"):
            await getattr(s, action.kind)()
            if action.kind == "close":
                with anyio.fail_after(30):
                    await self.done.wait()
                return False
        elif action.kind == "inject":
            await s.inject(action.text)
        elif action.kind in ("approve", "reject", "decide") and self.view.asking:
            await self._answer(action, *self.view.asking)
        elif action.kind == "fork":
            turn = int(action.text) if action.text else max(self.view.turn, 1)
            fork = await s.fork(turn)
            if self._printer is not None:
                self._printer.cancel()
            self.session, self.view = fork, ChatView()
            self.say(f"[now in the fork {fork.session_id}]\n")
            await tg.start(self.show)
        return True

    async def _answer(self, action: Action, kind: str, ask_id: str) -> None:
        c, s = self.client, self.session
        if kind == "plan":
            await (
                s.approve_plan(ask_id)
                if action.kind == "approve"
                else s.reject_plan(ask_id, action.text)
            )
        elif kind == "proposal":
            approval = await (
                c.approve(ask_id) if action.kind == "approve" else c.reject(ask_id, action.text)
            )
            if approval.status == "not_approvable":
                # Refused (the requester may not approve their own run's proposal, say):
                # the question stays open for someone who may answer it.
                self.say(
                    f"[proposal {ask_id} not {action.kind}d: {approval.code}: {approval.reason}]\n"
                )
                return
            self.say(f"[proposal {ask_id} {action.kind}d]\n")
            self.view.asking = None
        else:
            proposal = self.view.proposal
            taken = await c.decide(
                ask_id, action.text, proposal_id=None if proposal is None else proposal[0]
            )
            if not taken.accepted:
                self.say(f"[decision {ask_id} not taken: {taken.code}: {taken.message}]\n")
                return
            self.say(f"[decision {ask_id}: {action.text}]\n")
            self.view.asking = None


async def run_chat(
    base_url: str,
    issuer: Issuer,
    principal: str,
    agent: str,
    *,
    plan_mode: bool = False,
    session_id: str | None = None,
    roles: tuple[str, ...] = (),
    stdin: TextIO = sys.stdin,
    out: TextIO = sys.stdout,
) -> int:
    """Chat until `/quit`, `/close` or the end of input; 0 unless the session cannot open."""
    async with Client(base_url, issuer, principal, roles=roles) as client:
        try:
            session = (
                client.session(session_id)
                if session_id
                else await client.open_session(agent, plan_mode=plan_mode)
            )
            if session_id:
                await session.history()  # the caller's, or NOT_FOUND now rather than later
        except WritError as exc:
            print(f"writ chat: {exc}", file=sys.stderr)
            return 1
        chat = _Chat(client, session, out)
        async with anyio.create_task_group() as tg:
            await tg.start(chat.show)
            while True:
                line = await anyio.to_thread.run_sync(stdin.readline, abandon_on_cancel=True)
                if not line:
                    break  # end of input: the session stays as it is
                try:
                    if not await chat.act(parse(line, chat.view), tg):
                        break
                except WritError as exc:
                    chat.say(chat.view.in_text * "\n" + f"[refused: {exc}]\n")
                    chat.view.in_text = False
            tg.cancel_scope.cancel()
    return 0


def chat_main(args: Any) -> int:
    """`writ chat`: the deployment's URL and a token signed with the tenant's host key."""
    import os

    home = Path(args.home)
    url = args.url or os.environ.get("WRIT_API_URL", "")
    if not url:
        port_file = home / "ingress.http-port"
        if not port_file.exists():
            raise SystemExit("no API: pass --url, set WRIT_API_URL or start `writ run`")
        url = f"http://127.0.0.1:{int(port_file.read_text().strip())}/api/v1"
    key = Path(args.key) if args.key else home / "secrets" / f"host-{args.tenant}.pem"
    if not key.exists():
        raise SystemExit(f"no host key at {key}: pass --key (and --issuer)")
    from writ.stack import Stack

    issuer = Issuer.from_file(
        key, tenant=args.tenant, issuer=args.issuer or Stack(home).issuer(args.tenant)
    )
    roles = tuple(filter(None, args.roles.split(",")))
    return anyio.run(
        lambda: run_chat(
            url,
            issuer,
            args.principal,
            args.agent,
            plan_mode=args.plan_mode,
            session_id=args.session or None,
            roles=roles,
        )
    )
