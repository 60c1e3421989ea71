"""The audit journal: encrypted rows written with the state change, sealed into a signed chain.

One journal per service, in the service's own schema (`<schema>.journal`, `.journal_seals`,
`.journal_checkpoints`; see `services/governance/migrations/005_journal.sql`).

Writing (the hot path) is one more INSERT in the caller's transaction, or a CTE in the caller's
statement: the payload is encrypted with AES-GCM under the service's active data key, with the
row's service, tenant, kind, subject, run and key id as associated data. No lock, no sequence the
writers wait on: a row only gets its place in the chain later.

Sealing (a background task of the same process) chains committed rows into a hash chain and
signs a checkpoint per batch with the service's Ed25519 key. The chain order is (xid, id), not id
alone: a row is sealed only once its transaction id is below the xmin of the sealer's snapshot.
Every transaction that can still commit a row has an xid >= that xmin (it is in flight, or has no
xid yet and will get one >= xmax), so nothing can ever commit before the head of the chain and
the chain has no gaps. Ordering by id with the same xmin test would not be safe: an identity
value is drawn at insert time, not when the xid is assigned, so a transaction still in flight
can hold a lower id than a row that is already sealable.

Verifying needs only the public keys: it recomputes every hash, checks every checkpoint and its
signature, that seq is contiguous, that (xid, id) grows along the chain, that no row outside the
chain sorts before its head or waits longer than a grace period, and names the first bad entry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import anyio
import anyio.abc
import asyncpg
import msgspec
import rfc8785
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from libs.errors import ConfigError, WritError
from libs.settings import read_secret

__all__ = [
    "DataKeys",
    "Entry",
    "Journal",
    "JournalError",
    "Problem",
    "Sealer",
    "SigningKey",
    "VerifyReport",
    "checkpoint_message",
    "entry_hash",
    "genesis_hash",
    "load_verify_keys",
    "open_journal",
    "read_entries",
    "verify",
]

VERSION: Final = 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
log = logging.getLogger("writ.journal")


class JournalError(WritError):
    """A journal row cannot be opened: unknown key, or not authentic (edited or forged)."""

    def __init__(self, msg: str, *, entry_id: int | None = None) -> None:
        super().__init__(msg)
        self.entry_id = entry_id


# -- keys -------------------------------------------------------------------------------------


class DataKeys:
    """AES-256-GCM keys of one journal's payloads by key id: `active` encrypts, all decrypt.

    The key file is JSON: `{"active": "<id>", "keys": {"<id>": "<base64 of 32 bytes>"}}`. Keep
    retired keys in it for as long as their rows must be read.
    """

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if active not in keys:
            raise ConfigError(f"journal data key {active!r} is not among the keys")
        bad = [k for k, v in keys.items() if len(v) != 32]
        if bad:
            raise ConfigError(f"journal data keys must be 32 bytes: {bad}")
        self.active = active
        self._aead = {key_id: AESGCM(key) for key_id, key in keys.items()}

    @classmethod
    def from_json(cls, text: str | bytes) -> DataKeys:
        """Parse a data key file."""
        try:
            doc = json.loads(text)
            return cls({k: base64.b64decode(v, validate=True) for k, v in doc["keys"].items()},
                       doc["active"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid journal data key file: {exc!r}") from None

    @staticmethod
    def generate(key_id: str, existing: str | None = None) -> str:
        """A key file whose active key is a new one; `existing` keys are kept to decrypt."""
        doc = json.loads(existing) if existing else {"keys": {}}
        doc["keys"][key_id] = base64.b64encode(AESGCM.generate_key(bit_length=256)).decode()
        doc["active"] = key_id
        return json.dumps(doc, indent=2)

    def encrypt(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes, bytes]:
        """(key id, nonce, ciphertext) under the active key."""
        nonce = secrets.token_bytes(12)
        return self.active, nonce, self._aead[self.active].encrypt(nonce, plaintext, aad)

    def decrypt(self, key_id: str, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
        """The plaintext, or JournalError if the key is unknown or the row is not authentic."""
        aead = self._aead.get(key_id)
        if aead is None:
            raise JournalError(f"unknown journal data key {key_id!r}")
        try:
            return aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise JournalError("not authentic (edited, moved or forged)") from None


class SigningKey:
    """A service's Ed25519 checkpoint signing key and its id.

    The key file is JSON: `{"key_id": "<id>", "private_key": "<PKCS8 PEM>"}`. To rotate, give the
    service a new file and add the new public key to the verifiers' key file, keeping the old one:
    checkpoints record the key id they were signed with.
    """

    def __init__(self, key_id: str, private_key: Ed25519PrivateKey) -> None:
        self.key_id, self._key = key_id, private_key

    @classmethod
    def from_json(cls, text: str | bytes) -> SigningKey:
        """Parse a signing key file."""
        try:
            doc = json.loads(text)
            key = serialization.load_pem_private_key(doc["private_key"].encode(), password=None)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"invalid journal signing key file: {exc!r}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError("the journal signing key must be an Ed25519 private key")
        return cls(str(doc["key_id"]), key)

    @classmethod
    def generate(cls, key_id: str) -> SigningKey:
        """A new key."""
        return cls(key_id, Ed25519PrivateKey.generate())

    def to_json(self) -> str:
        """The key file's contents (a secret)."""
        pem = self._key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()
        return json.dumps({"key_id": self.key_id, "private_key": pem}, indent=2)

    def public_pem(self) -> str:
        """The public half, for verifiers."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature."""
        return self._key.sign(message)


def load_verify_keys(text: str | bytes) -> dict[str, dict[str, Ed25519PublicKey]]:
    """Parse `{"<service>": {"<key id>": "<public key PEM>"}}`: each service's own keys only."""
    try:
        doc = json.loads(text)
        out: dict[str, dict[str, Ed25519PublicKey]] = {}
        for service, keys in doc.items():
            out[service] = {}
            for key_id, pem in keys.items():
                key = serialization.load_pem_public_key(pem.encode())
                if not isinstance(key, Ed25519PublicKey):
                    raise ValueError(f"{service}/{key_id} is not an Ed25519 public key")
                out[service][key_id] = key
        return out
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(f"invalid journal verification key file: {exc!r}") from None


# -- canonical encodings ----------------------------------------------------------------------


def _aad(service: str, tenant: str, kind: str, subject: str, run_id: str, key_id: str) -> bytes:
    return rfc8785.dumps([f"writ-journal/{VERSION}", service, tenant, kind, subject, run_id,
                          key_id])


def genesis_hash(service: str) -> bytes:
    """The `prev_hash` of a service's first entry: chains of two services never splice."""
    return hashlib.sha256(f"writ-journal/{VERSION}:{service}".encode()).digest()


def entry_hash(prev: bytes, *, service: str, seq: int, row: Mapping[str, Any]) -> bytes:
    """sha256(prev || RFC 8785 encoding of the entry: its place and every stored column)."""
    micros = (row["recorded_at"] - _EPOCH) // timedelta(microseconds=1)
    doc = {"v": VERSION, "service": service, "seq": str(seq), "id": str(row["id"]),
           "xid": str(row["xid"]), "tenant": row["tenant"], "kind": row["kind"],
           "subject": row["subject"], "run_id": row["run_id"], "recorded_at": str(micros),
           "key_id": row["key_id"], "nonce": base64.b64encode(row["nonce"]).decode(),
           "ciphertext": base64.b64encode(row["ciphertext"]).decode()}
    return hashlib.sha256(prev + rfc8785.dumps(doc)).digest()


def checkpoint_message(service: str, seq: int, prev_seq: int, head: bytes, key_id: str) -> bytes:
    """What a checkpoint's Ed25519 signature covers (RFC 8785 JSON)."""
    return rfc8785.dumps({"v": VERSION, "service": service, "seq": str(seq),
                          "prev_seq": str(prev_seq), "head": head.hex(), "key_id": key_id})


# -- writing ----------------------------------------------------------------------------------


class Entry(msgspec.Struct, frozen=True, array_like=True):
    """One journal row's values, in the column order of `Journal.COLUMNS`."""

    tenant: str
    kind: str
    subject: str
    run_id: str
    key_id: str
    nonce: bytes
    ciphertext: bytes


class Journal:
    """Makes one service's journal rows; the caller writes them in its own transaction."""

    COLUMNS: Final = "tenant, kind, subject, run_id, key_id, nonce, ciphertext"

    def __init__(self, *, service: str, keys: DataKeys, schema: str | None = None) -> None:
        self.service, self.keys = service, keys
        self.schema = schema or service
        self._encoder = msgspec.json.Encoder()

    @property
    def insert_sql(self) -> str:
        """`INSERT` of one row; parameters $1..$7 are `Entry`'s fields in order."""
        return (f"INSERT INTO {self.schema}.journal ({self.COLUMNS}) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7)")

    def cte(self, first: int, name: str = "journal_row") -> str:
        """A data-modifying CTE writing one row from parameters $first..$first+6.

        `WITH <this> INSERT INTO ... VALUES ($1...)` records the state change and its journal
        row in one statement, hence one transaction, without BEGIN and COMMIT round trips.
        """
        params = ", ".join(f"${first + i}" for i in range(7))
        return f"{name} AS (INSERT INTO {self.schema}.journal ({self.COLUMNS}) VALUES ({params}))"

    def cte_if(self, first: int, exists: str, name: str = "journal_row") -> str:
        """Like `cte`, but the row is written only if the CTE named `exists` returned a row:
        a redelivered statement that changed nothing journals nothing."""
        params = ", ".join(f"${first + i}" for i in range(7))
        return (f"{name} AS (INSERT INTO {self.schema}.journal ({self.COLUMNS}) "
                f"SELECT {params} WHERE EXISTS (SELECT 1 FROM {exists}))")

    def entry(self, *, tenant: str, kind: str, subject: str, payload: object,
              run_id: str = "") -> Entry:
        """Encrypt `payload` (anything msgspec encodes) into a row bound to its identifiers."""
        plaintext = self._encoder.encode(payload)
        aad = _aad(self.service, tenant, kind, subject, run_id, self.keys.active)
        key_id, nonce, ciphertext = self.keys.encrypt(plaintext, aad)
        return Entry(tenant, kind, subject, run_id, key_id, nonce, ciphertext)

    async def write(self, conn: asyncpg.Connection, *, tenant: str, kind: str, subject: str,
                    payload: object, run_id: str = "") -> None:
        """Insert one row on `conn` (inside the caller's transaction)."""
        e = self.entry(tenant=tenant, kind=kind, subject=subject, payload=payload, run_id=run_id)
        await conn.execute(self.insert_sql, *msgspec.structs.astuple(e))

    def open(self, row: Mapping[str, Any]) -> bytes:
        """The plaintext payload of a stored row (JournalError if it is not authentic)."""
        aad = _aad(self.service, row["tenant"], row["kind"], row["subject"], row["run_id"],
                   row["key_id"])
        try:
            return self.keys.decrypt(row["key_id"], row["nonce"], row["ciphertext"], aad)
        except JournalError as exc:
            raise JournalError(f"journal row {row['id']}: {exc}", entry_id=row["id"]) from None


def open_journal(service: str, *, signing_key_file: str, data_keys_file: str
                 ) -> tuple[Journal, SigningKey]:
    """A service's journal and its signing key, from its two secret files; refuses to start
    without them, because a governed change with no journal row is a change nobody can prove."""
    if not (signing_key_file and data_keys_file):
        raise ConfigError(f"{service} records what it does in its audit journal: set "
                          "WRIT_JOURNAL_SIGNING_KEY_FILE and WRIT_JOURNAL_DATA_KEYS_FILE")
    journal = Journal(service=service, keys=DataKeys.from_json(read_secret(data_keys_file)))
    return journal, SigningKey.from_json(read_secret(signing_key_file))


_ROW = "id, xid::text AS xid, tenant, kind, subject, run_id, recorded_at, key_id, nonce, ciphertext"


async def read_entries(conn: asyncpg.Connection, journal: Journal, *, tenant: str,
                       run_id: str | None = None, subject: str | None = None
                       ) -> list[tuple[int, Mapping[str, Any], bytes]]:
    """(seq, row, plaintext) of a tenant's sealed entries in chain order, for replay and audit.

    Only sealed entries are returned: what is not in the verified chain is not evidence.
    """
    s = journal.schema
    rows = await conn.fetch(
        f"SELECT s.seq, {', '.join('j.' + c.strip() for c in _ROW.split(','))} "
        f"FROM {s}.journal_seals s JOIN {s}.journal j ON j.id = s.entry_id "
        "WHERE j.tenant = $1 AND ($2::text IS NULL OR j.run_id = $2) "
        "AND ($3::text IS NULL OR j.subject = $3) ORDER BY s.seq", tenant, run_id, subject)
    return [(r["seq"], r, journal.open(r)) for r in rows]


# -- sealing ----------------------------------------------------------------------------------


class Sealer:
    """Chains a service's committed journal rows and signs a checkpoint per batch.

    Several processes of a service may run one each: a transaction-scoped advisory lock lets one
    seal at a time, and only sealers ever wait for it. Writers are never notified (NOTIFY takes a
    cluster-wide lock at commit): the sealer polls every `interval` seconds.
    """

    def __init__(self, *, pool: asyncpg.Pool, journal: Journal, signing: SigningKey,
                 batch: int = 500, interval: float = 0.5) -> None:
        self._pool, self._journal, self._signing = pool, journal, signing
        self._batch, self._interval = batch, interval
        s = journal.schema
        self._lock = int.from_bytes(
            hashlib.sha256(f"writ-journal:{s}".encode()).digest()[:8], "big", signed=True)
        self._head_sql = (f"SELECT seq, entry_id, xid::text AS xid, entry_hash "
                          f"FROM {s}.journal_seals ORDER BY seq DESC LIMIT 1")
        # The row comparison walks the (xid, id) index from the head; the snapshot's xmin is
        # the one of this very statement, so every row below it is visible here if committed.
        # (ORDER BY names the table's columns: a bare `xid` would be the text output column.)
        self._next_sql = (f"SELECT {_ROW} FROM {s}.journal j "
                          "WHERE (j.xid, j.id) > ($1::text::xid8, $2) "
                          "AND j.xid < pg_snapshot_xmin(pg_current_snapshot()) "
                          "ORDER BY j.xid, j.id LIMIT $3")
        self._seal_sql = (f"INSERT INTO {s}.journal_seals "
                          "(seq, entry_id, xid, prev_hash, entry_hash) "
                          "SELECT * FROM unnest($1::bigint[], $2::bigint[], "
                          "$3::text[]::xid8[], $4::bytea[], $5::bytea[])")
        self._checkpoint_sql = (f"INSERT INTO {s}.journal_checkpoints "
                                "(seq, prev_seq, head_hash, key_id, signature) "
                                "VALUES ($1, $2, $3, $4, $5)")
        self._last_checkpoint_sql = f"SELECT max(seq) FROM {s}.journal_checkpoints"
        self.stuck_at: int | None = None  # a row that cannot be authenticated blocks the chain

    async def seal_once(self) -> int:
        """Seal one batch of committed rows in one transaction; the number sealed."""
        service = self._journal.service
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", self._lock):
                return 0  # another process of this service is sealing
            head = await conn.fetchrow(self._head_sql)
            seq, prev = (head["seq"], head["entry_hash"]) if head else (0, genesis_hash(service))
            rows = await conn.fetch(self._next_sql, head["xid"] if head else "0",
                                    head["entry_id"] if head else 0, self._batch)
            seqs, ids, xids, prevs, hashes = [], [], [], [], []
            for row in rows:
                try:
                    # A row the service did not write (forged, or edited before sealing) must not
                    # enter the chain; skipping it would leave it out unnoticed, so stop here.
                    self._journal.open(row)
                except JournalError as exc:
                    if self.stuck_at != row["id"]:
                        log.error("journal of %s: cannot seal past row %s: %s", service,
                                  row["id"], exc)
                    self.stuck_at = row["id"]
                    break
                seq += 1
                prevs.append(prev)
                prev = entry_hash(prev, service=service, seq=seq, row=row)
                seqs.append(seq)
                ids.append(row["id"])
                xids.append(row["xid"])
                hashes.append(prev)
            else:
                self.stuck_at = None
            if not seqs:
                return 0
            await conn.execute(self._seal_sql, seqs, ids, xids, prevs, hashes)
            prev_seq = await conn.fetchval(self._last_checkpoint_sql) or 0
            key_id = self._signing.key_id
            signature = self._signing.sign(
                checkpoint_message(service, seq, prev_seq, prev, key_id))
            await conn.execute(self._checkpoint_sql, seq, prev_seq, prev, key_id, signature)
        return len(seqs)

    async def seal_all(self) -> int:
        """Seal batches until nothing sealable is left; the number sealed."""
        total = 0
        while (sealed := await self.seal_once()) > 0:
            total += sealed
            if sealed < self._batch:
                break
        return total

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Seal every `interval` seconds until cancelled; a failed round is retried."""
        task_status.started()
        while True:
            try:
                while True:
                    # A round is short and bounded by the statement timeout: finishing it beats
                    # a rollback that cancellation would interrupt too.
                    with anyio.CancelScope(shield=True):
                        sealed = await self.seal_once()
                    if sealed < self._batch:
                        break
            except Exception as exc:  # the service goes on deciding; verify flags the lag
                log.warning("journal of %s: sealing failed, retrying: %r",
                            self._journal.service, exc)
            await anyio.sleep(self._interval)


# -- verifying --------------------------------------------------------------------------------


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One finding: where (chain position and/or row id) and why."""

    seq: int | None
    entry_id: int | None
    reason: str

    def __str__(self) -> str:
        where = " ".join(part for part in (
            f"seq {self.seq}" if self.seq is not None else "",
            f"row {self.entry_id}" if self.entry_id is not None else "") if part)
        return f"{where}: {self.reason}"


class VerifyReport(msgspec.Struct, kw_only=True):
    """The outcome of verifying one service's journal; `problems[0]` is the first bad entry."""

    service: str
    entries: int = 0
    checkpoints: int = 0
    unsealed: int = 0
    tenant_entries: int | None = None
    problems: list[Problem] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the chain, every checkpoint and every signature check out."""
        return not self.problems


_MAX_PROBLEMS: Final = 100


async def verify(conn: asyncpg.Connection, *, service: str,
                 keys: Mapping[str, Mapping[str, Ed25519PublicKey]], schema: str | None = None,
                 tenant: str | None = None, grace: timedelta = timedelta(minutes=5),
                 journal: Journal | None = None) -> VerifyReport:
    """Walk one service's whole chain in one snapshot and report what does not check out.

    `keys` maps services to their checkpoint keys by id; only `service`'s own keys count.
    `tenant` only adds a count of that tenant's entries: the chain is verified whole either
    way. With `journal` (which holds the data keys) every payload is also authenticated.
    """
    s = schema or service
    own = keys.get(service, {})
    report = VerifyReport(service=service, tenant_entries=0 if tenant is not None else None)

    def bad(seq: int | None, entry_id: int | None, reason: str) -> None:
        if len(report.problems) < _MAX_PROBLEMS:
            report.problems.append(Problem(seq=seq, entry_id=entry_id, reason=reason))

    async with conn.transaction(isolation="repeatable_read", readonly=True):
        checkpoints = {r["seq"]: r for r in await conn.fetch(
            f"SELECT seq, prev_seq, head_hash, key_id, signature "
            f"FROM {s}.journal_checkpoints ORDER BY seq")}
        report.checkpoints = len(checkpoints)
        # Each entry is checked on its own (its contents give its recorded hash from its
        # recorded predecessor) and linked to the one before it; signed checkpoints pin the
        # recorded hashes. Together that is the whole chain, and a finding names one entry.
        prev, expected, last_cp = genesis_hash(service), 1, 0
        last_key: tuple[int, int] = (0, 0)
        nonces: dict[tuple[str, bytes], int] = {}
        cursor = conn.cursor(
            f"SELECT s.seq, s.entry_id, s.xid::text AS seal_xid, s.prev_hash, s.entry_hash, "
            f"j.id, j.xid::text AS xid, j.tenant, j.kind, j.subject, j.run_id, j.recorded_at, "
            f"j.key_id, j.nonce, j.ciphertext FROM {s}.journal_seals s "
            f"LEFT JOIN {s}.journal j ON j.id = s.entry_id ORDER BY s.seq", prefetch=1000)
        async for r in cursor:
            seq, entry_id = r["seq"], r["entry_id"]
            recorded_prev, recorded = bytes(r["prev_hash"]), bytes(r["entry_hash"])
            report.entries += 1
            if seq != expected:
                bad(expected, None, f"missing from the chain (deleted): the next seal is "
                                    f"seq {seq}")
            elif recorded_prev != prev and (r["id"] is None or entry_hash(
                    recorded_prev, service=service, seq=seq, row=r) == recorded):
                # This entry is whole (its hash covers its seq, so it was not moved here):
                # the one before it was rewritten together with its seal.
                bad(seq - 1, None, f"its sealed hash is not the one seq {seq} was chained to "
                                   "(rewritten together with its seal)")
            expected = seq + 1
            prev = recorded
            if r["id"] is None:
                bad(seq, entry_id, "the sealed row is missing (deleted)")
                continue
            if tenant is not None and r["tenant"] == tenant:
                report.tenant_entries = (report.tenant_entries or 0) + 1
            key = (int(r["xid"]), r["id"])
            if r["xid"] != r["seal_xid"] or key <= last_key:
                bad(seq, entry_id, "out of order (inserted or reordered): its (xid, id) does "
                                   "not follow the previous entry's")
            last_key = key
            if entry_hash(recorded_prev, service=service, seq=seq, row=r) != recorded:
                bad(seq, entry_id, "does not match its sealed hash (edited, swapped or "
                                   "inserted)")
            nonce_key = (r["key_id"], bytes(r["nonce"]))
            if nonce_key in nonces:
                bad(seq, entry_id, f"repeats the nonce of seq {nonces[nonce_key]} (a copied row)")
            nonces[nonce_key] = seq
            if journal is not None:
                try:
                    journal.open(r)
                except JournalError as exc:
                    bad(seq, entry_id, str(exc).split(": ", 1)[-1])
            cp = checkpoints.get(seq)
            if cp is not None:
                _check_checkpoint(service, own, cp, prev, last_cp, bad)
                last_cp = seq
        head_seq = expected - 1
        for seq in checkpoints:
            if seq > head_seq:
                bad(seq, None, "a signed checkpoint names an entry the chain no longer has "
                               "(deleted)")
        if head_seq and last_cp != head_seq:
            bad(last_cp + 1, None, f"seq {last_cp + 1}..{head_seq} not covered by a signed "
                                   "checkpoint (appended outside the sealer)")
        now = await conn.fetchval("SELECT now()")
        for u in await conn.fetch(
                f"SELECT j.id, j.xid::text AS xid, j.recorded_at FROM {s}.journal j "
                f"WHERE NOT EXISTS (SELECT 1 FROM {s}.journal_seals s WHERE s.entry_id = j.id) "
                "ORDER BY j.xid, j.id"):
            report.unsealed += 1
            if (int(u["xid"]), u["id"]) < last_key:
                bad(None, u["id"], "not in the chain yet sorts before its head (inserted)")
            elif now - u["recorded_at"] > grace:
                bad(None, u["id"], f"unsealed for more than {grace} (sealer stopped, or "
                                   "blocked by this row: edited or forged before sealing)")
    return report


def _check_checkpoint(service: str, own: Mapping[str, Ed25519PublicKey], cp: Mapping[str, Any],
                      head: bytes, last_cp: int, bad: Any) -> None:
    seq = cp["seq"]
    key = own.get(cp["key_id"])
    if key is None:
        bad(seq, None, f"checkpoint signed with key {cp['key_id']!r}, unknown for {service}")
        return
    try:
        key.verify(bytes(cp["signature"]), checkpoint_message(
            service, seq, cp["prev_seq"], bytes(cp["head_hash"]), cp["key_id"]))
    except InvalidSignature:
        bad(seq, None, "checkpoint signature does not verify (checkpoint edited)")
        return
    if cp["prev_seq"] != last_cp:
        bad(seq, None, f"checkpoint follows seq {cp['prev_seq']}, but the previous one is "
                       f"{last_cp} (a checkpoint was deleted)")
    if bytes(cp["head_hash"]) != head:
        bad(seq, None, f"the chain up to here differs from its signed checkpoint (an entry "
                       f"after seq {last_cp} was rewritten together with every later seal)")
