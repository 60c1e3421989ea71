"""Writ's errors. The retry decision lives on the class, not at the catch site."""

from __future__ import annotations

__all__ = [
    "ConfigError",
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
