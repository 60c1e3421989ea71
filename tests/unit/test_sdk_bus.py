"""`Bus.guarded`: a call's own error comes out as it is, and a permission violation the server
reports meanwhile ends the call at once as `PermissionDenied` (pure: no server)."""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest

from writ_client import PermissionDenied
from writ_client._bus import Bus

pytestmark = pytest.mark.anyio


def _bus() -> Bus:
    return Bus(cast(Any, None))


async def test_a_calls_error_is_raised_as_it_is() -> None:
    async def times_out() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await _bus().guarded(times_out)


async def test_a_violation_meanwhile_is_permission_denied_at_once() -> None:
    bus = _bus()

    async def waits() -> int:
        await anyio.sleep(30)
        return 1

    async def refuse() -> None:
        await anyio.sleep(0.05)
        await bus.on_error(Exception('nats: permissions violation for publish to "x.y"'))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(refuse)
            with pytest.raises(PermissionDenied, match='publish to "x.y"'):
                await bus.guarded(waits)

    # An earlier violation does not end the next call.
    async def answers() -> int:
        return 7

    assert await bus.guarded(answers) == 7
