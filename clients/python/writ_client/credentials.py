"""A host's credentials as a deployment hands them over: one folder per tenant
(`writ tenant add` writes `.writ/hosts/<tenant>/`), read once into `HostCredentials`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from writ_client.errors import InvalidRequest
from writ_client.issuer import Issuer

__all__ = ["HostCredentials", "NatsLogin"]

# The folder's files; each is optional but for what the chosen transport needs.
_FILES = ("issuer", "signing.pem", "api.url", "nats.url", "nats.inbox", "nats.creds")
_MAX_FILE = 64 * 1024  # a key, a URL, a creds file: anything longer is not one of them


@dataclass(frozen=True, kw_only=True, repr=False)
class NatsLogin:
    """Where and as whom to connect to NATS: `url` without credentials, then the user and
    password (or a creds file) and the inbox prefix the host's replies must arrive under."""

    url: str
    user: str | None = None
    password: str | None = None
    creds: Path | None = None
    inbox_prefix: str | None = None

    @classmethod
    def parse(
        cls,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        creds: str | Path | None = None,
        inbox_prefix: str | None = None,
    ) -> NatsLogin:
        """Split a URL's `user:password@` off; explicit arguments win over the URL's.

        Without an inbox prefix, a named user's is Writ's convention, `_INBOX.<user>`: a
        host's NATS user may subscribe to nothing else for its replies.
        """
        parts = urlsplit(url)
        if parts.username is not None:
            user = user if user is not None else unquote(parts.username)
            if parts.password is not None and password is None:
                password = unquote(parts.password)
            host = parts.hostname or ""
            netloc = f"[{host}]" if ":" in host else host
            if parts.port is not None:
                netloc += f":{parts.port}"
            url = urlunsplit(parts._replace(netloc=netloc))
        if inbox_prefix is None and user is not None:
            inbox_prefix = f"_INBOX.{user}"
        return cls(
            url=url,
            user=user,
            password=password,
            creds=Path(creds) if creds is not None else None,
            inbox_prefix=inbox_prefix,
        )

    def __repr__(self) -> str:  # never the password
        return f"NatsLogin(url={self.url!r}, user={self.user!r}, inbox={self.inbox_prefix!r})"


@dataclass(frozen=True, kw_only=True, repr=False)
class HostCredentials:
    """One tenant's host credentials: its token issuer and the two doors' addresses."""

    tenant: str
    issuer: Issuer
    api_url: str | None = None
    nats: NatsLogin | None = None

    @classmethod
    def from_dir(cls, path: str | Path, *, tenant: str | None = None) -> HostCredentials:
        """Read a host credentials folder: `issuer` (the token issuer's URL), `signing.pem`
        (the tenant's Ed25519 private key), `api.url` (the HTTP API's base URL), `nats.url`
        (with `user:password@`), `nats.inbox` (the inbox prefix), `nats.creds` (a NATS creds
        file, instead of a password). The tenant is the folder's name unless given.

        Raises:
            InvalidRequest: `issuer` or `signing.pem` is missing, or a file is not one of them.
        """
        folder = Path(path)
        found: dict[str, str] = {}
        for name in _FILES:
            file = folder / name
            if file.is_file():
                if file.stat().st_size > _MAX_FILE:
                    raise InvalidRequest("INVALID_REQUEST", f"{file} is too large")
                found[name] = file.read_text().strip()
        missing = [n for n in ("issuer", "signing.pem") if n not in found]
        if missing:
            raise InvalidRequest("INVALID_REQUEST", f"{folder} has no {' or '.join(missing)}")
        tenant = tenant or folder.resolve().name
        nats = None
        if "nats.url" in found:
            nats = NatsLogin.parse(
                found["nats.url"],
                inbox_prefix=found.get("nats.inbox") or None,
                creds=folder / "nats.creds" if "nats.creds" in found else None,
            )
        return cls(
            tenant=tenant,
            issuer=Issuer(
                tenant=tenant,
                issuer=found["issuer"],
                private_key_pem=found["signing.pem"].encode() + b"\n",
            ),
            api_url=found.get("api.url") or None,
            nats=nats,
        )

    def __repr__(self) -> str:  # never the key
        return f"HostCredentials(tenant={self.tenant!r}, api_url={self.api_url!r}, {self.nats!r})"
