"""Ingress's HTTP door (`/api/v1`, OpenAPI 3.1): the same tokens, bounds and code path as the
NATS subjects, served in-process. Routes in `_runs.py` and `_people.py`; `_api.py` is what they
share (token, verification, Idempotency-Key, reads over the bus)."""

from services.ingress.http._api import Api, Caller, Door
from services.ingress.http._app import PREFIX, build_app, openapi_document
from services.ingress.http._problems import ApiError
from services.ingress.http._server import HttpServer

__all__ = [
    "PREFIX",
    "Api",
    "ApiError",
    "Caller",
    "Door",
    "HttpServer",
    "build_app",
    "openapi_document",
]
