"""Spend against caps as Prometheus gauges, refreshed from governance's store (`current`).

Labels stay bounded: the cap's name (at most 100 per signed price table, chosen by the
operator), the table's currency, and `tenant`, which is the tenant's name only for the tenants
the operator lists (`WRIT_SPEND_LABEL_TENANTS`) and `""` for every other, whose caps of the
same name and currency are summed. Only each cap's current window counts (the tenant's day or
month), so a gauge starts again from 0 at the tenant's midnight or month.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.governance.spend import MICROS

__all__ = ["SpendGauges"]

_LABELS = ["cap", "tenant", "currency"]


class SpendGauges(Collector):
    """`writ_governance_spend_settled`, `_held` and `_limit`, in the currency's units."""

    def __init__(self, registry: CollectorRegistry, label_tenants: Iterable[str] = ()) -> None:
        self._label_tenants = frozenset(label_tenants)
        # (cap, tenant label, currency) -> [settled, held, limit], in micros.
        self._values: dict[tuple[str, str, str], list[int]] = {}
        registry.register(self)

    def update(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace every value with `rows` (`SpendStore.current`: one per tenant and cap)."""
        values: dict[tuple[str, str, str], list[int]] = {}
        for r in rows:
            tenant = r["tenant"] if r["tenant"] in self._label_tenants else ""
            summed = values.setdefault((r["cap"], tenant, r["currency"]), [0, 0, 0])
            summed[0] += r["used_micros"]
            summed[1] += r["reserved_micros"]
            summed[2] += r["limit_micros"]
        self._values = values

    def collect(self) -> Iterator[GaugeMetricFamily]:
        names = (
            ("settled", "Spend settled in each cap's current window, in its currency"),
            ("held", "Spend held by steps in flight in each cap's current window"),
            ("limit", "Each cap's limit, in its currency (summed over unlisted tenants)"),
        )
        values = self._values
        for i, (name, doc) in enumerate(names):
            family = GaugeMetricFamily(f"writ_governance_spend_{name}", doc, labels=_LABELS)
            for labels, v in sorted(values.items()):
                family.add_metric(list(labels), v[i] / MICROS)
            yield family
