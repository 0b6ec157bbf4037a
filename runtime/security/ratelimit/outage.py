"""What the rate limits and token budgets do while their shared store (Redis) cannot
be reached: ``[ratelimit] on_storage_error``. ``"open"`` (the default) admits the
request uncounted, ``"closed"`` refuses it with 503 ``ratelimit_unavailable``;
either way the PoP logs the outage (once per `LOG_EVERY_S`) and keeps serving
everything no limit applies to. Redis clients reconnect on their own, so the
next request after the store is back is counted again.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from edgefn_core.errors import Rejected
from runtime.security.ratelimit.headers import retry_after

log = logging.getLogger("edgefn.pop")
LOG_EVERY_S = 10.0
TIMEOUT_S = 1.0  # a Redis connect or command past this is an outage, not a slow request


class StorageDown(Exception):
    """The counters' store did not answer (connection refused, reset, timed out)."""


def down(error: Exception) -> Exception:
    """`error` as a `StorageDown` if it says the store did not answer (the Redis
    client's errors, a socket's, `limits`' storage error), else `error` itself
    (a bug stays a bug)."""
    import limits.errors
    import redis.exceptions

    if isinstance(error, redis.exceptions.RedisError | OSError | limits.errors.StorageError):
        return StorageDown(str(error) or type(error).__name__)
    return error


class Outage:
    """Applies `policy` to a `StorageDown`; logs the first one and then at most once
    per `LOG_EVERY_S`, with how many requests it affected in between."""

    def __init__(self, policy: Literal["open", "closed"], what: str) -> None:
        self.policy, self.what = policy, what
        self.logged_at = float("-inf")
        self.unlogged = 0

    def admit(self, error: StorageDown) -> None:
        """Returns (policy "open": the caller goes on uncounted). Raises `Rejected`
        (503 ``ratelimit_unavailable``, Retry-After: 1) for policy "closed"."""
        now = time.monotonic()
        self.unlogged += 1
        if now - self.logged_at >= LOG_EVERY_S:
            action = "admitted uncounted" if self.policy == "open" else "refused (503)"
            log.warning("%s: the rate-limit store is unreachable (%s); %d request(s) %s "
                        "([ratelimit] on_storage_error = %r)", self.what, error,
                        self.unlogged, action, self.policy)
            self.logged_at, self.unlogged = now, 0
        if self.policy == "closed":
            raise Rejected("ratelimit_unavailable", 503, "the rate-limit store cannot be "
                           "reached, and this PoP refuses requests it cannot count "
                           "([ratelimit] on_storage_error = \"closed\")",
                           headers=[retry_after(1)])
