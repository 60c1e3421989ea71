"""Reads ingress asks of the services that own the state (request/reply on the bus): ingress
holds no database, so `GET /runs/{id}` is a question to the planner."""

from __future__ import annotations

from typing import Final

from schemas.base import Command, Id, Tenant

__all__ = ["RUN_STATUS", "GetRun"]

# `GetRun` -> `schemas.api.RunView`; 404 when the tenant has no such run (yet).
RUN_STATUS: Final = "writ.int.planner.run"


class GetRun(Command):
    """Where one of the tenant's runs stands."""

    tenant: Tenant
    run_id: Id
