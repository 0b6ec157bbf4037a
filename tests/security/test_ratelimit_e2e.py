"""Rate limits over real HTTP on loopback: one PoP in memory, and two PoPs that
share one real Redis server (together they admit exactly the limit)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import function_dir, pop_thread, reactor

from .redis_server import RedisServer, redis_server  # noqa: F401

RULE = [{"by": "ip", "limit": "5/minute"}]


def test_one_pop_limits_a_function_and_says_when_to_retry(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"ratelimit.rules": RULE}) as pop:
        pop.deploy(function_dir(tmp_path, "hello", reactor("")))
        answers = [pop.get("/hello") for _ in range(6)]
    assert [a[0] for a in answers] == [200] * 5 + [429]
    remaining = [re.fullmatch(r'"by-ip";r=(\d+);t=(\d+)', a[1]["ratelimit"]) for a in answers[:5]]
    assert [int(m[1]) for m in remaining if m] == [4, 3, 2, 1, 0]
    assert all(a[1]["ratelimit-policy"] == '"by-ip";q=5;w=60' for a in answers[:5])
    _, headers, body = answers[5]
    assert headers["ratelimit-policy"] == '"by-ip";q=5;w=60'
    assert 1 <= int(headers["retry-after"]) <= 60
    assert b'"kind":"rate_limited"' in body


def test_two_pops_sharing_redis_admit_the_limit_together(tmp_path: Path,
                                                         redis_server: RedisServer  # noqa: F811
                                                         ) -> None:
    shared = {"ratelimit.storage": redis_server.url, "ratelimit.rules": RULE}
    with pop_thread(tmp_path / "a", **shared) as a, pop_thread(tmp_path / "b", **shared) as b:
        # nothing serves /x: the limit applies before routing, so 404 means admitted
        statuses = [(a if i % 2 else b).get("/x")[0] for i in range(12)]
        after = a.get("/x")
    assert statuses.count(404) == 5 and statuses.count(429) == 7
    assert statuses[:5] == [404] * 5  # admitted first, by both PoPs in turn
    assert after[0] == 429 and after[1]["ratelimit-policy"] == '"by-ip";q=5;w=60'
