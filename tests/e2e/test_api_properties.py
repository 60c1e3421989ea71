"""A property-based test of the HTTP API generated from its committed OpenAPI document
(schemathesis) against the real server and the six processes: a bounded number of examples per
operation, and none gets a 5xx or a response (status, content type, body) the document does
not describe."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.schemas import BaseSchema
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from writ.stack import Stack

pytestmark = pytest.mark.e2e

DOCUMENT = Path(__file__).parents[2] / "schemas" / "openapi.json"
schema: BaseSchema = schemathesis.openapi.from_path(str(DOCUMENT))
# Long-polls and streams wait by design (up to a minute): what they answer is tested in
# test_http_api.py and test_http_events.py.
schema = schema.exclude(path_regex=r"/(wait|events)$")


@pytest.fixture(scope="module")
def stack(admin_dsn: str) -> Iterator[Stack]:
    """A deployment of its own (its own nats-server, its own database): what the examples
    create, and anything they might break, stays out of the other tests' way."""
    with tempfile.TemporaryDirectory(prefix="writ-e2e-api-") as home:
        deployment = Stack(
            Path(home), admin_dsn=admin_dsn, database=f"e2e_api_{uuid.uuid4().hex[:8]}"
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


@schema.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_example_breaks_the_document(case: schemathesis.Case, stack: Stack) -> None:
    token = stack.token("acme", "ops@acme.example", roles=["approver", "auditor"])
    case.call_and_validate(
        base_url=stack.api_url,  # the document's server, `/api/v1`, on the stack's origin
        timeout=60,
        headers={"Authorization": f"Bearer {token}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
