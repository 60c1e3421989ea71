"""A registered tenant ingress has not yet tried to bind is answered `UNAVAILABLE`, to be
retried, never `UNKNOWN_TENANT`, which a host takes as final: on a real nats-server, before
ingress has bound the tenants' consumers, after it has, and for a registered tenant whose
streams do not exist."""

from __future__ import annotations

import anyio
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from libs.provision import provision_bus
from libs.runtime import Runtime
from libs.telemetry import make_tracer_provider
from services.ingress.logic import Rejection, TenantKey
from services.ingress.service import IngressService
from writ.stack import mint_token

pytestmark = pytest.mark.anyio

_KEY = Ed25519PrivateKey.generate()
PRIVATE = _KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
PUBLIC = (
    _KEY.public_key()
    .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    .decode()
)


def _issuer(tenant: str) -> str:
    return f"https://idp.{tenant}.example"


def _token(tenant: str) -> str:
    return mint_token(
        PRIVATE, issuer=_issuer(tenant), tenant=tenant, principal="ops@x.example", ttl_s=600
    )


def _code(svc: IngressService, tenant: str) -> str:
    checked = svc.check_token(_token(tenant), tenant=tenant)
    return checked.code if isinstance(checked, Rejection) else "OK"


async def test_a_registered_tenant_not_bound_yet_is_unavailable_not_unknown(
    private_nc: Client,
) -> None:
    js = private_nc.jetstream()
    await provision_bus(js, ["acme"])  # initech is registered, never provisioned
    keys = {t: TenantKey(issuer=_issuer(t), public_key=PUBLIC) for t in ("acme", "initech")}
    rt = Runtime(
        name="ingress",
        nc=private_nc,
        js=js,
        registry=CollectorRegistry(),
        tracer_provider=make_tracer_provider("ingress"),
    )
    svc = IngressService(rt=rt, keys=keys, audience="writ", max_request_bytes=64 * 1024)
    # Not tried yet (ingress starting): to be retried, whether or not it turns out to exist.
    assert _code(svc, "acme") == "UNAVAILABLE"
    assert _code(svc, "initech") == "UNAVAILABLE"
    assert _code(svc, "globex") == "UNKNOWN_TENANT"  # not registered at all
    write = svc.verify("requests", b"{}", tenant="acme", request_id="r-1")
    assert isinstance(write, Rejection) and write.code == "UNAVAILABLE"
    async with anyio.create_task_group() as tg:
        await tg.start(svc.run)
        assert _code(svc, "acme") == "OK"
        # Tried, and initech has no streams: unknown, as final as the host should take it.
        assert _code(svc, "initech") == "UNKNOWN_TENANT"
        assert _code(svc, "globex") == "UNKNOWN_TENANT"
        rt.stopping.set()
        tg.cancel_scope.cancel()
