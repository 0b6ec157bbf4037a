"""No window ever admits more than its limit, whatever the algorithm, however many
clients hit it at once: threads on the memory storage, and several PoPs' worth of
connections on one real Redis server. The memory counters, in Python and in C
(native_src/counters.c), decide as `limits` does and as each other, byte for byte.

Windows are a day long so a burst never straddles two of them (a fixed or
sliding window may admit its limit again in the next one): within one window,
the admitted count must be exactly min(limit, attempts).
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.security.ratelimit import counters as python_counters
from runtime.security.ratelimit import native
from runtime.security.ratelimit.limiter import Limiter, compile_rules
from runtime.security.settings import RateRule

from .redis_server import RedisServer, redis_server  # noqa: F401

ALGORITHMS = st.sampled_from(["moving_window", "sliding_window", "fixed_window"])


def c_counters(clock: Any) -> Any:
    """native_src/counters.c's `Counters` (built here: a test machine has a compiler,
    and a PoP there counts with it)."""
    module = native.load()
    assert module is not None, "native_src/counters.c did not build"
    return module.Counters(clock)


# both implementations of the memory counters, each held to the same properties
IMPLEMENTATIONS = pytest.mark.parametrize("make", [python_counters.Counters, c_counters],
                                          ids=["python", "c"])


def test_a_memory_limiter_counts_with_the_c_counters() -> None:
    """Where the extension builds (here) a PoP's limiter counts in C, as measured."""
    assert type(Limiter("memory://").counters) is not python_counters.Counters


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


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        return self.now


@IMPLEMENTATIONS
@settings(max_examples=int(os.environ.get("EDGEFN_EXAMPLES", "150")), deadline=None)
@example(algorithm="moving_window", limit=1, steps=[(0, 0), (64, 0)])  # exactly one window
@example(algorithm="fixed_window", limit=1, steps=[(0, 0), (64, 0)])
@example(algorithm="sliding_window", limit=2, steps=[(0, 0), (60, 0), (10, 0), (4, 0)])
@given(algorithm=ALGORITHMS, limit=st.integers(1, 6),
       steps=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 1)), min_size=1,
                      max_size=60))
def test_counters_decide_as_the_limits_library_does(make: Any, algorithm: str, limit: int,
                                                    steps: list[tuple[int, int]]) -> None:
    """The memory counters against `limits`' own MemoryStorage and strategy, on the
    same clock: every decision and every remaining count agree. Steps advance the
    clock by eighths of the 8 s window, for one of two clients."""
    import limits
    import limits.storage.memory
    import limits.strategies

    clock = FakeClock()
    strategies = {"moving_window": limits.strategies.MovingWindowRateLimiter,
                  "sliding_window": limits.strategies.SlidingWindowCounterRateLimiter,
                  "fixed_window": limits.strategies.FixedWindowRateLimiter}
    saved = limits.storage.memory.time
    limits.storage.memory.time = clock  # type: ignore[assignment]
    limits.strategies.time = clock  # type: ignore[attr-defined]
    storage = limits.storage.MemoryStorage()
    try:
        theirs = strategies[algorithm](storage)
        item = limits.RateLimitItemPerSecond(limit, 8)
        ours = make(clock.time)
        for dt, who in steps:
            clock.now += dt / 8
            admitted, remaining, reset = ours.hit(f"k{who}", algorithm, limit, 8)
            assert admitted == theirs.hit(item, str(who)), (clock.now, who)
            stats = theirs.get_window_stats(item, str(who))
            if algorithm == "moving_window" and clock.now - 8 in ours.state[f"k{who}"][0]:
                continue  # limits counts a hit exactly one window old when it decides,
                # not in its stats: the decision above is the one that matters
            assert max(0, remaining) == stats.remaining, (clock.now, who)
            assert reset == pytest.approx(stats.reset_time, abs=1e-6), (clock.now, who)
    finally:
        storage.timer.cancel()
        limits.storage.memory.time = saved
        limits.strategies.time = saved  # type: ignore[attr-defined]


@IMPLEMENTATIONS
@settings(max_examples=150, deadline=None)
@example(algorithm="fixed_window", limit=1, steps=[(0, 0, False), (64, 0, True)])  # expiry
@example(algorithm="sliding_window", limit=1, steps=[(0, 0, False), (64, 0, True)])  # next
@example(algorithm="moving_window", limit=1, steps=[(0, 0, False), (64, 0, True)])  # window
@given(algorithm=st.sampled_from(["moving_window", "sliding_window", "fixed_window"]),
       limit=st.integers(0, 5),
       steps=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 1), st.booleans()),
                      max_size=60))
def test_admits_says_what_hit_would_decide_and_counts_nothing(
        make: Any, algorithm: str, limit: int, steps: list[tuple[int, int, bool]]) -> None:
    """`admits` (what the native lane asks before it runs a function) answers what
    `hit` at the same instant decides, and leaves every count as it was: asked or
    not, the same decisions follow."""
    import copy

    now = [1000.0]
    ours, control = make(lambda: now[0]), make(lambda: now[0])
    for dt, who, ask in steps:
        now[0] += dt / 8
        if ask:
            before = copy.deepcopy(ours.state)
            admits = ours.admits(f"k{who}", algorithm, limit, 8, now[0])
            assert ours.state == before
        admitted = ours.hit(f"k{who}", algorithm, limit, 8)[0]
        assert control.hit(f"k{who}", algorithm, limit, 8)[0] == admitted
        if ask:
            assert admits == admitted, (now[0], who)


@IMPLEMENTATIONS
def test_counters_drop_state_whose_window_has_passed_and_keep_live_counts(make: Any) -> None:
    clock = FakeClock()
    counters = make(clock.time)
    counters.sweep_at = 4
    for i, algorithm in enumerate(["fixed_window", "sliding_window", "moving_window"]):
        counters.hit(f"old{i}", algorithm, 5, 10)
    clock.now += 25  # past every window of the three (a sliding one lasts two)
    assert counters.hit("live", "fixed_window", 2, 60)[:2] == (True, 1)
    assert len(counters.state) == 4  # the sweep waits for sweep_at keys
    clock.now += 1
    assert counters.hit("live", "fixed_window", 2, 60)[:2] == (True, 0)  # swept here
    assert set(counters.state) == {"live"} and counters.sweep_at == 4
    assert counters.hit("live", "fixed_window", 2, 60)[0] is False  # its count survived
    for i in range(3):  # four live keys: nothing to drop, so wait for twice as many
        counters.hit(f"new{i}", "sliding_window", 5, 60)
    counters.hit("new3", "moving_window", 5, 60)
    assert len(counters.state) == 5 and counters.sweep_at == max(50_000, 8)


@IMPLEMENTATIONS
@pytest.mark.parametrize("algorithm", ["moving_window", "sliding_window", "fixed_window"])
def test_a_sweep_keeps_every_live_count(make: Any, algorithm: str) -> None:
    """A moving window's state was kept with an expiry in the past (`now - window`
    read the same to every other test): the sweep dropped it, and a client at its
    limit was admitted again."""
    now = [1_700_000_000.0]
    counters = make(lambda: now[0])
    counters.sweep_at = 2
    assert counters.hit("live", algorithm, 2, 60)[0] and counters.hit("live", algorithm, 2, 60)[0]
    now[0] += 1
    counters.hit("other", algorithm, 2, 60)  # sweeps
    assert counters.hit("live", algorithm, 2, 60)[0] is False and "live" in counters.state


@IMPLEMENTATIONS
def test_a_sweep_that_frees_little_doubles_the_threshold(make: Any) -> None:
    """Past SWEEP_AT live keys, a threshold that did not grow swept on every hit."""
    now = [1_700_000_000.0]
    counters = make(lambda: now[0])
    assert counters.sweep_at == counters.sweep_floor == python_counters.SWEEP_AT
    counters.sweep_at = counters.sweep_floor = 4
    for i in range(5):
        counters.hit(f"k{i}", "fixed_window", 5, 60)
    assert len(counters.state) == 5 and counters.sweep_at == 8
    for i in range(5, 9):
        counters.hit(f"k{i}", "fixed_window", 5, 60)
    assert counters.sweep_at == 16


STARTS = st.floats(1_600_000_000, 1_800_000_000)  # epochs, fractional


def shapes_of(algorithms: st.SearchStrategy[str]) -> st.SearchStrategy[list[tuple[str, int,
                                                                                int]]]:
    """Three limits' (algorithm, amount, window): windows of 1 s, 8 s and a minute."""
    return st.lists(st.tuples(algorithms, st.integers(0, 6), st.sampled_from([1, 8, 60])),
                    min_size=3, max_size=3)


# one operation on the counters: (clock step in 1/16 s, 0: a huge jump ahead, key,
# what: "hit" | "admits" | "admits_all" | "count" | "count_quiet")
OPERATIONS = st.lists(st.tuples(st.integers(0, 40), st.booleans(), st.integers(0, 2),
                                st.sampled_from(["hit", "admits", "admits_all", "count",
                                                 "count_quiet"])), max_size=80)


@settings(max_examples=int(os.environ.get("EDGEFN_EXAMPLES", "150")), deadline=None)
@example(start=1_700_000_000.0, shapes=[("sliding_window", 2, 60)] * 3,
         ops=[(0, False, 0, "count"), (16 * 59, False, 0, "count"), (32, False, 0, "count")])
@given(start=STARTS, shapes=shapes_of(ALGORITHMS), ops=OPERATIONS)
def test_the_c_counters_decide_and_write_as_the_python_ones(
        start: float, shapes: list[tuple[str, int, int]],
        ops: list[tuple[int, bool, int, str]]) -> None:
    """Every answer of the C counters equals the Python ones' at every step, exactly
    (remaining counts, reset instants to the bit, the RateLimit fields' bytes, a
    refusal's error), and so does their state: the same IEEE arithmetic in the same
    order, a float's `//` and `%` as CPython computes them. Clocks start anywhere
    (fractional epochs), steps are sixteenths of a second or a leap past every window."""
    now = [start]
    python, c = python_counters.Counters(lambda: now[0]), c_counters(lambda: now[0])
    checks = [((f"shape{i}", ("pop", "by-ip", "10.0.0.1")), algorithm, amount, window,
               f"by-ip-{i}") for i, (algorithm, amount, window) in enumerate(shapes)]
    for dt, leap, i, what in ops:
        now[0] += 1000.0 if leap else dt / 16
        answers = []
        for counters in (python, c):
            try:
                answers.append(ask(counters, what, checks[:i + 1], now[0]))
            except RuntimeError as e:
                answers.append(("refused", str(e)))
        assert answers[0] == answers[1], (what, now[0], i)
        assert python.state == c.state, (what, now[0], i)


def ask(counters: Any, what: str, checks: list[Any], now: float) -> Any:
    """`counters`' answer to one operation on the last of `checks` at `now` (`hit`
    on their clock; `count` with the fields, `count_quiet` without)."""
    key, algorithm, amount, window, _ = checks[-1]
    if what == "hit":
        return counters.hit(key, algorithm, amount, window)
    if what == "admits":
        return counters.admits(key, algorithm, amount, window, now)
    if what == "admits_all":
        return counters.admits_all(checks, now)
    return counters.count(checks, now, what == "count")


def test_counted_fields_are_what_the_stage_writes() -> None:
    """`count`'s header lines (both implementations) are `headers.fields` of the
    quotas `Limiter.hit` reports for the same hits: what the native lane adds to a
    response is what the stage adds."""
    from runtime.security.ratelimit.headers import fields

    rules = compile_rules([RateRule("ip", "5/minute;100/hour", "sliding_window"),  # type: ignore[arg-type]
                           RateRule("function", "3/second", "moving_window")],  # type: ignore[arg-type]
                          "by", "t", "r")
    who = [(rule, ("pop", rule.name, "10.0.0.7")) for rule in rules]
    now = 1_700_000_123.25
    for make in (python_counters.Counters, c_counters):
        limiter = Limiter("memory://")
        limiter.counters = make(lambda: now)
        reference = Limiter("memory://")
        reference.counters = make(lambda: now)
        for step in range(4):
            at = now + step * 0.4
            lines = limiter.counters.count(limiter.prepare(who), at, True)
            outcome = reference.hit(who, stats=True, now=at)
            (policy, quotas), (state, left) = fields(outcome.quotas)
            assert lines == b"%s: %s\r\n%s: %s\r\n" % (policy, quotas, state, left)
            assert b'"by-function";q=3;w=1' in lines and b'"by-ip-2";q=100;w=3600' in lines
        assert limiter.counters.count(limiter.prepare(who), now + 2, False) == b""
