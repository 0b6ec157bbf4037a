"""`Limiter`: request rates counted by the `limits` library, in memory (this
process's, or with ``workers = N`` a table every worker of the PoP shares) or on
Redis (shared by every PoP that names the same server).

A `Limit` is one rate of one rule (``"1000/hour;50/minute"`` is two). Checking
a request hits each of its limits in order and stops at the first one that is
full; the limits hit before it keep that hit, as in flask-limiter. In memory
every call is synchronous; on Redis every call is a coroutine (the event loop
never blocks on the network).

In memory the algorithms run on `Counters` (the same arithmetic as `limits`'
strategies, without its MemoryStorage's per-key locks and expiry events, which
cost a third of a hello request per rule; in C where it builds, `native.counters`),
with each counter's key built once; the property tests hold both to the same bound.
On Redis, `limits`' own async strategies run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import limits
import limits.aio.storage
import limits.aio.strategies
from limits import RateLimitItem

from edgefn_core.errors import InvalidConfig
from runtime.security.ratelimit import counters as counters_
from runtime.security.ratelimit.headers import Quota
from runtime.security.ratelimit.native import counters as new_counters
from runtime.security.ratelimit.outage import TIMEOUT_S, down
from runtime.security.settings import Algorithm, RateRule

log = logging.getLogger("edgefn.pop")

_ASYNC: dict[str, Callable[[Any], limits.aio.strategies.RateLimiter]] = {
    "moving_window": limits.aio.strategies.MovingWindowRateLimiter,
    "sliding_window": limits.aio.strategies.SlidingWindowCounterRateLimiter,
    "fixed_window": limits.aio.strategies.FixedWindowRateLimiter}


class Limit:
    """One rate (`item`) of one rule, named for the RateLimit headers."""

    __slots__ = ("algorithm", "amount", "by", "item", "name", "shape", "window")

    def __init__(self, name: str, by: str, item: RateLimitItem, algorithm: Algorithm) -> None:
        self.name, self.by, self.item, self.algorithm = name, by, item, algorithm
        self.amount = item.amount
        self.window = int(item.get_expiry())
        # what its counters are keyed by besides who they count (a rule changed by a
        # redeploy starts new counters)
        self.shape = f"{name}/{self.amount}/{self.window}/{algorithm}"


def compile_rules(rules: Sequence[RateRule], prefix: str, where: str, field: str
                  ) -> list[Limit]:
    """The limits of `rules`, named ``<prefix>-<by>`` (``-2``, ``-3`` when a name
    repeats). Raises `InvalidConfig` naming `where` and ``<field>[i].limit`` for a
    rate `limits` cannot parse."""
    out: list[Limit] = []
    for i, rule in enumerate(rules):
        try:
            items = limits.parse_many(rule.limit)
        except ValueError as e:
            raise InvalidConfig(where, f"{rule.limit!r} is not a rate like '100/minute' "
                                f"({e})", f"{field}[{i}].limit") from None
        for item in items:
            out.append(Limit(_unique(f"{prefix}-{rule.by}", out), rule.by, item,
                             rule.algorithm))
    return out


def per_minute(name: str, by: str, amount: int) -> Limit:
    """A sliding-window limit of `amount` per minute (a key's or a tenant's rpm)."""
    return Limit(name, by, limits.RateLimitItemPerMinute(amount), "sliding_window")


def _unique(name: str, taken: list[Limit]) -> str:
    names = {lim.name for lim in taken}
    if name not in names:
        return name
    n = 2
    while f"{name}-{n}" in names:
        n += 1
    return f"{name}-{n}"


type Check = tuple[Limit, tuple[str, ...]]  # a limit and who it counts (its identifiers)


class Outcome:
    """`refused`: the first full limit (None when all admitted the request);
    `quotas`: each limit's state when asked for (and the refused one's)."""

    __slots__ = ("quotas", "refused", "retry_after")

    def __init__(self, refused: Limit | None, quotas: list[Quota], retry_after: float) -> None:
        self.refused, self.quotas, self.retry_after = refused, quotas, retry_after


class Limiter:
    """Counts hits. `storage`: ``memory://`` or ``redis://host:port[/db]``
    (``rediss://`` for TLS). `remote` says which of `hit` / `hit_async` to call."""

    def __init__(self, storage: str = "memory://", where: str = "<config>",
                 table: str | None = None) -> None:
        """`table`: in memory, the shared table (`native.SharedTable`) whose windows
        every PoP process of ``workers = N`` counts in (None: this process's only).
        Raises `InvalidConfig` (field ``ratelimit.storage``) for another scheme,
        OSError or ValueError for a table it cannot map. A Redis server is not
        contacted until the first hit."""
        scheme = storage.partition("://")[0]
        self.remote = scheme in ("redis", "rediss", "redis+unix")
        if self.remote:
            self.astore = limits.aio.storage.RedisStorage(
                "async+" + storage, implementation="redispy", key_prefix="edgefn-rl",
                socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)
            self.astrategies = {k: v(self.astore) for k, v in _ASYNC.items()}
        elif scheme == "memory":
            self.counters = new_counters(table=table)
        else:
            raise InvalidConfig(where, f"storage must be memory:// or redis://host:port, got "
                                f"{storage!r}", "ratelimit.storage")

    def warn_moving(self, limits: Sequence[Limit], where: str) -> None:
        """Log that `limits`' moving windows count in this process alone although its
        counters share a table with other workers (``workers = N``: the table holds
        fixed and sliding windows; a moving window's timestamps stay in each worker,
        so N workers admit up to N times its limit)."""
        moving = [lim.name for lim in limits if lim.algorithm == "moving_window"]
        if not moving or self.remote or self.counters.table is None:
            return
        log.warning("%s: %s counted by each worker alone (moving_window; with workers = N "
                    "up to N times the limit): use sliding_window, the default, or "
                    "storage = \"redis://...\" to count them together", where,
                    ", ".join(moving))

    @staticmethod
    def prepare(checks: list[Check]) -> list[counters_.Check]:
        """`checks` as the counters take a request's at once (memory only:
        `counters.admits_all`, `counters.count`), keyed as `hit` keys them."""
        return [((limit.shape, ids), limit.algorithm, limit.amount, limit.window, limit.name)
                for limit, ids in checks]

    def hit(self, checks: list[Check], stats: bool, now: float | None = None) -> Outcome:
        """Hit each limit at `now` (default: the clock; memory only). With `stats`, the
        quotas of all."""
        quotas: list[Quota] = []
        hit = self.counters.hit
        if now is None:
            now = time.time()
        for limit, ids in checks:
            admitted, remaining, reset = hit((limit.shape, ids), limit.algorithm,
                                             limit.amount, limit.window, now)
            if not admitted:
                return _refused(limit, reset, quotas)
            if stats:
                quotas.append(Quota(limit.name, limit.amount, limit.window, remaining,
                                    reset - now))
        return Outcome(None, quotas, 0.0)

    async def hit_async(self, checks: list[Check], stats: bool) -> Outcome:
        """`hit` on Redis. Raises `StorageDown` when Redis does not answer."""
        try:
            return await self._hit_async(checks, stats)
        except Exception as e:
            raise down(e) from e

    async def _hit_async(self, checks: list[Check], stats: bool) -> Outcome:
        quotas: list[Quota] = []
        for limit, ids in checks:
            strategy = self.astrategies[limit.algorithm]
            if not await strategy.hit(limit.item, *ids):
                window = await strategy.get_window_stats(limit.item, *ids)
                return _refused(limit, window.reset_time, quotas)
            if stats:
                window = await strategy.get_window_stats(limit.item, *ids)
                quotas.append(_quota(limit, window.remaining, window.reset_time))
        return Outcome(None, quotas, 0.0)

    def close(self) -> None:
        """Nothing to release in memory (Redis: `aclose`)."""

    async def aclose(self) -> None:
        """Close the Redis connections (`limits` has no call of its own for it)."""
        if self.remote:
            bridge: Any = self.astore.bridge  # the redis-py bridge holds the client
            await bridge.storage.aclose()
        else:
            self.close()


def _quota(limit: Limit, remaining: int, reset_time: float) -> Quota:
    return Quota(limit.name, limit.item.amount, limit.window, remaining,
                 reset_time - time.time())


def _refused(limit: Limit, reset_time: float, quotas: list[Quota]) -> Outcome:
    wait = max(0.0, reset_time - time.time())
    quotas.append(_quota(limit, 0, reset_time))
    return Outcome(limit, quotas, wait)
