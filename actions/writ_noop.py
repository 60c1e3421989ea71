"""`writ.noop`: do nothing, through the whole governed path (a canary, and the bench's action)."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from actions.base import ActionContract

__all__ = ["NoopArguments", "WritNoop"]


class NoopArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The model's request, which is also the frozen arguments and the preview."""

    marker: Annotated[str, msgspec.Meta(max_length=128)] = ""


class WritNoop(ActionContract[NoopArguments, NoopArguments, NoopArguments, msgspec.Struct]):
    name: ClassVar[str] = "writ.noop"
    version: ClassVar[int] = 1
    family = "write_delete"
    standing_grant = "allowed"  # a record of the organisation's own: a grant may cover it
    connector: ClassVar[str] = "noop"
    description: ClassVar[str] = "Do nothing, governed like any other write."
    request = NoopArguments
    arguments = NoopArguments
    preview = NoopArguments
