"""`OpenAIProvider`: the HTTP exchange (bounded attempts, retries, streaming) around `_wire`."""

from __future__ import annotations

import hashlib
import logging
import math
import random
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
import httpx
import msgspec
from opentelemetry import trace

from libs.errors import ConfigError
from libs.settings import read_secret
from schemas.base import storable
from services.planner.openai_provider._history import history_messages
from services.planner.openai_provider._stream import StreamCut, read_stream
from services.planner.openai_provider._wire import (
    _COMPLETION,
    _CRITIC,
    _TOOL_NAME,
    _VERDICT_SCHEMA,
    BOUNDARY,
    CATALOG_FUNCTION,
    CRITIC_BOUNDARY,
    MAX_CONTENT_CHARS,
    MAX_RESPONSE_BYTES,
    MAX_STREAM_BYTES,
    REVIEW_FUNCTION,
    STRUCTURED_HINT,
    Capability,
    MalformedDecision,
    ModelCall,
    ModelRefused,
    ProviderCallsExhausted,
    ProviderMode,
    ProviderRejected,
    ProviderUnavailable,
    _Completion,
    _decision_schema,
    _from_structured,
    _from_tools,
    _json,
    _parameters,
    _tool_names,
    _Usage,
)
from services.planner.provider import (
    AnswerDirectly,
    CriticInput,
    CriticVerdict,
    ModelDecision,
    ModelInput,
    TextSink,
)

__all__ = ["OpenAIProvider"]

log = logging.getLogger("writ.planner.provider")
_T = TypeVar("_T")


class OpenAIProvider:
    """Decisions from an OpenAI-compatible `POST {base_url}/chat/completions`.

    Use it as an async context manager: it owns its HTTP connection pool.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        key_file: str | Path,
        mode: ProviderMode = "structured",
        capabilities: Sequence[Capability] = (),
        timeout_s: float = 30.0,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_wait_s: float = 30.0,
        deadline_s: float | None = None,
        max_calls: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_stream_bytes: int = MAX_STREAM_BYTES,
    ) -> None:
        if mode not in ("structured", "tools"):
            raise ConfigError(f"provider mode must be structured or tools, not {mode!r}")
        if (
            max_attempts < 1
            or timeout_s <= 0
            or (max_calls is not None and max_calls < 1)
            or (deadline_s is not None and deadline_s <= 0)
        ):
            raise ConfigError("max_attempts, timeout_s, deadline_s and max_calls must be positive")
        if not (key := read_secret(key_file)):
            raise ConfigError(f"the model key file {key_file} is empty")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model, self._mode, self._capabilities = model, mode, list(capabilities)
        # What a spend cap's price table calls this model.
        self.priced_as = f"openai/{model}"
        self._tools = _tool_names(self._capabilities)
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._timeout_s, self._max_attempts = timeout_s, max_attempts
        self._backoff_s, self._max_backoff_s = backoff_s, max_backoff_s
        self._max_wait_s = max_wait_s
        self._deadline_s, self._max_calls, self._calls = deadline_s, max_calls, 0
        self._max_stream_bytes = max_stream_bytes
        # `transport`: what carries the requests (an evaluation passes one that lets only the
        # candidate's base URL through).
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport)

    def __repr__(self) -> str:
        return f"OpenAIProvider(url={self._url!r}, model={self._model!r}, mode={self._mode!r})"

    @property
    def calls(self) -> int:
        """HTTP attempts this instance has made."""
        return self._calls

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def decide(self, model_input: ModelInput) -> ModelDecision:
        """The model's next decision; its metadata goes on the current span and in the log."""
        decision, _ = await self.decide_with_metadata(model_input)
        return decision

    async def decide_with_metadata(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, ModelCall]:
        """The model's next decision and the non-secret facts of the call that made it.

        With `text`, the answer is streamed (`stream: true`) and its user-visible text goes to
        `text` as it arrives (see `_stream`); the assembled response is validated exactly as an
        unstreamed one. An attempt whose text was shown and that fails is reset (`text.reset`)
        before anything else happens, so the text a client keeps is the validated answer only.

        Raises:
            ProviderUnavailable: no answer within `max_attempts` (retryable later).
            ProviderRejected, MalformedDecision, ModelRefused, ProviderCallsExhausted.
        """
        tools = self._tool_table(model_input)
        return await self._exchange(
            self._body(model_input, tools),
            lambda completion, call: self._decoded(completion, call, tools),
            text=text,
        )

    async def decide_with_usage(
        self, model_input: ModelInput, *, text: TextSink | None = None
    ) -> tuple[ModelDecision, int]:
        """The model's next decision and the tokens the provider reported for it (streamed
        to `text` when given: usage then comes from the stream's last chunk)."""
        decision, call = await self.decide_with_metadata(model_input, text=text)
        return decision, call.total_tokens

    async def verify(self, critic_input: CriticInput) -> tuple[CriticVerdict, int]:
        """The critic's verdict on an answer (strict schema, whatever the mode: the critic is
        offered no tool) and the tokens the provider reported for it.

        Raises:
            ProviderUnavailable, ProviderRejected, MalformedDecision, ModelRefused,
            ProviderCallsExhausted: as for a decision.
        """
        verdict, call = await self._exchange(self.critic_request(critic_input), self._verdict)
        return verdict, call.total_tokens

    def critic_request(self, critic_input: CriticInput) -> dict[str, Any]:
        """The chat-completions request body of a critic call (it holds no secret)."""
        return {
            "model": self._model,
            "messages": [
                {"role": "system", "content": f"{critic_input.developer}\n\n{CRITIC_BOUNDARY}"},
                {
                    "role": "user",
                    "content": _json(
                        {
                            "user_input": {
                                "authority": "domain_data_only",
                                "objective": critic_input.objective,
                            }
                        }
                    ),
                },
                {
                    "role": "user",
                    "content": _json(
                        {
                            "untrusted": {
                                "authority": "none",
                                "answer": critic_input.answer,
                                "evidence": critic_input.untrusted,
                                "observations": critic_input.observations,
                            }
                        }
                    ),
                },
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "writ_critic_verdict",
                    "strict": True,
                    "schema": _VERDICT_SCHEMA,
                },
            },
        }

    async def _exchange(
        self,
        body: dict[str, Any],
        decoded: Callable[[_Completion, ModelCall], tuple[_T, ModelCall]],
        *,
        text: TextSink | None = None,
    ) -> tuple[_T, ModelCall]:
        """POST `body` with bounded retries (streamed to `text` when given); `decoded` reads
        a 200 answer's completion."""
        if text is not None:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        content = msgspec.json.encode(body)
        digest = hashlib.sha256(content).hexdigest()
        attempts, status, failure = 0, 0, ""
        # Every attempt of this call says which call it belongs to (`X-Client-Request-Id`, the
        # id OpenAI keeps for a client's own tracing): a provider that logs an attempt after
        # a later one (a timed-out attempt read late) can still tell a retry from a new call.
        call_id = uuid.uuid4().hex
        deadline = anyio.current_time() + (self._deadline_s or math.inf)
        while True:
            if self._max_calls is not None and self._calls >= self._max_calls:
                raise ProviderCallsExhausted(
                    f"the provider has made its {self._max_calls} calls",
                    call=self._call(digest, attempts, status),
                )
            self._calls += 1
            attempts += 1
            retry_after: float | None = None
            shown = _Shown(text)
            try:
                with anyio.fail_after(min(self._timeout_s, deadline - anyio.current_time())):
                    response, completion = await self._attempt(
                        content, digest, attempts, shown, request_id=f"{call_id}-{attempts}"
                    )
            except (TimeoutError, httpx.TimeoutException):
                status, failure = 0, f"no answer within {self._timeout_s:g} s"
            except httpx.TransportError as exc:
                status, failure = 0, f"transport error ({type(exc).__name__})"
            except StreamCut:
                status, failure = 200, "the stream was cut before its end"
            except MalformedDecision:
                await shown.discard("the model's answer was malformed")
                raise
            else:
                status = response.status_code
                if completion is not None:
                    try:
                        result, call = decoded(
                            *self._completion(completion, digest, attempts, response)
                        )
                    except MalformedDecision:
                        await shown.discard("the model's answer was malformed")
                        raise
                    except ModelRefused:
                        await shown.discard("the model refused to answer")
                        raise
                    await shown.settle(result)
                    return result, call
                if status == 429:
                    retry_after, failure = _retry_after(response.headers.get("Retry-After")), "429"
                elif status >= 500:
                    failure = f"HTTP {status}"
                else:
                    call = self._call(digest, attempts, status, response)
                    _record(call)
                    raise ProviderRejected(
                        f"the model provider refused the request: HTTP {status}",
                        status=status,
                        call=call,
                    )
            # A client discards this attempt's text before anything else it is told.
            await shown.discard(failure)
            call = self._call(digest, attempts, status)
            wait = retry_after if retry_after is not None else self._backoff(attempts)
            if (
                attempts >= self._max_attempts
                or wait > self._max_wait_s
                or anyio.current_time() + wait >= deadline
            ):
                _record(call)
                # A Retry-After we will not wait out here is the delay for the run's retry.
                raise ProviderUnavailable(
                    f"the model provider failed {attempts} attempt(s), last: {failure}",
                    call=call,
                    delay=retry_after,
                )
            log.warning(
                "model call attempt %d failed (%s); retrying in %.2f s [sha256 %s]",
                attempts,
                failure,
                wait,
                digest[:16],
            )
            await anyio.sleep(wait)

    async def _attempt(
        self, content: bytes, digest: str, attempts: int, shown: _Shown, *, request_id: str
    ) -> tuple[httpx.Response, _Completion | None]:
        """One POST: the response, and its completion when it answered 200."""
        response: httpx.Response | None = None
        headers = {**self._headers, "X-Client-Request-Id": request_id}
        try:
            if shown.sink is None:
                response = await self._client.post(self._url, content=content, headers=headers)
                return response, _read(response) if response.status_code == 200 else None
            async with self._client.stream(
                "POST", self._url, content=content, headers=headers
            ) as response:
                if response.status_code != 200:
                    await _drain(response)
                    return response, None
                try:
                    return response, await read_stream(
                        response,
                        structured=self._mode == "structured",
                        limit=self._max_stream_bytes,
                        max_content=MAX_CONTENT_CHARS,
                        visible=shown.delta,
                    )
                except httpx.TimeoutException:
                    raise
                except httpx.TransportError as exc:  # after the 200: the stream was cut
                    raise StreamCut(f"the stream was cut ({type(exc).__name__})") from exc
        except MalformedDecision as exc:
            exc.call = exc.call or self._call(digest, attempts, 200, response)
            raise

    def request(self, model_input: ModelInput) -> dict[str, Any]:
        """The chat-completions request body for this input (it holds no secret)."""
        return self._body(model_input, self._tool_table(model_input))

    def _tool_table(self, model_input: ModelInput) -> dict[str, Capability]:
        """Tools mode: function name -> what it stands for (a capability, or a decision)."""
        view = model_input.capabilities
        if view is None:
            return self._tools
        offered: list[Capability] = []
        if view.get("mode") == "catalog":
            offered += [
                Capability(
                    name=e["ref"],
                    description=e["description"],
                    parameters=_parameters(e.get("inputs", {})),
                )
                for e in view.get("capabilities", [])
            ]
        else:
            offered.append(
                Capability(
                    name=CATALOG_FUNCTION,
                    description="Receive the full catalog of the "
                    f"{view.get('capability_count', 0)} capabilities you may use "
                    f"({', '.join(view.get('capability_refs', []))}) before choosing one.",
                )
            )
        offered.append(
            Capability(
                name=REVIEW_FUNCTION,
                description="Ask a person to review something before the "
                "run goes on; the run waits for their explicit answer.",
                parameters={
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["review_prompt"],
                    "properties": {"review_prompt": {"type": "string"}},
                },
            )
        )
        tools: dict[str, Capability] = {}
        for c in offered:
            tools.setdefault(_TOOL_NAME.sub("_", c.name)[:64], c)
        return tools

    def _body(self, model_input: ModelInput, tools: dict[str, Capability]) -> dict[str, Any]:
        system = f"{model_input.developer}\n\n{BOUNDARY}".lstrip()
        if model_input.revision:  # an approver's, in Writ's words: it speaks as an operator
            system = f"{system}\n\nRevision context: {model_input.revision}"
        messages: list[dict[str, Any]] = []
        body: dict[str, Any] = {"model": self._model, "messages": messages}
        view = model_input.capabilities
        if self._mode == "structured":
            messages.append({"role": "system", "content": f"{system}\n\n{STRUCTURED_HINT}"})
            # The catalog is the operator's configuration, so it speaks with developer authority.
            if view is None:
                shown: Any = [msgspec.to_builtins(c) for c in self._capabilities]
                names = [c.name for c in self._capabilities]
            else:
                shown = view
                names = (
                    view.get("capability_refs")
                    if view.get("mode") == "summary"
                    else [e["ref"] for e in view.get("capabilities", [])]
                ) or []
            messages.append({"role": "system", "content": _json({"capabilities": shown})})
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "writ_decision",
                    "strict": True,
                    "schema": _decision_schema(names),
                },
            }
        else:
            messages.append({"role": "system", "content": system})
            if tools:  # some providers refuse an empty tool list
                body["tools"] = [
                    {
                        "type": "function",
                        "function": {
                            "name": tool,
                            "description": c.description,
                            "parameters": c.parameters,
                        },
                    }
                    for tool, c in tools.items()
                ]
                body["tool_choice"] = "auto"
                body["parallel_tool_calls"] = False
        messages.extend(
            history_messages(
                model_input.history,
                tools=self._mode == "tools",
                tool_name=lambda name: _TOOL_NAME.sub("_", name)[:64],
            )
        )
        messages.append(
            {
                "role": "user",
                "content": _json(
                    {"user_input": {"authority": "domain_data_only", "request": model_input.user}}
                ),
            }
        )
        messages.append(
            {
                "role": "user",
                "content": _json(
                    {
                        "untrusted": {
                            "authority": "none",
                            "evidence": model_input.untrusted,
                            "observations": model_input.observations,
                        }
                    }
                ),
            }
        )
        return body

    def _completion(
        self, completion: _Completion, digest: str, attempts: int, response: httpx.Response
    ) -> tuple[_Completion, ModelCall]:
        """A 200 answer's completion, with a first choice that is neither refused nor cut."""
        call = self._call(digest, attempts, 200, response, completion)
        _record(call)
        if not completion.choices:
            raise MalformedDecision("the completion has no choices", call=call)
        choice = completion.choices[0]
        if choice.message.refusal is not None or choice.finish_reason == "content_filter":
            raise ModelRefused("the model refused to decide", call=call)
        if choice.finish_reason == "length":
            raise MalformedDecision("the model's answer was cut short", call=call)
        return completion, call

    def _decoded(
        self, completion: _Completion, call: ModelCall, tools: dict[str, Capability]
    ) -> tuple[ModelDecision, ModelCall]:
        choice = completion.choices[0]
        try:
            if self._mode == "tools":
                return _from_tools(choice.message, tools), call
            return _from_structured(choice.message.content), call
        except MalformedDecision as exc:
            exc.call = call
            raise

    def _verdict(self, completion: _Completion, call: ModelCall) -> tuple[CriticVerdict, ModelCall]:
        content = completion.choices[0].message.content
        if content is None or len(content) > MAX_CONTENT_CHARS:
            raise MalformedDecision("the critic answered without a verdict", call=call)
        try:
            wire = _CRITIC.decode(content).critic
        except msgspec.DecodeError as exc:
            raise MalformedDecision(
                f"the critic's answer is not a verdict: {exc}", call=call
            ) from None
        try:
            return msgspec.convert(msgspec.to_builtins(wire), CriticVerdict), call
        except msgspec.ValidationError as exc:
            raise MalformedDecision(f"the verdict is invalid: {exc}", call=call) from None

    def _backoff(self, attempts: int) -> float:
        # Full jitter, so replicas retrying the same outage do not arrive together.
        return random.uniform(0, min(self._max_backoff_s, self._backoff_s * 2 ** (attempts - 1)))

    def _call(
        self,
        digest: str,
        attempts: int,
        status: int,
        response: httpx.Response | None = None,
        completion: _Completion | None = None,
    ) -> ModelCall:
        usage = completion.usage if completion and completion.usage else _Usage()
        finish = completion.choices[0].finish_reason if completion and completion.choices else ""
        return ModelCall(
            request_sha256=digest,
            mode=self._mode,
            attempts=attempts,
            status=status,
            # The provider's words, kept where Writ stores them: storable text only.
            model=storable(completion.model) if completion else "",
            finish_reason=storable(finish or ""),
            request_id=storable(
                (response.headers.get("x-request-id", "") if response else "")[:128]
            ),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )


class _Shown:
    """The text one attempt passed to the sink, so that it can be taken back."""

    def __init__(self, sink: TextSink | None) -> None:
        self.sink, self._parts = sink, list[str]()

    async def delta(self, text: str) -> None:
        assert self.sink is not None
        self._parts.append(text)
        await self.sink.delta(text)

    async def discard(self, reason: str) -> None:
        """Reset the sink if this attempt showed anything."""
        if self._parts and self.sink is not None:
            self._parts = []
            await self.sink.reset(reason)

    async def settle(self, decision: Any) -> None:
        """Leave shown text standing only if it is the validated answer: otherwise reset it
        (a tools-mode preamble before a tool call, say) and show the answer itself."""
        if self.sink is None:
            return
        answer = decision.answer if isinstance(decision, AnswerDirectly) else None
        if "".join(self._parts) == (answer or ""):
            return
        await self.discard("the streamed text is not the decision's answer")
        if answer:
            await self.delta(answer)


def _read(response: httpx.Response) -> _Completion:
    if len(response.content) > MAX_RESPONSE_BYTES:
        raise MalformedDecision("the model response is too large")
    try:
        return _COMPLETION.decode(response.content)
    except msgspec.DecodeError as exc:
        raise MalformedDecision(f"the response is not a chat completion: {exc}") from None


async def _drain(response: httpx.Response) -> None:
    """Read an error body within the response bound (its headers are what is used)."""
    total = 0
    async for piece in response.aiter_bytes():
        total += len(piece)
        if total > MAX_RESPONSE_BYTES:
            break


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), if it parses."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _record(call: ModelCall) -> None:
    """Put the call's facts on the current span and in the log; never the prompt or the key."""
    trace.get_current_span().set_attributes(
        {f"writ.provider.{k}": v for k, v in msgspec.structs.asdict(call).items() if v != ""}
    )
    log.info("model call: %s", msgspec.json.encode(call).decode())
