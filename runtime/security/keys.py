"""API keys: created by ``edgefn keys create``, stored hashed in ``DATA/keys.json``.

A key reads ``efn_<id>_<secret>``: `id` is public (listed, logged, in events),
`secret` is 32 random bytes. Only the SHA-256 of the whole key is stored: a
random 256-bit secret needs no slow password hash, and a lookup is one hash and
one dict access. The plain key is shown once, at creation.

The file is the one source of truth, shared by the CLI and every PoP on the
data dir: writers hold ``keys.lock`` and replace the file atomically; a PoP
(`KeyRing`) re-reads it when its identity changes, checked at most every
`RELOAD_INTERVAL` seconds, so a revocation takes effect within that time
(at once through the admin API's reload).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from edgefn_core.errors import InvalidConfig, NotFound
from runtime.security.principal import Principal

FILE = "keys.json"
PREFIX = "efn_"
KEY_PATTERN = re.compile(r"^efn_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$")
RELOAD_INTERVAL = 1.0  # seconds between checks of the file's identity

log = logging.getLogger("edgefn.auth")


class KeyRecord(Struct, omit_defaults=True, frozen=True):
    """One key as stored: never the key itself."""

    id: str
    hash: str  # sha256 hex of the whole key
    tenant: str
    scopes: tuple[str, ...]
    created: float
    expires: float | None = None
    revoked: float | None = None
    rpm: Annotated[int, Meta(ge=1)] | None = None  # a file saying 0 or less does not load
    tpm: Annotated[int, Meta(ge=1)] | None = None
    max_streams: Annotated[int, Meta(ge=1)] | None = None

    def principal(self) -> Principal:
        return Principal("key", self.tenant, self.scopes, key_id=self.id, rpm=self.rpm,
                         tpm=self.tpm, max_streams=self.max_streams)

    def state(self, now: float) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"


class KeyFile(Struct):
    keys: list[KeyRecord] = []


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def is_well_formed(key: str) -> bool:
    return KEY_PATTERN.match(key) is not None


class KeyStore:
    """The key file of one data dir: create, list, revoke. Raises `InvalidConfig`
    for a file that is not a key file."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self.lock_path = data_dir / "keys.lock"

    def read(self) -> list[KeyRecord]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            return msgspec.json.decode(raw, type=KeyFile).keys
        except msgspec.DecodeError as e:
            raise InvalidConfig(str(self.path), f"not a key file: {e}") from None

    def create(self, tenant: str, scopes: tuple[str, ...], *, expires: float | None = None,
               rpm: int | None = None, tpm: int | None = None,
               max_streams: int | None = None) -> tuple[str, KeyRecord]:
        """A new key (the plain text, shown once) and its stored record. Raises
        `ValueError` for a limit under 1 (the file would no longer load)."""
        for name, limit in (("rpm", rpm), ("tpm", tpm), ("max_streams", max_streams)):
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be 1 or more, got {limit}")
        with self._locked() as keys:
            key_id = secrets.token_hex(6)
            key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
            record = KeyRecord(key_id, digest(key), tenant, scopes, round(time.time(), 3),
                               expires, None, rpm, tpm, max_streams)
            keys.append(record)
        return key, record

    def revoke(self, key_id: str) -> KeyRecord:
        """Marks the key revoked (it stays listed). Raises `NotFound`."""
        with self._locked() as keys:
            for i, k in enumerate(keys):
                if k.id == key_id:
                    if k.revoked is None:
                        keys[i] = msgspec.structs.replace(k, revoked=round(time.time(), 3))
                    return keys[i]
        raise NotFound(f"no key {key_id!r} (see `edgefn keys ls`)")

    @contextmanager
    def _locked(self) -> Iterator[list[KeyRecord]]:
        """The keys, to change in place; written back atomically on success."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            keys = self.read()
            yield keys
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(msgspec.json.format(msgspec.json.encode(KeyFile(keys))))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)


class KeyRing:
    """A PoP's view of the key file: ``lookup(key)`` in one hash and one dict access."""

    # all set by `reload`
    _by_hash: dict[str, KeyRecord]
    _principals: dict[str, Principal]  # hash -> the key's principal, made on first use
    _stamp: tuple[int, int, int] | None  # the file's identity when read
    _checked: float  # when the identity was last compared
    _generation = 0  # how many times the keys were read

    def __init__(self, store: KeyStore) -> None:
        """Raises `InvalidConfig` for a key file that cannot be read."""
        self.store = store
        self.reload()

    def __len__(self) -> int:
        """How many keys were ever made, revoked ones too (an OpenAI API in ``auto``
        mode asks for a key once there is one: revoking the last key opened it to
        anyone again)."""
        self._maybe_reload()
        return len(self._by_hash)

    def lookup(self, key: str) -> KeyRecord | None:
        """The record of `key`, whatever its state; None if unknown."""
        self._maybe_reload()
        return self._by_hash.get(digest(key))

    def principal(self, record: KeyRecord) -> Principal:
        """`record.principal()`, made once per key (the same object every request,
        so later stages can key caches on it)."""
        p = self._principals.get(record.hash)
        if p is None:
            p = self._principals[record.hash] = record.principal()
        return p

    def reload(self) -> None:
        """Re-read the file. Raises `InvalidConfig` for a corrupt one (the PoP keeps
        the keys it had when a reload fails later; see `_maybe_reload`)."""
        self._checked = time.monotonic()
        self._stamp = self._identity()
        self._by_hash = {k.hash: k for k in self.store.read()}
        self._principals = {}
        self._generation += 1

    def generation(self) -> int:
        """A number that changes each time the keys are read again, after checking
        the file as `lookup` does (once per `RELOAD_INTERVAL`)."""
        if time.monotonic() - self._checked >= RELOAD_INTERVAL:
            self._maybe_reload()
        return self._generation

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.store.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_INTERVAL:
            return
        self._checked = now
        if self._identity() != self._stamp:
            try:
                self.reload()
            except InvalidConfig as e:  # edited by hand? keep serving the keys we had
                log.error("keeping the previous keys: %s", e)
