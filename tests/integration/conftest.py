"""Fixtures of the integration tests that serve request/reply endpoints themselves."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator

import nats
import pytest
from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from libs.embedded import EmbeddedNats
from libs.runtime import BatchEndpoint, Endpoint


@pytest.fixture(scope="module")
def private_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server of the module's own: the session's e2e deployments serve and consume
    Writ's `writ.int.*` subjects on the shared one, and a request would go to whichever
    responder answered first."""
    server = EmbeddedNats(tmp_path_factory.mktemp("private-nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def private_nc(private_nats: EmbeddedNats) -> AsyncIterator[Client]:
    """A connection to the module's own nats-server."""
    client = await nats.connect(private_nats.url)
    yield client
    await client.drain()


async def serve(
    nc: Client, name: str, endpoints: Iterable[Endpoint | BatchEndpoint], unique: str
) -> Service:
    """A service's request/reply endpoints, served on `nc` as the service would serve them
    (without its inbox actor or sealer; a request at a time, a batch endpoint's in a batch of
    one); stop it with `.stop()`."""
    micro = await add_service(nc, name=f"writ-{name}-{unique}", version="0.1.0")
    for endpoint in endpoints:
        await micro.add_endpoint(
            name=endpoint.name,
            subject=endpoint.subject,
            handler=_one_at_a_time(endpoint),
            queue_group=f"test-{unique}",
        )
    return micro


def _one_at_a_time(endpoint: Endpoint | BatchEndpoint) -> Callable[[Request], Awaitable[None]]:
    if isinstance(endpoint, Endpoint):
        return endpoint.handler
    handler = endpoint.handler

    async def alone(request: Request) -> None:
        await handler([request])

    return alone
