"""The console's spend page: the tenant's spend against each of its caps, as governance counts
it (`GET /api/v1/spend`), for an approver deciding what to let through."""

from __future__ import annotations

from typing import Any

from actions.base import money
from services.ingress.console._i18n import amount, t
from services.ingress.console._pages import h, layout
from services.ingress.console._session import Viewer

__all__ = ["spend_page"]

_MICROS_PER_CENT = 10_000


def _shown(micros: int, currency: str) -> str:
    """An amount of micros as the locale writes money, in cents rounded up (never less than
    was spent)."""
    return amount(money(-(-micros // _MICROS_PER_CENT), currency))


def _row(s: dict[str, Any]) -> str:
    currency = str(s.get("currency") or "")
    used, held = int(s["used_micros"]), int(s["reserved_micros"])
    limit = s.get("limit")
    if limit is None:
        of, left, share = "—", "—", "—"
    else:
        whole, _, frac = str(limit).partition(".")
        limit_micros = int(whole) * 1_000_000 + int((frac + "000000")[:6])
        of = _shown(limit_micros, currency)
        left = _shown(max(limit_micros - used - held, 0), currency)
        share = f"{(used + held) * 100 // limit_micros if limit_micros else 100} %"
    return (
        f'<tr data-cap="{h(s["cap"])}" data-window="{h(s["window"])}">'
        f'<th scope="row">{h(s["cap"])}</th><td>{h(s.get("agent") or t("spend_all_agents"))}'
        f"</td><td>{h(s['window'])}</td><td>{h(_shown(used, currency))}</td>"
        f"<td>{h(_shown(held, currency))}</td><td>{h(of)}</td>"
        f'<td class="left">{h(left)}</td><td>{h(share)}</td></tr>'
    )


def spend_page(viewer: Viewer, spend: list[dict[str, Any]]) -> str:
    """Each cap's windows, newest first: settled, held by steps in flight, the limit, what is
    left and the share used."""
    heads = ["spend_cap", "spend_agent", "spend_window", "spend_settled", "spend_held"]
    heads += ["spend_limit", "spend_left", "spend_share"]
    header = "".join(f'<th scope="col">{t(k)}</th>' for k in heads)
    rows = "".join(_row(s) for s in spend) or (
        f'<tr class="empty"><td colspan="8">{t("spend_none")}</td></tr>'
    )
    body = (
        f"<h1>{t('spend_title')}</h1><p>{t('spend_intro', tenant=h(viewer.tenant))}</p>"
        f'<div class="table-wrap" role="region" aria-labelledby="spend-caption" tabindex="0">'
        f'<table id="spend"><caption id="spend-caption">{t("spend_caption")}</caption>'
        f"<thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table></div>"
    )
    return layout(t("spend_title"), body, viewer)
