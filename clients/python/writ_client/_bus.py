"""A host's NATS connection: connecting with its credentials, and requests that fail with the
real cause (a subject the server refused is `PermissionDenied`, not a timeout)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import msgspec

from writ_client._wire.host_reads import DEADLINE_HEADER
from writ_client.credentials import NatsLogin
from writ_client.errors import (
    AuthenticationError,
    InvalidResponse,
    PermissionDenied,
    Unavailable,
    WritError,
    error,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as Nats
    from nats.aio.msg import Msg

__all__ = ["ASK_S", "Bus", "connect", "decode", "raise_service_error"]

T = TypeVar("T")
ASK_S: Final = 30.0  # how long a read or a session operation waits for ingress
_ENCODER: Final = msgspec.json.Encoder()
_PERMISSIONS = "permissions violation"


class Bus:
    """One NATS connection and the permission violations its server reported."""

    def __init__(self, nc: Nats) -> None:
        self.nc = nc
        self.violations: list[str] = []
        self._violation = anyio.Event()

    async def on_error(self, exc: Exception) -> None:
        """nats-py's `error_cb`: remember what the server refused."""
        if _PERMISSIONS in str(exc):
            self.violations.append(str(exc).removeprefix("nats: "))
            self._violation.set()
            self._violation = anyio.Event()

    async def guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, or `PermissionDenied` as soon as the server refuses a subject meanwhile
        (nats-py only reports it to `error_cb`; the call itself would wait for its timeout)."""
        seen = len(self.violations)
        outcome: list[T] = []
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while len(self.violations) == seen:
                    await self._violation.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:  # in this task, so its error is raised as it is, not in a group
                outcome.append(await call())
            except Exception as exc:
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if not outcome:
            raise PermissionDenied("PERMISSION_DENIED", self.violations[-1])
        return outcome[0]

    async def ask(self, subject: str, ask: msgspec.Struct) -> Msg:
        """One request to ingress, waited for `ASK_S`.

        Raises:
            PermissionDenied: the server refused the subject or the reply's inbox.
            Unavailable: nothing answered (no responders, or not in time).
        """
        try:
            return await self.guarded(
                lambda: self.nc.request(
                    subject, _ENCODER.encode(ask), timeout=ASK_S, headers=_deadline()
                )
            )
        except WritError:
            raise
        except Exception as exc:  # no responders, a timeout, a lost connection
            raise Unavailable("UNAVAILABLE", f"no answer on {subject}: {exc!r}") from exc

    async def publish(self, subject: str, data: bytes, request_id: str) -> None:
        """Publish to a host stream and wait for JetStream's acknowledgement; a lost one is
        published again under the same `Nats-Msg-Id` (a duplicate, dropped)."""
        js = self.nc.jetstream()
        delay = 0.2
        for attempt in range(4):
            try:
                await self.guarded(
                    lambda: js.publish(subject, data, headers={"Nats-Msg-Id": request_id})
                )
                return
            except WritError:
                raise
            except Exception as exc:  # no acknowledgement: the same id again is a duplicate
                if attempt == 3:
                    raise Unavailable("UNAVAILABLE", f"no acknowledgement: {exc!r}") from exc
                await anyio.sleep(delay)
                delay *= 2

    async def check_inbox(self) -> None:
        """Subscribe to one of this connection's inboxes and wait for the server's verdict:
        a host whose replies cannot arrive learns it at connect, not at its first timeout.

        Raises:
            PermissionDenied: the server refused it (the inbox prefix is not the user's).
        """
        sub = await self.nc.subscribe(self.nc.new_inbox())
        await self.nc.flush(timeout=10)  # the server's -ERR, if any, comes before its PONG
        # nats-py hands the -ERR to the error callback in a task of its own: give it its turn.
        for _ in range(10):
            if self.violations:
                break
            await anyio.sleep(0.01)
        await sub.unsubscribe()
        if self.violations:
            raise PermissionDenied(
                "PERMISSION_DENIED",
                f"{self.violations[-1]}: this user's replies arrive only under its own inbox "
                "prefix (`inbox_prefix`, the credentials' nats.inbox)",
            )


def raise_service_error(headers: dict[str, str] | None) -> None:
    """Raise the NATS micro error an answer carries (`Nats-Service-Error[-Code]`), if any."""
    if headers and headers.get("Nats-Service-Error-Code"):
        code, _, detail = headers.get("Nats-Service-Error", "").partition(": ")
        try:
            status: int | None = int(headers["Nats-Service-Error-Code"])
        except ValueError:
            status = None
        raise error(code or "INTERNAL", detail, status=status)


def decode(data: bytes, kind: type[T]) -> T:
    """An answer as `kind`, or `InvalidResponse`."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise InvalidResponse("INVALID_RESPONSE", f"not a {kind.__name__}: {exc}") from exc


def _deadline() -> dict[str, str]:
    """The `Writ-Deadline` of a request waited for `ASK_S`: ingress drops it unanswered once
    this client has given up, instead of working for nobody."""
    return {DEADLINE_HEADER: f"{time.time() + ASK_S:.3f}"}


async def connect(login: NatsLogin, **options: Any) -> Bus:
    """Connect as `login` says (retrying a lost connection for ever once connected).

    Raises:
        AuthenticationError: the server refused the user, password or creds.
        PermissionDenied: the user may not receive replies under the inbox prefix.
        Unavailable: no server answered.
    """
    import nats
    import nats.errors

    bus: Bus | None = None

    async def on_error(exc: Exception) -> None:
        if bus is not None:
            await bus.on_error(exc)

    login_options: dict[str, Any] = {}
    if login.user is not None:
        login_options["user"] = login.user
    if login.password is not None:
        login_options["password"] = login.password
    if login.creds is not None:
        login_options["user_credentials"] = str(login.creds)
    if login.inbox_prefix is not None:
        login_options["inbox_prefix"] = login.inbox_prefix
    nc = nats.NATS()
    try:
        await nc.connect(
            login.url,
            max_reconnect_attempts=-1,
            allow_reconnect=False,  # the first connection: fail with its cause, not loop
            error_cb=on_error,
            **login_options,
            **options,
        )
    except (nats.errors.Error, OSError) as exc:
        await nc.close()  # its socket too, whatever state the refusal left it in
        refused = "authorization violation" in str(exc).lower()
        if isinstance(exc, nats.errors.AuthorizationError) or refused:
            raise AuthenticationError(
                "UNAUTHENTICATED", f"NATS at {login.url} refused {login.user or 'the login'}"
            ) from exc
        raise Unavailable("UNAVAILABLE", f"NATS at {login.url}: {exc!r}") from exc
    nc.options["allow_reconnect"] = True
    bus = Bus(nc)
    try:
        await bus.check_inbox()
    except (WritError, nats.errors.Error):
        await nc.close()
        raise
    return bus
