"""`[ratelimit] on_storage_error`: a PoP whose Redis dies keeps serving (admitted
uncounted, "open") or refuses with 503 ("closed"), never a 500 that blames the
function, and counts again once Redis is back. A real redis-server, killed."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from edgefn_core.errors import Rejected
from runtime.security.ratelimit.admission import Payer, TokenBudgets
from runtime.security.ratelimit.redis_budget import RedisBudgetStore
from runtime.security.settings import RateLimitSettings
from tests.support import free_port, function_dir, pop_thread, reactor

from .redis_server import started_redis

RULE = [{"by": "ip", "limit": "3/minute"}]


def test_open_admits_while_redis_is_down_and_counts_again_when_it_is_back(
        tmp_path: Path) -> None:
    with started_redis(tmp_path / "r1") as server:
        port = server.port
        settings = {"ratelimit.storage": server.url, "ratelimit.rules": RULE}
        with pop_thread(tmp_path / "data", **settings) as pop:
            pop.deploy(function_dir(tmp_path, "hello", reactor("")))
            before = [pop.get("/hello")[0] for _ in range(2)]
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(10)
            during = [pop.get("/hello") for _ in range(5)]
            with started_redis(tmp_path / "r2", port):  # empty: the counts start again
                after = [pop.get("/hello")[0] for _ in range(4)]
    assert before == [200, 200]
    assert [d[0] for d in during] == [200] * 5  # more than the limit: uncounted
    assert all("ratelimit" not in d[1] for d in during)  # no quota it cannot know
    assert after == [200, 200, 200, 429]


def test_closed_refuses_with_503_while_redis_is_down(tmp_path: Path) -> None:
    with started_redis(tmp_path / "r") as server:
        settings = {"ratelimit.storage": server.url, "ratelimit.rules": RULE,
                    "ratelimit.on_storage_error": "closed"}
        with pop_thread(tmp_path / "data", **settings) as pop:
            pop.deploy(function_dir(tmp_path, "hello", reactor("")))
            assert pop.get("/hello")[0] == 200
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(10)
            status, headers, body = pop.get("/hello")
    assert status == 503 and headers["retry-after"] == "1"
    error = json.loads(body)["error"]
    assert error["kind"] == "ratelimit_unavailable" and "rate-limit store" in error["message"]


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_token_budgets_apply_the_policy_when_redis_is_unreachable(policy: str) -> None:
    settings = RateLimitSettings(on_storage_error=policy)  # type: ignore[arg-type]
    payer = Payer()
    payer.charge("key-tpm", "key:k1", 1000, 2)

    async def admit() -> None:
        store = RedisBudgetStore(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
        budgets = TokenBudgets(settings, store)
        try:
            ticket = await budgets.admit(payer, _count, 10, stream=True)
            assert ticket.window is None and not ticket.stream  # unmetered
            await ticket.settle(12)  # nothing to settle, and no error
        finally:
            await store.close()

    if policy == "open":
        asyncio.run(admit())
    else:
        with pytest.raises(Rejected) as e:
            asyncio.run(admit())
        assert (e.value.code, e.value.status) == ("ratelimit_unavailable", 503)


async def _count() -> int:
    return 5


def test_a_policy_it_does_not_know_is_refused_naming_the_field(tmp_path: Path) -> None:
    from edgefn_core.errors import InvalidConfig
    from runtime import config

    with pytest.raises(InvalidConfig) as err:
        config.load(None, data=str(tmp_path), **{"ratelimit.on_storage_error": "sometimes"})
    assert err.value.field == "ratelimit.on_storage_error" and "sometimes" in str(err.value)
