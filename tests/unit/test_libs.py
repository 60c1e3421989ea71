"""`libs/`: public surfaces, settings and secrets, and the direction of imports."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from libs.db import load_migrations
from libs.errors import ConfigError, WritError
from libs.settings import BaseSettings, load_settings, read_secret

ROOT = Path(__file__).resolve().parents[2]
# Every public module on disk, so a new one is checked the day it lands.
LIBS = sorted(
    [p.stem for p in (ROOT / "libs").glob("*.py") if not p.stem.startswith("_")]
    + [p.parent.name for p in (ROOT / "libs").glob("*/__init__.py")]
)


# -- public surface (anyio's test_all_attributes) ------------------------------------------


def test_the_known_libs_are_all_there() -> None:
    assert {"actor", "bus", "db", "embedded", "errors", "runtime", "settings", "telemetry"} <= set(
        LIBS
    )


@pytest.mark.parametrize("name", LIBS)
def test_all_attributes(name: str) -> None:
    module = importlib.import_module(f"libs.{name}")
    assert hasattr(module, "__all__"), f"libs.{name} has no __all__"
    exported = module.__all__
    assert len(exported) == len(set(exported)), f"libs.{name}.__all__ has duplicates"
    missing = [attr for attr in exported if not hasattr(module, attr)]
    assert not missing, f"libs.{name}.__all__ names what it lacks: {missing}"
    for attr in exported:
        assert getattr(module, attr).__doc__, f"libs.{name}.{attr} has no docstring"


# -- settings ------------------------------------------------------------------------------


class ExampleSettings(BaseSettings, frozen=True, kw_only=True):
    foo_bar: int = 1
    flag: bool = False
    ratio: float = 0.5
    secret_file: str = ""


def test_settings_map_prefixed_variables_to_fields() -> None:
    settings = load_settings(
        ExampleSettings,
        {
            "WRIT_NATS_URL": "nats://bus:4222",
            "WRIT_FOO_BAR": "7",
            "WRIT_FLAG": "true",
            "WRIT_RATIO": "1.5",
            "WRIT_METRICS_PORT": "9100",
        },
    )
    assert settings == ExampleSettings(
        nats_url="nats://bus:4222", foo_bar=7, flag=True, ratio=1.5, metrics_port=9100
    )


def test_settings_ignore_unrelated_variables() -> None:
    settings = load_settings(
        ExampleSettings,
        {
            "WRIT_NATS_URL": "nats://bus:4222",
            "WRIT_CRM_TOKEN_FILE": "/run/secrets/crm",  # another service's setting: no field here
            "FOO_BAR": "8",
            "NATS_URL": "nats://elsewhere",
            "PATH": "/usr/bin",
            "XWRIT_FOO_BAR": "9",
            "writ_foo_bar": "10",
        },
    )
    assert settings == ExampleSettings(nats_url="nats://bus:4222")
    assert not hasattr(settings, "crm_token_file")


def test_the_event_loop_is_uvloop_unless_asyncio_is_asked_for_and_nothing_else() -> None:
    base = {"WRIT_NATS_URL": "nats://bus:4222"}
    assert load_settings(BaseSettings, base).event_loop == "uvloop"
    assert (
        load_settings(BaseSettings, {**base, "WRIT_EVENT_LOOP": "asyncio"}).event_loop == "asyncio"
    )
    with pytest.raises(ConfigError, match="event_loop"):
        load_settings(BaseSettings, {**base, "WRIT_EVENT_LOOP": "trio"})


def test_settings_defaults() -> None:
    settings = load_settings(BaseSettings, {"WRIT_NATS_URL": "nats://bus:4222"})
    assert settings.metrics_port == 0
    assert settings.metrics_host == "127.0.0.1"
    assert settings.drain_timeout_s == 10.0
    assert settings.retry_backoff_max_s == 30.0
    assert settings.outage_limit_s == 900.0


def test_the_redelivery_backoff_doubles_up_to_the_consumers_cap() -> None:
    from libs._settle import _backoff
    from libs.bus import ConsumerSpec

    spec = ConsumerSpec(stream="S", durable="d", filter_subjects=("s",))
    assert [_backoff(n, spec) for n in range(1, 11)] == [
        0.25,
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
        30.0,
    ]
    short = ConsumerSpec(stream="S", durable="d", filter_subjects=("s",), backoff_max_s=2.0)
    assert [_backoff(n, short) for n in range(1, 7)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    settings = load_settings(
        BaseSettings,
        {
            "WRIT_NATS_URL": "nats://bus:4222",
            "WRIT_RETRY_BACKOFF_MAX_S": "2",
            "WRIT_OUTAGE_LIMIT_S": "120",
        },
    )
    assert settings.retry_backoff_max_s == 2.0
    assert settings.outage_limit_s == 120.0


@pytest.mark.parametrize(
    "environ",
    [
        {"WRIT_NATS_URL": "nats://bus:4222", "WRIT_FOO_BAR": "seven"},
        {"WRIT_NATS_URL": "nats://bus:4222", "WRIT_FLAG": "perhaps"},
        {"WRIT_NATS_URL": "nats://bus:4222", "WRIT_METRICS_PORT": "9100.5x"},
        {"WRIT_FOO_BAR": "7"},  # required nats_url missing
    ],
    ids=["bad-int", "bad-bool", "bad-port", "missing-required"],
)
def test_settings_bad_value_is_a_config_error(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="ExampleSettings") as info:
        load_settings(ExampleSettings, environ)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, WritError)


def test_settings_read_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WRIT_NATS_URL", "nats://from-env:4222")
    monkeypatch.setenv("WRIT_FOO_BAR", "42")
    settings = load_settings(ExampleSettings)
    assert (settings.nats_url, settings.foo_bar) == ("nats://from-env:4222", 42)


def test_read_secret_strips_the_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    assert read_secret(path) == "s3cret-token"
    assert read_secret(str(path)) == "s3cret-token"


def test_read_secret_keeps_inner_content(tmp_path: Path) -> None:
    path = tmp_path / "pem"
    pem = "-----BEGIN KEY-----\nAAAA\nBBBB\n-----END KEY-----"
    path.write_text(pem + "\n")
    assert read_secret(path) == pem


def test_missing_secret_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing-secret"):
        read_secret(tmp_path / "missing-secret")


def test_secret_that_is_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        read_secret(tmp_path)


# -- import direction: services -> libs -> schemas, and services never import each other ---


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, source: str | None = None) -> set[str]:
    """Every module `path` imports, relative imports resolved, `from x import y` as x.y too."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _sources(folder: str) -> list[Path]:
    paths = sorted((ROOT / folder).rglob("*.py"))
    assert paths, f"no sources under {folder}/"
    return paths


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_import_scanner_sees_every_form() -> None:
    # The layering tests below rely on this scanner: check it on known inputs.
    source = (
        "import services.beta.x\nfrom services import gamma\n"
        "from ..delta import y\nfrom . import z\nimport os\n"
        "def f():\n    import services.epsilon\n"
    )
    found = _imports(ROOT / "services" / "alpha" / "mod.py", source)
    assert {
        "services.beta.x",
        "services.gamma",
        "services.delta",
        "services.delta.y",
        "services.alpha.z",
        "services.epsilon",
        "os",
    } <= found


@pytest.mark.parametrize("folder", ["libs", "schemas"])
def test_libs_and_schemas_never_import_services(folder: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imports(path) if _is_under(m, "services") or _is_under(m, "writ")
        )
        for path in _sources(folder)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_libs_and_schemas_source_text_never_mentions_importing_services() -> None:
    for path in _sources("libs") + _sources("schemas"):
        text = path.read_text()
        assert "import services" not in text, path
        assert "from services" not in text, path


def test_schemas_import_only_msgspec_the_stdlib_and_schemas() -> None:
    allowed = set(sys.stdlib_module_names) | {"msgspec", "schemas"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imports(path) if m.split(".")[0] not in allowed
        )
        for path in _sources("schemas")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_services_never_import_each_other() -> None:
    names = sorted(
        p.name for p in (ROOT / "services").iterdir() if p.is_dir() and (p / "__init__.py").exists()
    )
    assert {"admission", "dispatcher", "governance", "ingress", "planner", "retrieval"} <= set(
        names
    )
    offenders: dict[str, list[str]] = {}
    for name in names:
        for path in _sources(f"services/{name}"):
            foreign = sorted(
                m
                for m in _imports(path)
                if _is_under(m, "services")
                and m != "services"
                and not _is_under(m, f"services.{name}")
            )
            if foreign:
                offenders[str(path.relative_to(ROOT))] = foreign
    assert offenders == {}


def test_a_migration_includes_the_shared_journal_tables_in_its_own_schema(tmp_path: Path) -> None:
    (tmp_path / "001_journal.sql").write_text("-- ours\n{include:journal}\n")
    [migration] = load_migrations("ledger", tmp_path)
    assert migration.sql.startswith("-- ours\n")
    assert "CREATE TABLE ledger.journal (" in migration.sql
    assert "TO {role:ledger};" in migration.sql
    assert "{schema}" not in migration.sql and "{include" not in migration.sql


def test_a_free_port_is_drawn_below_the_ephemeral_range_and_is_bindable() -> None:
    """Outgoing connections take their source ports from the ephemeral range; a port chosen
    there for a server started later could be taken by one of them."""
    import socket

    from libs.embedded import _ephemeral_low, free_port

    low = _ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(10_000 <= port < low for port in ports)
    assert len(ports) > 1  # drawn, not fixed
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports.pop()))
