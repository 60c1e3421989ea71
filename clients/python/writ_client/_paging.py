"""Every item of a cursor-paged list, page after page, as both clients' `iter_*` give them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

__all__ = ["every"]

P = TypeVar("P")
T = TypeVar("T")


async def every(
    page: Callable[[str | None], Awaitable[P]],
    items: Callable[[P], Sequence[T]],
    after: Callable[[P], str | None],
) -> AsyncIterator[T]:
    """The items of `page(None)`, then of `page(after(it))`, ..., until a page names no next
    cursor (or is empty): each item once, however many pages there are."""
    cursor: str | None = None
    while True:
        got = await page(cursor)
        found = items(got)
        for item in found:
            yield item
        cursor = after(got)
        if cursor is None or not found:
            return
