"""`RedisBudgetStore`: the budget store of `budget` on a Redis server, so every
PoP naming the same server shares one budget. Each operation is one Lua script
(atomic on the server), and time is the server's (``TIME``), so PoPs with
skewed clocks still agree on windows. Keys are built inside the scripts: a
single server, not a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio

from runtime.security.ratelimit.budget import WINDOW, BudgetStore, Refusal
from runtime.security.ratelimit.outage import TIMEOUT_S, down

PREFIX = "edgefn-tb:"

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

# KEYS: slots; ARGV: cap per slot. -> 0 when taken, else the full slot's index (1-based)
ACQUIRE = """
for i, key in ipairs(KEYS) do
  if tonumber(redis.call('GET', key) or '0') >= tonumber(ARGV[i]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('INCR', key)
  redis.call('EXPIRE', key, 3600)
end
return 0
"""

RELEASE = """
for _, key in ipairs(KEYS) do
  if tonumber(redis.call('DECR', key)) <= 0 then redis.call('DEL', key) end
end
return 1
"""


class RedisBudgetStore(BudgetStore):
    """`url`: ``redis://host:port[/db]``. A stream slot left by a PoP that died
    mid-stream expires an hour after the last stream of its key started. Every
    operation raises `StorageDown` when the server does not answer."""

    def __init__(self, url: str) -> None:
        self.client: Any = redis.asyncio.Redis.from_url(
            url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)
        self.scripts = {name: self.client.register_script(src) for name, src in (
            ("reserve", RESERVE), ("settle", SETTLE), ("acquire", ACQUIRE),
            ("release", RELEASE))}

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
        full = int(await self._run("acquire", [PREFIX + s for s in slots], list(caps)))
        return full - 1 if full else None

    async def release(self, slots: Sequence[str]) -> None:
        await self._run("release", [PREFIX + s for s in slots], [])

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self.scripts[script](keys=keys, args=args)
        except Exception as e:
            raise down(e) from e

    async def close(self) -> None:
        await self.client.aclose()
