"""Writ's errors. The retry decision lives on the class, not at the catch site."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "single_error",
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
