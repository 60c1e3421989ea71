"""The SDK's public surface: every exported name is there and documented, the blocking client
spells out each method of the async one (no `__getattr__`), and the package says it is typed."""

from __future__ import annotations

import inspect
from pathlib import Path

import writ_client
from writ_client import Client, Session, SyncClient, SyncSession


def _public(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


def test_every_exported_name_is_there_and_documented() -> None:
    for name in writ_client.__all__:
        value = getattr(writ_client, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), name


def test_the_blocking_clients_have_every_method_of_the_async_ones() -> None:
    assert _public(Client) - {"aclose", "from_credentials"} <= _public(SyncClient)
    assert _public(Session) <= _public(SyncSession)
    assert "__getattr__" not in vars(SyncClient) and "__getattr__" not in vars(SyncSession)
    for name in _public(SyncClient) - {"close", "from_credentials"}:
        ours = inspect.signature(getattr(SyncClient, name)).parameters
        theirs = inspect.signature(getattr(Client, name)).parameters
        assert list(ours) == list(theirs), name


def test_the_package_is_typed() -> None:
    assert (Path(writ_client.__file__).parent / "py.typed").exists()
