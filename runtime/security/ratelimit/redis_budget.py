"""`RedisBudgetStore`: the budget store of `budget` on a Redis server, so every
PoP naming the same server shares one budget. Each operation is one Lua script
(atomic on the server), and time is the server's (``TIME``), so PoPs with
skewed clocks still agree on windows. Keys are built inside the scripts: a
single server, not a cluster.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Any

import redis.asyncio

from runtime.security.ratelimit.budget import WINDOW, BudgetStore, Refusal
from runtime.security.ratelimit.outage import TIMEOUT_S, down

PREFIX = "edgefn-tb:"
log = logging.getLogger("edgefn.ratelimit")

# KEYS: buckets; ARGV: amount, window, limit per bucket.
# -> {1, window id} or {0, refusing index (1-based), use, seconds to wait}
RESERVE = """
local t = redis.call('TIME')
local w = tonumber(ARGV[2])
local now = (tonumber(t[1]) + tonumber(t[2]) / 1e6) / w
local id = math.floor(now)
local frac = now - id
local amount = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[2 + i])
  local prev = tonumber(redis.call('GET', key .. ':' .. (id - 1)) or '0')
  local cur = tonumber(redis.call('GET', key .. ':' .. id) or '0')
  local used = prev * (1 - frac) + cur
  if used + amount > limit then
    local room = limit - amount - cur
    local wait = (1 - frac) * w
    if room >= 0 and prev > 0 then wait = math.max(0, (1 - room / prev) - frac) * w end
    return {0, i, tostring(used), tostring(wait)}
  end
end
for _, key in ipairs(KEYS) do
  redis.call('INCRBY', key .. ':' .. id, amount)
  redis.call('EXPIRE', key .. ':' .. id, 2 * w + 1)
end
return {1, id}
"""

# KEYS: buckets; ARGV: window id, delta. A refund never takes a window below 0.
SETTLE = """
for _, key in ipairs(KEYS) do
  local k = key .. ':' .. ARGV[1]
  local v = redis.call('GET', k)
  if v then
    local n = math.max(0, tonumber(v) + tonumber(ARGV[2]))
    redis.call('SET', k, n, 'KEEPTTL')
  end
end
return 1
"""

SLOTS = PREFIX + "slots:"  # not an older edgefn's key (a counter): PoPs of both versions on
# one Redis count their own streams apart, and neither meets the other's type (WRONGTYPE)
# A slot is a hash: holder (one PoP process) -> the streams it holds. A holder is alive
# while its lease key (HOLDER .. id) is: renewed every LEASE_S / 3 while it holds any, so
# the slots of a PoP that died mid-stream come back within LEASE_S (they were held for an
# hour: its key's clients got 429 too_many_streams meanwhile).
# KEYS: slots; ARGV: holder, lease (s), then the cap per slot.
# -> 0 when taken, else the full slot's index (1-based)
ACQUIRE = """
local holder, lease = ARGV[1], tonumber(ARGV[2])
redis.call('SET', '""" + PREFIX + """holder:' .. holder, 1, 'EX', lease)
for i, key in ipairs(KEYS) do
  local held = redis.call('HGETALL', key)
  local n = 0
  for j = 1, #held, 2 do
    if redis.call('EXISTS', '""" + PREFIX + """holder:' .. held[j]) == 1 then
      n = n + tonumber(held[j + 1])
    else
      redis.call('HDEL', key, held[j])
    end
  end
  if n >= tonumber(ARGV[2 + i]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('HINCRBY', key, holder, 1)
  redis.call('EXPIRE', key, 3600)
end
return 0
"""

# KEYS: slots; ARGV: holder
RELEASE = """
for _, key in ipairs(KEYS) do
  if tonumber(redis.call('HINCRBY', key, ARGV[1], -1)) <= 0 then
    redis.call('HDEL', key, ARGV[1])
  end
end
return 1
"""


LEASE_S = 30.0


class RedisBudgetStore(BudgetStore):
    """`url`: ``redis://host:port[/db]``. The stream slots this process holds are
    leased for `lease_s` and renewed while it holds any: those of a PoP that died
    mid-stream come back within `lease_s`. Every operation raises `StorageDown`
    when the server does not answer."""

    def __init__(self, url: str, lease_s: float = LEASE_S) -> None:
        self.client: Any = redis.asyncio.Redis.from_url(
            url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)
        self.scripts = {name: self.client.register_script(src) for name, src in (
            ("reserve", RESERVE), ("settle", SETTLE), ("acquire", ACQUIRE),
            ("release", RELEASE))}
        self.holder = secrets.token_hex(8)
        self.lease_s = max(1, round(lease_s))
        self.held = 0  # stream slots this process holds
        self.renewer: asyncio.Task[None] | None = None

    async def reserve(self, buckets: Sequence[str], limits: Sequence[int], amount: int
                      ) -> int | Refusal:
        keys = [PREFIX + b for b in buckets]
        out = await self._run("reserve", keys, [amount, WINDOW, *limits])
        if int(out[0]) == 1:
            return int(out[1])
        return Refusal(int(out[1]) - 1, float(out[2]), float(out[3]))

    async def settle(self, buckets: Sequence[str], window: int, delta: int) -> None:
        if delta:
            await self._run("settle", [PREFIX + b for b in buckets], [window, delta])

    async def acquire(self, slots: Sequence[str], caps: Sequence[int]) -> int | None:
        full = int(await self._run("acquire", [SLOTS + s for s in slots],
                                   [self.holder, self.lease_s, *caps]))
        if full:
            return full - 1
        self.held += 1
        if self.renewer is None or self.renewer.done():
            self.renewer = asyncio.get_running_loop().create_task(self._renew())
        return None

    async def release(self, slots: Sequence[str]) -> None:
        self.held = max(0, self.held - 1)
        await self._run("release", [SLOTS + s for s in slots], [self.holder])

    async def _renew(self) -> None:
        """Keep this process's lease while it holds slots (a failed renewal is tried
        again at the next turn; the lease outlives two of them)."""
        key = f"{PREFIX}holder:{self.holder}"
        while self.held:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.client.set(key, 1, ex=self.lease_s)
            except Exception as e:  # the store is down: the next turn tries again
                log.warning("cannot renew the stream slots' lease: %s", e)

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self.scripts[script](keys=keys, args=args)
        except Exception as e:
            raise down(e) from e

    async def close(self) -> None:
        if self.renewer is not None:
            self.renewer.cancel()
        await self.client.aclose()
