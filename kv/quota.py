"""`Quota`: what an owner's writes may add, checked inside the write's own LMDB
transaction (one writer at a time, across processes). A check read in a
transaction of its own let writers arriving together all pass it, then write one
after another (30 parallel puts took an owner 130 KB past a 2 MB quota)."""

from __future__ import annotations

from dataclasses import dataclass

from edgefn_core.errors import LimitExceeded

_HOLD = {"kv": ("KV namespaces", "bytes", "kv_owner_quota_mb", "delete keys first"),
         "vectors": ("vector indexes", "bytes of vectors", "vectors_owner_quota_mb",
                     "delete some first")}


@dataclass(frozen=True)
class Quota:
    """At most `limit` bytes in the stores `names` (KV namespaces or vector
    indexes, as `kind` says) together; `owner` is named in the error."""

    names: tuple[str, ...]
    limit: int
    owner: str
    kind: str = "kv"  # or "vectors"

    def check(self, used: int, adding: int) -> None:
        """Raises `LimitExceeded` when `used` + `adding` bytes pass the limit."""
        if used + adding > self.limit:
            what, unit, setting, hint = _HOLD[self.kind]
            raise LimitExceeded(f"the {what} of owner {self.owner!r} hold {used} {unit}; "
                                f"{adding} more would pass its quota of {self.limit} bytes "
                                f"([stores] {setting}): {hint}")
