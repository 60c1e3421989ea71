"""Connectors: the only code in Writ that acts on business systems, with their credentials."""

from services.dispatcher.connectors.base import Connector, Contract, Result
from services.dispatcher.connectors.crm import CrmConnector
from services.dispatcher.connectors.host import HostConnector
from services.dispatcher.connectors.noop import NoopConnector
from services.dispatcher.connectors.payments import PaymentConnector

__all__ = [
    "Connector",
    "Contract",
    "CrmConnector",
    "HostConnector",
    "NoopConnector",
    "PaymentConnector",
    "Result",
]
