"""No window ever admits more than its limit, whatever the algorithm, however many
clients hit it at once: threads on the memory storage, and several PoPs' worth of
connections on one real Redis server.

Windows are a day long so a burst never straddles two of them (a fixed or
sliding window may admit its limit again in the next one): within one window,
the admitted count must be exactly min(limit, attempts).
"""

from __future__ import annotations

import asyncio
import threading
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.security.ratelimit.limiter import Limiter, compile_rules
from runtime.security.settings import RateRule

from .redis_server import RedisServer, redis_server  # noqa: F401

ALGORITHMS = st.sampled_from(["moving_window", "sliding_window", "fixed_window"])


@settings(max_examples=30, deadline=None)
@given(algorithm=ALGORITHMS, limit=st.integers(1, 25), clients=st.integers(1, 8),
       hits=st.integers(1, 10))
def test_memory_windows_admit_at_most_their_limit(algorithm: str, limit: int, clients: int,
                                                  hits: int) -> None:
    limiter = Limiter("memory://")
    (rule,) = compile_rules([RateRule("ip", f"{limit}/day", algorithm)], "by", "t", "r")  # type: ignore[arg-type]
    who = ("pop", rule.name, uuid.uuid4().hex)
    admitted = [0] * clients
    start = threading.Barrier(clients)

    def client(i: int) -> None:
        start.wait()
        for _ in range(hits):
            if limiter.hit([(rule, who)], stats=False).refused is None:
                admitted[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    limiter.close()
    assert sum(admitted) == min(limit, clients * hits)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(algorithm=ALGORITHMS, limit=st.integers(1, 25), pops=st.integers(1, 4),
       clients=st.integers(1, 6), hits=st.integers(1, 8))
def test_redis_windows_admit_at_most_their_limit(redis_server: RedisServer,  # noqa: F811
                                                 algorithm: str, limit: int, pops: int,
                                                 clients: int, hits: int) -> None:
    (rule,) = compile_rules([RateRule("ip", f"{limit}/day", algorithm)], "by", "t", "r")  # type: ignore[arg-type]
    who = ("pop", rule.name, uuid.uuid4().hex)

    async def run() -> int:
        limiters = [Limiter(redis_server.url) for _ in range(pops)]  # one per PoP

        async def client(limiter: Limiter) -> int:
            n = 0
            for _ in range(hits):
                outcome = await limiter.hit_async([(rule, who)], stats=False)
                n += outcome.refused is None
            return n

        try:
            counts = await asyncio.gather(*(client(limiters[i % pops])
                                            for i in range(clients * pops)))
        finally:
            for lim in limiters:
                await lim.aclose()
        return sum(counts)

    assert asyncio.run(run()) == min(limit, pops * clients * hits)
