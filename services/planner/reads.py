"""Read capabilities from the planner's side: the request/reply client of retrieval's
`writ.int.retrieval.read` (`schemas.retrieval.ReadCapability` -> `ReadResult` | `ReadRefused`).

A read that may succeed later is never an answer: no responder, no reply in time, a retrieval
that failed, or a refusal retrieval marks `retryable` (governance did not answer, the store
failed) raise `ReadUnavailable`, a `RetryableError`, so the delivery is retried and nothing is
observed meanwhile. Every other answer is final and becomes the model's next observation: what
was read, or why nothing was (`UNKNOWN_TOOL`, `INVALID_ARGUMENTS`, `DENIED`, `ASK`).
"""

from __future__ import annotations

from typing import Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from libs.deadline import timed_request
from libs.errors import RetryableError
from schemas import subjects
from schemas.retrieval import ReadCapability, ReadRefused, ReadResult

__all__ = ["DEFAULT_READ_TIMEOUT_S", "ReadClient", "ReadUnavailable"]

# Above retrieval's own wait for governance's `decide` (2 s), so a slow decide is retrieval's
# `UNAVAILABLE` answer rather than the planner's timeout.
DEFAULT_READ_TIMEOUT_S: Final = 5.0
_REPLY: Final = msgspec.json.Decoder(ReadResult | ReadRefused)


class ReadUnavailable(RetryableError):
    """Retrieval gave no final answer; the same read may succeed later."""

    def __init__(self, msg: str, *, run_id: str, tool: str) -> None:
        super().__init__(msg, delay=1.0)
        self.run_id, self.tool = run_id, tool


class ReadClient:
    """Ask retrieval to execute one read capability for a run."""

    def __init__(self, *, nc: Client, timeout: float = DEFAULT_READ_TIMEOUT_S) -> None:
        self._nc, self._timeout = nc, timeout
        self._encoder = msgspec.json.Encoder()

    async def read(self, ask: ReadCapability) -> ReadResult | ReadRefused:
        """Retrieval's final answer to `ask`.

        Raises:
            ReadUnavailable: no answer, retrieval failed, or a retryable refusal.
        """
        try:
            reply = await timed_request(
                self._nc, subjects.READ, self._encoder.encode(ask), timeout=self._timeout
            )
        except (NatsTimeoutError, NoRespondersError) as exc:
            raise ReadUnavailable(
                f"retrieval did not answer: {type(exc).__name__}", run_id=ask.run_id, tool=ask.tool
            ) from exc
        code = (reply.headers or {}).get("Nats-Service-Error-Code")
        if code:
            error = (reply.headers or {}).get("Nats-Service-Error", "")
            if code.startswith("4"):
                # Retrieval could not take the request as sent: asking again changes nothing.
                return ReadRefused(
                    run_id=ask.run_id,
                    tool=ask.tool,
                    code="INVALID_ARGUMENTS",
                    reason=f"retrieval refused the request ({code}): {error}"[:500],
                )
            raise ReadUnavailable(
                f"retrieval failed ({code}): {error}"[:500], run_id=ask.run_id, tool=ask.tool
            )
        try:
            answer = _REPLY.decode(reply.data)
        except msgspec.DecodeError as exc:
            raise ReadUnavailable(
                "retrieval's answer did not decode", run_id=ask.run_id, tool=ask.tool
            ) from exc
        if isinstance(answer, ReadRefused) and (answer.retryable or answer.code == "UNAVAILABLE"):
            raise ReadUnavailable(
                f"{ask.tool} could not be read now: {answer.reason}",
                run_id=ask.run_id,
                tool=ask.tool,
            )
        return answer
