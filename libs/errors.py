"""Writ's errors. The retry decision lives on the class, not at the catch site."""

from __future__ import annotations

import asyncpg
import nats.errors
import nats.js.errors

__all__ = [
    "ConfigError",
    "single_error",
    "waits_out",
    "Fenced",
    "PermanentError",
    "RetryableError",
    "WritError",
]


class WritError(Exception):
    """Base of every error Writ raises on purpose."""


class RetryableError(WritError):
    """Try again later: the message is nak'ed with `delay` seconds (or the actor's backoff)."""

    def __init__(self, msg: str, *, delay: float | None = None) -> None:
        super().__init__(msg)
        self.delay = delay


class PermanentError(WritError):
    """Trying again cannot help: the message is dead-lettered with this error as the reason."""


class Fenced(WritError):
    """This worker's lease was taken over: it must not ack, nak or report progress again."""

    def __init__(self, msg: str, *, operation_id: str = "") -> None:
        super().__init__(msg)
        self.operation_id = operation_id


class ConfigError(WritError, ValueError):
    """The configuration is missing or invalid; the process refuses to start."""


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one error inside a task group's exception group, or the group if there are several.

    anyio wraps every error leaving a task group in an exception group; the retry decision is
    made on the error's class, so callers re-raise the error itself.
    """
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


# What a dependency being away looks like (a Writ service, NATS, PostgreSQL), as opposed to
# a message nothing will ever handle. asyncpg's connection-class errors (SQLSTATE 08), its
# shutdown and "cannot connect now" (57P), and its client-side "connection is closed".
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError,
    # JetStream between leaders: nobody answered for the stream, or it said "not now".
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.InterfaceError,
    # A backend terminated under a statement now and then leaves asyncpg's protocol
    # mid-operation rather than closed: "cannot switch to state 15; another operation (2) is
    # in progress" (MagicStack/asyncpg#1069). The connection is lost, the message is fine.
    asyncpg.exceptions.InternalClientError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    TimeoutError,
    ConnectionError,
)


def waits_out(error: BaseException) -> bool:
    """Whether `error` says "not now" rather than "never": a `RetryableError`, or a Writ
    service, NATS or PostgreSQL that is unavailable. Such a delivery waits out the outage
    (retried with backoff up to the consumer's outage limit); anything else is treated as a
    poison message after `max_deliver` deliveries."""
    if isinstance(error, BaseExceptionGroup):
        error = single_error(error)
        if isinstance(error, BaseExceptionGroup):
            return all(waits_out(e) for e in error.exceptions)
    return isinstance(error, (RetryableError, *_UNAVAILABLE))
