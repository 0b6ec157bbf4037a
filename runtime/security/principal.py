"""`Principal`: who is calling, as the auth stage found it; every later stage and
the function see it (``request.principal`` in Python, the principal section of
the ABI for WASM)."""

from __future__ import annotations

import fnmatch
import re
from typing import Literal

from msgspec import Struct

# a tenant's name, as a key's tenant, a manifest's `owner` and a JWT's tenant claim take it;
# a function's name too (`runtime.functions.manifest`): it is its tenant where no owner is set
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
TENANT = re.compile(TENANT_PATTERN)


class Principal(Struct, frozen=True, omit_defaults=True):
    """`kind`: how it was proven. `key_id` is the key's public id (never the key);
    `subject` a JWT's ``sub``. Limits of None fall back to the tenant's."""

    kind: Literal["key", "jwt"]
    tenant: str
    scopes: tuple[str, ...] = ()
    key_id: str | None = None
    subject: str | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_streams: int | None = None

    def allows(self, kind: str, name: str) -> bool:
        """Whether a scope grants `kind` (fn, model, route, admin) on `name`: ``*``,
        or ``kind:pattern`` where the pattern is an fnmatch glob."""
        for scope in self.scopes:
            if scope == "*":
                return True
            k, _, pattern = scope.partition(":")
            if k == kind and fnmatch.fnmatchcase(name, pattern):
                return True
        return False

    @property
    def identity(self) -> str:
        """What limits count this principal by: its key id, else tenant/subject."""
        return self.key_id or f"{self.tenant}/{self.subject or ''}"


def model_client(who: Principal | None, owner: str | None = None) -> str | None:
    """Whose fair share of the model worker a call counts in (the worker protocol's
    ``client``): the tenant, the boundary every other quota keeps to: caller `who`'s
    tenant, else function owner `owner` (a tenant too), else None (anonymous, one
    share for all). A tenant's keys, JWT subjects and functions share one: minting
    more keys buys no more of the model."""
    tenant = who.tenant if who is not None else owner
    return None if tenant is None else f"tenant:{tenant}"
