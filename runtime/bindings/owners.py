"""Who owns each KV namespace and vector index, and whom its owner shares it with.

A name belongs to the owner (`Manifest.tenant`: the manifest's ``owner``, else the
function's name) of the first function whose deploy binds it; the claim outlives
that function, as the data does. Another owner's function may bind it only if a
function of the owner grants it in ``[bindings.share]`` (``read`` or ``write``);
each function's grants count while it is deployed, and a new version replaces
them. The deploy checks (`Owners.check`) and the binding checks every call
(`Owners.access`), so a grant withdrawn stops the other function at once.

Persisted in ``DATA/owners.json`` (written to a temp file, fsynced, renamed). A
deploy saves its record first (the commit point) and then its claims, so a crash
between the two leaves claims that `Registry.restore` makes again. Only the
operator's own tools (admin API, CLI) reach a store without these checks.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from pathlib import Path
from typing import Literal

import msgspec

from edgefn_core.errors import Failure, NotOwner
from runtime.functions.manifest import Manifest

Access = Literal["read", "write"]
KINDS = ("kv", "vectors")
WHAT = {"kv": "KV namespace", "vectors": "vector index"}


def denied(owners: Owners, kind: str, name: str, tenant: str, write: bool) -> str:
    """Why `tenant` may not read (or `write`) `name` now, or "" if it may."""
    access = owners.access(kind, name, tenant)
    if access == "write" or (access == "read" and not write):
        return ""
    owner = owners.owner(kind, name)
    if access == "read":
        return f"{WHAT[kind]} {name!r} of owner {owner!r} is shared with {tenant!r} read-only"
    return f"{WHAT[kind]} {name!r} belongs to owner {owner!r} and is not shared with {tenant!r}"


def _shared_counter() -> tuple[ctypes.c_uint64, int]:
    """A u64 (starting at 1) in a memfd of its own, and a read-only descriptor of
    that memfd for other processes: a mapping made from it cannot be made writable,
    so a host can watch the counter but never set it. Raises OSError."""
    fd = os.memfd_create("edgefn-owners-generation", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 8)
        counter = ctypes.c_uint64.from_buffer(mmap.mmap(fd, 8))  # keeps the mapping alive
        readonly = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)
    counter.value = 1
    return counter, readonly


class Claim(msgspec.Struct, omit_defaults=True):
    owner: str
    shares: dict[str, dict[str, Access]] = {}  # function -> {other owner: access}


class Claims(msgspec.Struct):
    kv: dict[str, Claim] = {}
    vectors: dict[str, Claim] = {}


class Owners:
    """The claims of one data dir. Read from any thread; changed only by deploys
    (which the registry serialises)."""

    def __init__(self, path: Path) -> None:
        """Raises `Failure` (500 ``owners_unreadable``) if the file is corrupt:
        refusing to deploy or start beats forgetting who owns what."""
        self.path = path
        # moves whenever the claims change: native readers (the WASM kv_get in C,
        # Python isolate hosts reading KV in place) check their table of readable
        # namespaces against it on every read; shared memory, so that hosts can
        self.generation, self.generation_fd = _shared_counter()
        weakref.finalize(self, os.close, self.generation_fd)
        try:
            self._claims = msgspec.json.decode(path.read_bytes(), type=Claims)
        except FileNotFoundError:
            self._claims = Claims()
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
            raise Failure("owners_unreadable", 500, f"{path}: cannot read who owns which KV "
                          f"namespace and vector index ({e}); restore it from a backup") from None

    def reload(self) -> None:
        """Re-read the file, which another process (the admin worker of
        ``workers = N``) saved. Raises `Failure` as reading it at start does."""
        self._claims = Owners(self.path)._claims
        self.generation.value += 1  # native kv_get tables built from the old claims are stale

    def owner(self, kind: str, name: str) -> str | None:
        claim = getattr(self._claims, kind).get(name)
        return claim.owner if claim is not None else None

    def names(self, kind: str, owner: str) -> list[str]:
        """The names of `kind` that `owner` holds."""
        return [n for n, claim in getattr(self._claims, kind).items() if claim.owner == owner]

    def access(self, kind: str, name: str, tenant: str) -> Access | None:
        """What `tenant` may do with `name`: ``write`` if it owns it or nobody does
        yet, else what its owner's functions grant it (None: nothing)."""
        claim: Claim | None = getattr(self._claims, kind).get(name)
        if claim is None or claim.owner == tenant:
            return "write"
        granted = {grants.get(tenant) for grants in claim.shares.values()}
        return "write" if "write" in granted else "read" if "read" in granted else None

    def check(self, m: Manifest, label: str) -> None:
        """Raises `NotOwner` (naming the file, field, name and owner) if `m` binds a
        name another owner holds without a grant to `m`'s owner, or shares one."""
        for kind in KINDS:
            for name in getattr(m.bindings, kind):
                owner = self.owner(kind, name)
                if owner is None or owner == m.tenant:
                    continue
                if name in getattr(m.bindings.share, kind):
                    raise NotOwner(f"{label}: field `bindings.share.{kind}.{name}`: {WHAT[kind]} "
                                   f"{name!r} belongs to owner {owner!r}; only its owner may "
                                   "share it")
                if self.access(kind, name, m.tenant) is None:
                    raise NotOwner(
                        f"{label}: field `bindings.{kind}`: {WHAT[kind]} {name!r} belongs to "
                        f"owner {owner!r} and is not shared with {m.tenant!r}; bind another "
                        f"name, or have its owner grant it ([bindings.share.{kind}] "
                        f'{name} = {{ read = ["{m.tenant}"] }})')

    def commit(self, m: Manifest) -> None:
        """Claim for `m`'s owner what it binds that nobody owns, and make `m`'s grants
        replace those of its function's earlier versions. Call after `check`.

        Raises `OSError` if the file cannot be saved (the claims hold in memory).
        """
        claims = msgspec.convert(msgspec.to_builtins(self._claims), Claims)
        for kind in KINDS:
            table: dict[str, Claim] = getattr(claims, kind)
            for claim in table.values():
                claim.shares.pop(m.name, None)
            for name in getattr(m.bindings, kind):
                claim = table.setdefault(name, Claim(m.tenant))
                grant = getattr(m.bindings.share, kind).get(name)
                if grant is not None and claim.owner == m.tenant:
                    claim.shares[m.name] = ({o: "read" for o in grant.read}
                                            | {o: "write" for o in grant.write})
        self._replace(claims)

    def forget(self, function: str) -> None:
        """Withdraw the grants of a deleted function (its owner keeps its names).
        Raises `OSError` if the file cannot be saved."""
        claims = msgspec.convert(msgspec.to_builtins(self._claims), Claims)
        for kind in KINDS:
            for claim in getattr(claims, kind).values():
                claim.shares.pop(function, None)
        self._replace(claims)

    def _replace(self, claims: Claims) -> None:
        self._claims = claims  # one assignment: readers see the old claims or the new
        self.generation.value += 1  # after the claims: a table built from older ones is stale
        # a temp file of this process's own: ``workers = N`` restore (and claim) at once
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(claims)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
