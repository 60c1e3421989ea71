"""Retrieval: gathers tenant-scoped evidence for runs and executes read capabilities.

Read-only, and everything it returns is marked untrusted: a document that gives orders is still
only a document. A read runs only after governance's `decide` allowed it, on the tenant the
request names (the run's, as ingress verified it), never one the arguments name.
"""

from __future__ import annotations

import logging
import time
from typing import TypeVar

import anyio
import anyio.abc
import msgspec
from nats.micro.request import Request
from opentelemetry.trace import SpanKind
from prometheus_client import Counter

from libs.decide import DecideUnavailable, decide
from libs.runtime import Endpoint, Runtime
from libs.telemetry import ActorMetrics, extract_context
from schemas import subjects
from schemas.base import MAX_MESSAGE_BYTES
from schemas.dispatcher import ReadFacts
from schemas.governance import DecideRequest, Decision
from schemas.mcp import DescribedTool, DescribeTools, ListServer, ListServers, ToolDescriptions
from schemas.retrieval import (
    EvidenceFound,
    ReadCapability,
    ReadRefused,
    ReadResult,
    RefusalCode,
    SearchEvidence,
)
from services.retrieval.mcp import McpReads
from services.retrieval.store import RetrievalStore
from services.retrieval.tools import TOOLS, InvalidArguments, decode_arguments, first_argument

__all__ = ["RetrievalService"]

log = logging.getLogger("writ.retrieval")
T = TypeVar("T")


class RetrievalService:
    """Request/reply only: a starting run's evidence (`SearchEvidence`), read capabilities
    (`ReadCapability`), and federation's listings and host facts."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: RetrievalStore,
        decide_timeout_s: float = 2.0,
        mcp: McpReads | None = None,
    ) -> None:
        self._rt, self._store, self._decide_timeout = rt, store, decide_timeout_s
        self._mcp = mcp
        self._list_decoder = msgspec.json.Decoder(ListServer)
        self._servers_decoder = msgspec.json.Decoder(ListServers)
        self._facts_decoder = msgspec.json.Decoder(ReadFacts)
        self._describe_decoder = msgspec.json.Decoder(DescribeTools)
        self._search_decoder = msgspec.json.Decoder(SearchEvidence)
        self._read_decoder = msgspec.json.Decoder(ReadCapability)
        self._decision_decoder = msgspec.json.Decoder(Decision)
        self._encoder = msgspec.json.Encoder()
        # `tool` is a registered tool name or "unknown", `outcome` one of six: bounded.
        self._reads = Counter(
            "writ_retrieval_reads",
            "Read capabilities, by outcome",
            ["tool", "outcome"],
            registry=rt.registry,
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve searches and reads until stopped (retrieval consumes no stream)."""
        self._rt.endpoints += self.endpoints()
        task_status.started()
        await self._rt.stopping.wait()

    def endpoints(self) -> list[Endpoint]:
        """The request/reply endpoints `run` serves (tests may serve them alone)."""
        found = [
            Endpoint("search", subjects.SEARCH, self._on_search),
            Endpoint("read", subjects.READ, self._on_read),
        ]
        if self._mcp is not None:
            found += [
                Endpoint("mcp_list", subjects.MCP_LIST, self._on_list),
                Endpoint("mcp_servers", subjects.MCP_SERVERS, self._on_servers),
                Endpoint("mcp_catalog", subjects.MCP_CATALOG, self._on_catalog),
                Endpoint("host_facts", subjects.HOST_FACTS, self._on_facts),
            ]
        return found

    async def _on_search(self, request: Request) -> None:
        """A starting run's evidence: the tenant's documents that best match its input (503
        if they cannot be read now: the starter retries, nothing starts meanwhile)."""
        started = time.perf_counter()
        metrics = self._rt.metrics
        ask = await _decoded(request, self._search_decoder, metrics, "search")
        if ask is None:
            return
        with self._rt.tracer.start_as_current_span(
            "retrieval search", context=extract_context(request.headers), kind=SpanKind.SERVER
        ) as span:
            try:
                evidence = await self._store.search(ask.tenant, ask.input)
            except Exception as exc:
                log.warning("run %s: documents not searched: %r", ask.run_id, exc)
                metrics.failed.labels("search", "unavailable").inc()
                await request.respond_error("503", "the documents cannot be searched now")
                return
            span.set_attribute("writ.evidence.count", len(evidence))
        await request.respond(
            self._encoder.encode(EvidenceFound(run_id=ask.run_id, evidence=evidence))
        )
        metrics.handled.labels("search").inc()
        metrics.latency.labels("search").observe(time.perf_counter() - started)

    # -- read capabilities ------------------------------------------------------------------

    async def _on_read(self, request: Request) -> None:
        started = time.perf_counter()
        metrics = self._rt.metrics
        ask = await _decoded(request, self._read_decoder, metrics, "read")
        if ask is None:
            return
        # Continue the caller's trace: one run is one trace, request/reply included.
        with self._rt.tracer.start_as_current_span(
            "retrieval read", context=extract_context(request.headers), kind=SpanKind.SERVER
        ) as span:
            span.set_attribute("writ.read.tool", _tool_label(ask.tool))
            answer = await self.read(ask)
            span.set_attribute("writ.read.outcome", _outcome(answer))
        await request.respond(self._encoder.encode(answer))
        metrics.handled.labels("read").inc()
        metrics.latency.labels("read").observe(time.perf_counter() - started)

    async def read(self, ask: ReadCapability) -> ReadResult | ReadRefused:
        """Check the call, ask governance, then run the tool on the request's tenant."""
        answer = await self._read(ask)
        self._reads.labels(_tool_label(ask.tool), _outcome(answer)).inc()
        return answer

    async def _read(self, ask: ReadCapability) -> ReadResult | ReadRefused:
        if ask.tool.startswith("mcp:"):
            if self._mcp is None:
                return _refused(ask, "UNKNOWN_TOOL", "no MCP server is registered here")
            return await self._mcp.read(ask)
        tool = TOOLS.get(ask.tool)
        if tool is None:
            return _refused(ask, "UNKNOWN_TOOL", f"no read tool named {ask.tool}")
        try:
            arguments = decode_arguments(tool.spec, ask.arguments)
        except InvalidArguments as exc:
            return _refused(ask, "INVALID_ARGUMENTS", str(exc))
        try:
            decision = await self._decide(ask, first_argument(arguments))
        except _Unavailable as exc:
            return _refused(ask, "UNAVAILABLE", str(exc), retryable=True)
        if decision.verdict != "allow":
            return _refused(
                ask,
                "DENIED" if decision.verdict == "deny" else "ASK",
                decision.reason,
                decision=decision,
            )
        try:
            output = await tool.execute(self._store, ask.tenant, arguments)
        except Exception as exc:  # the store's trouble is the caller's retry, never a result
            log.warning("read %s failed: %r", ask.tool, exc)
            return _refused(
                ask,
                "UNAVAILABLE",
                f"{ask.tool} could not be read now",
                retryable=True,
                decision=decision,
            )
        return ReadResult(
            run_id=ask.run_id,
            tool=ask.tool,
            decision_id=decision.decision_id,
            items=output.items,
            truncated=output.truncated,
        )

    async def _decide(self, ask: ReadCapability, first: str) -> Decision:
        request = DecideRequest(
            tenant=ask.tenant,
            principal=ask.principal,
            agent=ask.agent,
            run_id=ask.run_id,
            tool=ask.tool,
            first_argument=first,
            approval_id=ask.approval_id,
        )
        try:
            return await decide(self._rt.nc, request, timeout=self._decide_timeout)
        except DecideUnavailable as exc:  # no answer is not an allow
            raise _Unavailable(str(exc)) from exc

    # -- federation: operators' listings and admission's host facts --------------------------

    async def _on_list(self, request: Request) -> None:
        assert self._mcp is not None
        try:
            ask = self._list_decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ListServer: {exc}"[:500])
            return
        await request.respond(self._encoder.encode(await self._mcp.list_server(ask)))

    async def _on_servers(self, request: Request) -> None:
        assert self._mcp is not None
        try:
            ask = self._servers_decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ListServers: {exc}"[:500])
            return
        await request.respond(self._encoder.encode(self._mcp.registered(ask.tenant)))

    async def _on_catalog(self, request: Request) -> None:
        try:
            ask = self._describe_decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid DescribeTools: {exc}"[:500])
            return
        try:
            rows = await self._store.described(ask.tenant, list(ask.capabilities))
        except Exception as exc:
            log.warning("mcp catalog not read: %r", exc)
            await request.respond_error("503", "the classification cannot be read now")
            return
        answer = ToolDescriptions(tools=[msgspec.convert(r, DescribedTool) for r in rows])
        await request.respond(self._encoder.encode(answer))

    async def _on_facts(self, request: Request) -> None:
        assert self._mcp is not None
        try:
            ask = self._facts_decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ReadFacts: {exc}"[:500])
            return
        try:
            answer = await self._mcp.facts(ask)
        except Exception as exc:  # admission retries; the reason goes back with the error
            log.warning("host facts not read: %s", exc)
            await request.respond_error("503", str(exc)[:500])
            return
        await request.respond(self._encoder.encode(answer))


def _tool_label(tool: str) -> str:
    """A bounded metric label: a registered read tool, `mcp` for any `mcp:` one, or unknown."""
    return tool if tool in TOOLS else "mcp" if tool.startswith("mcp:") else "unknown"


class _Unavailable(Exception):
    """Governance gave no usable answer: the read is refused, and may be asked again."""


def _refused(
    ask: ReadCapability,
    code: RefusalCode,
    reason: str,
    *,
    retryable: bool = False,
    decision: Decision | None = None,
) -> ReadRefused:
    return ReadRefused(
        run_id=ask.run_id,
        tool=ask.tool,
        code=code,
        reason=reason[:500],
        retryable=retryable,
        decision_id=decision.decision_id if decision else None,
        pending_id=decision.pending_id if decision else None,
        line=decision.line if decision else None,
    )


def _outcome(answer: ReadResult | ReadRefused) -> str:
    return "allowed" if isinstance(answer, ReadResult) else answer.code.lower()


async def _decoded(
    request: Request, decoder: msgspec.json.Decoder[T], metrics: ActorMetrics, endpoint: str
) -> T | None:
    """The request's body as `decoder`'s type; None once it was answered 413 (over the bound)
    or 400 (not that type), the reason counted under `endpoint`."""
    what = decoder.type.__name__
    if len(request.data) > MAX_MESSAGE_BYTES:
        metrics.failed.labels(endpoint, "too_large").inc()
        await request.respond_error("413", f"{what} over {MAX_MESSAGE_BYTES} bytes")
        return None
    try:
        return decoder.decode(request.data)
    except msgspec.DecodeError as exc:
        metrics.failed.labels(endpoint, "undecodable").inc()
        await request.respond_error("400", f"invalid {what}: {exc}"[:500])
        return None
