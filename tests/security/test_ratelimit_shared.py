"""The shared table of rate-limit windows (native_src/counters_table.c.h): the PoP
processes of ``workers = N`` count in it together. It decides as the per-process
counters do, step for step; real processes hitting one key at once admit exactly
the limit; a process killed holding a group's lock costs nobody the lock; a full
group gives up the window that ends first; a file that is not a table is refused.
(tests/test_workers.py runs it in a real two-worker PoP.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runtime.security.ratelimit import counters as python_counters
from runtime.security.ratelimit import native
from tests.security.test_ratelimit_property import STARTS, ask, shapes_of
from tests.support import ROOT

SHARED = st.sampled_from(["sliding_window", "fixed_window"])  # moving ones: per process
# one hit of one of three keys, from one of two mappings of the table: (clock step in
# 1/16 s, a leap past every window, key, mapping, what)
OPERATIONS = st.lists(st.tuples(st.integers(0, 40), st.booleans(), st.integers(0, 2),
                                st.integers(0, 1),
                                st.sampled_from(["hit", "admits", "admits_all", "count"])),
                      max_size=80)


def module() -> Any:
    mod = native.load()
    assert mod is not None, "native_src/counters.c did not build"
    return mod


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "table"
    assert native.create_table(path, 64)
    return path


def shared(path: Path, clock: Callable[[], float]) -> Any:
    return module().Counters(clock, str(path))


@settings(max_examples=int(os.environ.get("EDGEFN_EXAMPLES", "150")), deadline=None)
@example(start=1_700_000_000.0, shapes=[("sliding_window", 2, 60)] * 3,
         ops=[(0, False, 0, 0, "count"), (16 * 59, False, 0, 1, "count"),
              (32, False, 0, 0, "count")])
@given(start=STARTS, shapes=shapes_of(SHARED), ops=OPERATIONS)
def test_the_table_decides_as_one_process_counts(
        start: float, shapes: list[tuple[str, int, int]],
        ops: list[tuple[int, bool, int, int, str]]) -> None:
    """Two mappings of one table (two workers), hit in turn, answer for fixed and
    sliding windows exactly what one process's counters (the Python reference) answer for the same hits: every
    decision, remaining count, reset instant and RateLimit field. A count is made
    only where `admits_all` admits (as the lane counts), since the table counts a
    full limit where one process raises (another worker may have filled it)."""
    now = [start]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table"
        native.create_table(path, 4)  # few groups: keys share them
        reference = python_counters.Counters(lambda: now[0])
        mappings = [shared(path, lambda: now[0]), shared(path, lambda: now[0])]
        checks = [((f"shape{i}", ("pop", "by-ip", "10.0.0.1")), algorithm, amount, window,
                   f"by-ip-{i}") for i, (algorithm, amount, window) in enumerate(shapes)]
        for dt, leap, i, m, what in ops:
            now[0] += 1000.0 if leap else dt / 16
            if what == "count" and not reference.admits_all(checks[:i + 1], now[0]):
                what = "admits_all"
            answers = [ask(counters, what, checks[:i + 1], now[0])
                       for counters in (reference, mappings[m])]
            assert answers[0] == answers[1], (what, now[0], i, m)
        assert mappings[0].table_stats == {"evictions": 0, "recovered": 0, "groups": 4}


def test_windows_live_in_the_table_and_moving_ones_in_the_process(table: Path) -> None:
    now = 1_700_000_000.0
    a, b = shared(table, lambda: now), shared(table, lambda: now)
    alone = module().Counters(lambda: now)
    for algorithm in ("fixed_window", "sliding_window"):
        assert a.hit("k", algorithm, 2, 60)[0] and b.hit("k", algorithm, 2, 60)[0]
        assert not a.hit("k", algorithm, 2, 60)[0]  # the two hits above filled it
        assert not b.admits("k", algorithm, 2, 60, now) and alone.admits("k", algorithm, 2,
                                                                         60, now)
        assert a.state == {}  # nothing of them in the process
    assert a.hit("m", "moving_window", 1, 60)[0] and b.hit("m", "moving_window", 1, 60)[0]
    assert set(a.state) == {"m"}  # a moving window is each process's own
    assert a.table == b.table == str(table) and alone.table is None


def test_a_moving_window_in_a_shared_table_is_said_to_count_per_worker(
        table: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A rule with ``algorithm = "moving_window"`` counts in each worker alone even
    where the workers share a table (its timestamps stay in the process): the stage
    says so when it compiles one, the PoP's rules at start and a function's when
    first compiled (its deploy's quiet request), naming the rule; sliding windows,
    and one process, say nothing."""
    from types import SimpleNamespace

    from runtime.functions.router import Router
    from runtime.pipeline.stages.ratelimit import RateLimit
    from runtime.pipeline.targets import Targets
    from runtime.security.settings import RateLimitSettings, RateRule, TargetPolicy

    targets = Targets(SimpleNamespace(router=Router(), canaries={}), {})  # type: ignore[arg-type]
    rules = [RateRule("ip", "9/minute"), RateRule("ip", "5/minute", "moving_window")]
    fn = SimpleNamespace(name="moves", policy=TargetPolicy(rate_limits=[
        RateRule("key", "3/minute", "moving_window")]))
    slides = SimpleNamespace(name="slides", policy=TargetPolicy(rate_limits=[
        RateRule("key", "3/minute")]))
    stages = []
    with caplog.at_level("WARNING", logger="edgefn.pop"):
        stages.append(RateLimit(RateLimitSettings(rules=rules), targets, table=str(table)))
        stages.append(RateLimit(RateLimitSettings(rules=rules), targets))  # one process
        for stage in stages:
            for target in (fn, fn, slides):  # compiled once per policy: said once
                stage._function_limits(target)  # type: ignore[arg-type]
    for stage in stages:
        stage.close()
    said = [r.getMessage() for r in caplog.records if "each worker alone" in r.getMessage()]
    assert [m.split(" counted")[0] for m in said] == [
        "[ratelimit] rules: by-ip-2", "function 'moves' (rate_limits): fn-key"]
    assert all("sliding_window" in m and "redis://" in m for m in said)


def test_a_count_the_limit_refuses_counts_in_the_table(table: Path) -> None:
    """Between the lane's `admits_all` and its `count`, another worker may fill the
    limit: the count is made (as on Redis), not raised as a bug; one process alone
    still raises."""
    now = 1_700_000_000.0
    a, b = shared(table, lambda: now), shared(table, lambda: now)
    checks = [(("shape", ("pop", "by-ip", "10.0.0.1")), "fixed_window", 1, 60, "by-ip")]
    assert a.admits_all(checks, now) and b.admits_all(checks, now)
    assert b.count(checks, now, True) == \
        b"ratelimit-policy: \"by-ip\";q=1;w=60\r\nratelimit: \"by-ip\";r=0;t=60\r\n"
    assert a.count(checks, now, True).endswith(b";r=0;t=60\r\n")
    assert not a.hit(*checks[0][:4])[0]
    alone = module().Counters(lambda: now)
    alone.hit(*checks[0][:4])
    with pytest.raises(RuntimeError, match="refused"):
        alone.count(checks, now, False)


HITTER = """
import sys, time
from runtime.security.ratelimit import native
c = native.load().Counters(table=sys.argv[1])
algorithm, amount = sys.argv[2], int(sys.argv[3])
key = ("shape", ("pop", "10.0.0.1"))
print("ready", flush=True)
sys.stdin.readline()
admitted = hits = 0
end = time.monotonic() + 60
while time.monotonic() < end:  # until a whole batch is refused: the limit is full
    batch = sum(c.hit(key, algorithm, amount, 86400)[0] for _ in range(100))
    admitted += batch
    hits += 100
    if not batch:
        break
print(admitted, hits, flush=True)
"""
LIMIT = 400_000


def together(script: str, *args: str) -> list[tuple[int, ...]]:
    """Four processes running `script` with `args`, let go at once (each waits for a
    line once it printed ``ready``); the numbers each printed at the end."""
    return _together([[sys.executable, "-c", script, *args]] * 4)


def together_as_workers(script: str, *args: str) -> list[tuple[int, ...]]:
    """`together`, each process given its index (0-3) after `args`."""
    return _together([[sys.executable, "-c", script, *args, str(i)] for i in range(4)])


def _together(commands: list[list[str]]) -> list[tuple[int, ...]]:
    procs = [subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for command in commands]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:  # all go at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        return [tuple(map(int, p.communicate(timeout=60)[0].split())) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_processes_hitting_one_key_at_once_admit_exactly_the_limit(
        table: Path, algorithm: str) -> None:
    """Four processes hitting one key as fast as they can, all at once, each until
    the limit refuses it: 400,000 admitted in all, not one more (a lost update admits
    more; a day-long window holds them all), at least two of them admitting some
    (they ran together). The sliding window's first window admits while its plain
    count is below it."""
    counts = together(HITTER, str(table), algorithm, str(LIMIT))
    assert sum(a for a, _ in counts) == LIMIT, counts
    assert sum(a > 0 for a, _ in counts) >= 2, counts


HOLDER = """
import os, sys, time
from runtime.security.ratelimit import native
c = native.load().Counters(table=sys.argv[1])
c._hold(("shape", ("pop", "10.0.0.1")))
print("held", flush=True)
if sys.argv[2] == "die":
    os._exit(0)
time.sleep(60)
"""


def test_a_process_that_dies_holding_a_lock_costs_nobody_the_lock(table: Path) -> None:
    holder = subprocess.run([sys.executable, "-c", HOLDER, str(table), "die"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert holder.stdout == "held\n", holder.stderr
    c = shared(table, time.time)
    started = time.monotonic()
    assert c.hit(("shape", ("pop", "10.0.0.1")), "fixed_window", 5, 60)[:2] == (True, 4)
    assert time.monotonic() - started < 0.5  # taken over at once, not waited out
    assert c.table_stats["recovered"] == 1


def test_a_lock_held_past_a_second_is_an_error_not_a_hang(table: Path) -> None:
    """A worker stopped (SIGSTOP) holding a group's lock stalls no other worker for
    long: past LOCK_WAIT_S (1 s) the hit raises TimeoutError, which the stage turns
    into its error answer, and keys of other groups are not held up at all."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(table), "hold"], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        c = shared(table, time.time)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="lock"):
            c.hit(("shape", ("pop", "10.0.0.1")), "fixed_window", 5, 60)
        assert 0.9 < time.monotonic() - started < 2.0
        quick = 0
        for i in range(2, 40):  # keys of other groups: not held up (one in 64 shares it)
            started = time.monotonic()
            try:
                assert c.hit(("shape", ("pop", f"10.0.0.{i}")), "fixed_window", 5, 60)[0]
            except TimeoutError:
                continue
            assert time.monotonic() - started < 0.2
            quick += 1
            if quick == 5:
                break
        assert quick == 5
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()  # type: ignore[union-attr]


def test_a_full_group_gives_up_the_window_that_ends_first(tmp_path: Path) -> None:
    """One group of 8 slots: 8 live keys fill it; a 9th takes the slot of the window
    that ends first (that key starts over, counted in `evictions`), whichever slot
    it is in; a key whose window has passed frees its slot with no eviction."""
    path = tmp_path / "table"
    native.create_table(path, 1)
    now = [1_700_000_000.0]
    c = shared(path, lambda: now[0])
    for i in range(8):
        assert c.hit(f"k{i}", "fixed_window", 1, 67 - i)[0]  # k7, in the last slot, ends first
    assert c.table_stats["evictions"] == 0
    assert c.hit("k8", "fixed_window", 1, 100)[0]
    assert c.table_stats["evictions"] == 1
    assert not any(c.hit(f"k{i}", "fixed_window", 1, 67 - i)[0] for i in range(7))  # kept
    assert c.hit("k7", "fixed_window", 1, 60)[0]  # given up: it starts over, in k6's slot
    assert c.table_stats["evictions"] == 2
    assert not c.hit("k8", "fixed_window", 1, 100)[0] and \
        not c.hit("k5", "fixed_window", 1, 62)[0]
    now[0] += 60.5  # k7's window (from the instant it started over) has passed
    assert c.hit("k9", "fixed_window", 1, 60)[0]
    assert c.table_stats["evictions"] == 2


def test_what_is_not_a_table_is_refused_saying_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        shared(tmp_path / "absent", time.time)
    junk = tmp_path / "junk"
    junk.write_bytes(b"\0" * 8192)
    with pytest.raises(ValueError, match="not a rate-limit table of version 2"):
        shared(junk, time.time)
    short = tmp_path / "short"
    short.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a rate-limit table"):
        shared(short, time.time)
    made = tmp_path / "made"
    native.create_table(made, 2)
    with made.open("r+b") as f:  # a table cut short (a different size than it says)
        f.truncate(made.stat().st_size - 512)
    with pytest.raises(ValueError, match="not a rate-limit table"):
        shared(made, time.time)
    with pytest.raises(ValueError, match="at least one group"):
        native.create_table(tmp_path / "empty", 0)
    native.create_table(tmp_path / "one", 1)
    c = shared(tmp_path / "one", time.time)
    with pytest.raises(TypeError, match="str, bytes, int or a tuple"):
        c.hit(("shape", [1]), "fixed_window", 1, 60)


def test_the_workers_table_is_a_memfd_that_goes_with_its_last_holder() -> None:
    """The parent's table has no name to leave behind (a SIGKILLed PoP left 8 MiB in
    /dev/shm): another process opens it by ``/proc/<pid>/fd/<fd>`` while the parent
    holds it; once let go, the path opens nothing and a mapping made before still
    counts."""
    table = native.SharedTable.create(2)
    assert table is not None and table.path == f"/proc/{os.getpid()}/fd/{table.fd}"
    try:
        assert os.readlink(table.path) == "/memfd:edgefn-ratelimit (deleted)"
        other = subprocess.run(
            [sys.executable, "-c", "import sys\nfrom runtime.security.ratelimit import native\n"
             "c = native.load().Counters(table=sys.argv[1])\n"
             "print(c.hit('k', 'fixed_window', 1, 60)[0])", table.path],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert other.stdout == "True\n", other.stderr
        mapped = shared(Path(table.path), time.time)
        assert not mapped.hit("k", "fixed_window", 1, 60)[0]  # the other process's hit
    finally:
        table.close()
    table.close()  # twice: nothing more to let go
    with pytest.raises(FileNotFoundError):
        shared(Path(table.path), time.time)
    assert not mapped.hit("k", "fixed_window", 1, 60)[0]  # its mapping holds the memory
    assert not any(p.name.startswith("edgefn-") for p in Path("/dev/shm").glob("*"))


# -- token budgets (budget.py's windows, in the table) ---------------------------------------
# (clock step in seconds, which buckets (0: key, 1: tenant, 2: both), amount, a settle
# (delta, of the admitted reservation this many before the last) or None, which mapping)
BUDGET_OPS = st.lists(st.tuples(st.integers(0, 90), st.integers(0, 2), st.integers(0, 60),
                                st.one_of(st.none(), st.tuples(st.integers(-60, 30),
                                                               st.integers(0, 3))),
                                st.integers(0, 1)), max_size=60)


@settings(max_examples=int(os.environ.get("EDGEFN_EXAMPLES", "150")), deadline=None)
@example(start=6000.0, ops=[(0, 0, 60, None, 0), (60, 0, 10, None, 1),  # a refund of the
                            (0, 0, 35, (-60, 1), 0)])  # window before, after it rolled over
@given(start=STARTS, ops=BUDGET_OPS)
def test_shared_token_budgets_reserve_and_settle_as_one_process_does(
        start: float, ops: list[tuple[int, int, int, tuple[int, int] | None, int]]) -> None:
    """Two workers' `SharedBudgetStore`s on one table answer every reservation
    exactly as one process's `MemoryBudgetStore` (the window charged, or the
    refusing bucket, its use and its retry hint), refunds and charges included, of
    the current window or of the one before."""
    from runtime.security.ratelimit.budget import MemoryBudgetStore, Refusal, SharedBudgetStore

    now = [start]
    with tempfile.TemporaryDirectory() as tmp:
        native.create_table(Path(tmp) / "table", 2)
        reference = MemoryBudgetStore(lambda: now[0])
        workers = [SharedBudgetStore(shared(Path(tmp) / "table", time.time), lambda: now[0])
                   for _ in range(2)]
        last: list[tuple[list[str], int]] = []
        for dt, which, amount, delta, w in ops:
            now[0] += dt
            buckets, limits = [["key:k"], ["tenant:t"], ["key:k", "tenant:t"]][which], \
                [[100], [150], [100, 150]][which]
            if delta is not None and last:  # a refund or charge, maybe of a window before
                charged, window = last[max(0, len(last) - 1 - delta[1])]
                for store in (reference, workers[w]):
                    _run(store.settle(charged, window, delta[0]))
            ours, theirs = reference.reserve_now(buckets, limits, amount), \
                workers[w].reserve_now(buckets, limits, amount)
            if isinstance(ours, Refusal):
                assert isinstance(theirs, Refusal)
                assert (ours.index, ours.used, ours.retry_after) == \
                    (theirs.index, theirs.used, theirs.retry_after), now[0]
            else:
                assert ours == theirs, now[0]
                last.append((buckets, ours))


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


RESERVER = """
import sys, time
from runtime.security.ratelimit import native
c = native.load().Counters(table=sys.argv[1])
limit = int(sys.argv[2])
now = 1_700_000_010.0  # one instant: no window starts while they run
print("ready", flush=True)
sys.stdin.readline()
reserved = tries = 0
end = time.monotonic() + 60
while time.monotonic() < end:  # until a whole batch is refused: the budget is spent
    batch = sum(isinstance(c.reserve(["key:k", "tenant:t"], [limit, limit], 1, now), int)
                for _ in range(100))
    reserved += batch
    tries += 100
    if not batch:
        break
print(reserved, tries, flush=True)
"""


def test_workers_reserving_at_once_never_overspend_a_budget(table: Path) -> None:
    """Four processes reserving a token at a time from one key's and one tenant's
    budget, all at once, each until it is refused: exactly the budget is reserved,
    by at least two of them."""
    counts = together(RESERVER, str(table), "200000")
    assert sum(r for r, _ in counts) == 200_000, counts
    assert sum(r > 0 for r, _ in counts) >= 2, counts


def test_budgets_need_a_table_and_take_a_handful_of_buckets(table: Path) -> None:
    with pytest.raises(ValueError, match="need a shared table"):
        module().Counters().reserve(["b"], [1], 1, 0.0)
    c = shared(table, time.time)
    with pytest.raises(TypeError, match="at most 8"):
        c.reserve([f"b{i}" for i in range(9)], [1] * 9, 1, 0.0)
    with pytest.raises(ValueError, match="one limit a bucket"):
        c.reserve(["a", "b"], [1], 1, 0.0)
    assert c.reserve(["a", "a"], [2, 2], 1, 60.0) == 1  # one bucket twice: its group locked once


def test_a_worker_counts_in_the_table_its_parent_made(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """What `build` hands the ratelimit and bots stages and the token budgets: the
    table of the data dir once there are several workers and it exists; none for one
    process or a missing table (logged: that worker counts alone), and none is made
    where nothing would count in it (limits on Redis, no bots stage)."""
    from runtime import config
    from runtime.pipeline.build import shared_table, token_budgets, wants_shared_table
    from runtime.security.ratelimit.budget import MemoryBudgetStore, SharedBudgetStore

    two = config.load(None, data=str(tmp_path), workers=2)
    path = tmp_path / "table"
    assert shared_table(two) is None and "no shared rate-limit table" in caplog.text
    native.create_table(path, 2)
    native.inherit_table(str(path), 1, 2)  # what a worker's parent tells it
    try:
        assert shared_table(two) == str(path)
        budgets = token_budgets(two)
        assert budgets is not None and isinstance(budgets.store, SharedBudgetStore)
        assert budgets.store.counters.table == str(path) and budgets.store.worker == (1, 2)
        assert shared_table(config.load(None, data=str(tmp_path))) is None  # one worker
        on_redis = config.load(None, data=str(tmp_path), workers=2,
                               **{"ratelimit.storage": "redis://127.0.0.1:1/0"})
        assert shared_table(on_redis) == str(path)  # bots count there; the limits on Redis
        assert not wants_shared_table(msgspec.structs.replace(on_redis, pipeline=[
            s for s in on_redis.pipeline if s.__struct_config__.tag != "bots"]))
        one = token_budgets(config.load(None, data=str(tmp_path)))
        assert one is not None and type(one.store) is MemoryBudgetStore
    finally:
        native.inherit_table(None)


def test_a_new_table_leaves_one_still_mapped_whole(tmp_path: Path) -> None:
    """A PoP starting again makes a new table at the same path: a process that still
    maps the old one (a worker of the PoP before) keeps counting in it, unharmed
    (truncating it in place would fault every access), and the new one starts empty."""
    path = tmp_path / "table"
    native.create_table(path, 2)
    old = shared(path, time.time)
    assert old.hit("k", "fixed_window", 1, 60)[0]
    native.create_table(path, 2)
    assert not old.hit("k", "fixed_window", 1, 60)[0]  # the old table, whole
    assert shared(path, time.time).hit("k", "fixed_window", 1, 60)[0]  # the new one, empty
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError):
        native.create_table(tmp_path / "dir", 1)  # not a file it can replace


@pytest.mark.parametrize(("value", "said"), [(12, "a multiple of 8"), (0, ">= 8"),
                                             (1 << 27, "<= 67108864")])
def test_a_table_size_it_cannot_make_is_refused_naming_the_key(tmp_path: Path, value: int,
                                                               said: str) -> None:
    from edgefn_core.errors import InvalidConfig
    from runtime import config

    with pytest.raises(InvalidConfig, match=f"ratelimit.shared_keys.*{said}"):
        config.load(None, data=str(tmp_path), **{"ratelimit.shared_keys": value})


# -- stream slots (budget.py's acquire/release, each worker's count in the table) -------------
# (which buckets (0: key, 1: tenant, 2: both), acquire or release, which worker)
STREAM_OPS = st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(0, 2)),
                      max_size=80)


@settings(max_examples=int(os.environ.get("EDGEFN_EXAMPLES", "150")), deadline=None)
@given(ops=STREAM_OPS)
def test_three_workers_hold_stream_slots_as_one_process_does(
        ops: list[tuple[int, bool, int]]) -> None:
    """Three workers' `SharedBudgetStore`s on one table take and give back stream
    slots exactly as one process's `MemoryBudgetStore` (the first full bucket or None);
    a worker gives back only what it holds."""
    from runtime.security.ratelimit.budget import MemoryBudgetStore, SharedBudgetStore

    with tempfile.TemporaryDirectory() as tmp:
        native.create_table(Path(tmp) / "table", 2)
        reference = MemoryBudgetStore()
        workers = [SharedBudgetStore(shared(Path(tmp) / "table", time.time), worker=(i, 3))
                   for i in range(3)]
        held: list[list[list[str]]] = [[], [], []]  # what each worker holds, stream by stream
        for which, take, w in ops:
            buckets, caps = [["key:k"], ["tenant:t"], ["key:k", "tenant:t"]][which], \
                [[2], [3], [2, 3]][which]
            if take:
                ours = _run(reference.acquire(buckets, caps))
                assert _run(workers[w].acquire(buckets, caps)) == ours, (which, w)
                if ours is None:
                    held[w].append(buckets)
            elif held[w]:
                given = held[w].pop(0)
                for store in (reference, workers[w]):
                    _run(store.release(given))


def test_a_worker_started_again_holds_nothing_its_last_life_took(table: Path) -> None:
    """A worker killed mid-stream (its slots never given back): once the parent starts
    it again (`join` as the same worker), what it held is free, at once; the other
    workers' slots still count."""
    held = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom runtime.security.ratelimit import native\n"
         "c = native.load().Counters(table=sys.argv[1])\nc.join(1, 2)\n"
         "print(c.acquire(['tenant:t'], [3]), c.acquire(['tenant:t'], [3]))", str(table)],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert held.stdout == "None None\n", held.stderr  # two streams, then killed (exit)
    alive = shared(table, time.time)
    alive.join(0, 2)
    assert alive.acquire(["tenant:t"], [3]) is None  # the third
    assert alive.acquire(["tenant:t"], [3]) == 0  # the dead one's two still count...
    again = shared(table, time.time)
    again.join(1, 2)  # ...until it is started again
    assert alive.acquire(["tenant:t"], [3]) is None and again.acquire(["tenant:t"], [3]) is None
    assert again.acquire(["tenant:t"], [3]) == 0  # 2 + 1: full
    again.release(["tenant:t"])
    assert alive.acquire(["tenant:t"], [3]) is None
    assert alive.table_stats["evictions"] == 0


STREAMER = """
import sys
from runtime.security.ratelimit import native
c = native.load().Counters(table=sys.argv[1])
c.join(int(sys.argv[2]), 4)
print("ready", flush=True)
sys.stdin.readline()
taken = []
for r in range(1000):  # a fresh tenant each round: take its slots until its cap refuses
    n = 0
    while c.acquire(["key:k", f"tenant:{r}"], [10**9, 5]) is None:
        n += 1
    taken.append(n)
print(*taken, flush=True)
"""


def test_workers_taking_streams_at_once_hold_exactly_the_cap(tmp_path: Path) -> None:
    """Four workers racing for 1,000 tenants' 5 stream slots each (a fresh tenant a
    round), each taking slots until the cap refuses it: every tenant ends with
    exactly 5 held, between them (a check and a take not made under the locks of
    every worker's slot let a sixth in). The table holds every slot taken."""
    native.create_table(tmp_path / "table", 4096)
    counts = together_as_workers(STREAMER, str(tmp_path / "table"))
    per_tenant = [sum(round_) for round_ in zip(*counts, strict=True)]
    assert per_tenant == [5] * 1000, [i for i, n in enumerate(per_tenant) if n != 5][:10]
    assert shared(tmp_path / "table", time.time).table_stats["evictions"] == 0
    assert sum(any(n for n in c) for c in counts) >= 2, "they did not race"


def test_stream_slots_need_a_worker_it_can_count(table: Path) -> None:
    c = shared(table, time.time)
    with pytest.raises(ValueError, match="need `join` first"):
        c.acquire(["t"], [1])
    for worker, workers in ((0, 0), (2, 2), (-1, 2), (0, 257)):
        with pytest.raises(ValueError, match="at most 256 workers"):
            c.join(worker, workers)
    with pytest.raises(ValueError, match="need a shared table"):
        module().Counters().join(0, 1)
    c.join(0, 1)
    with pytest.raises(TypeError, match="one cap a bucket"):
        c.acquire(["a", "b"], [1])


def test_an_earlier_lifes_stream_slots_are_free_for_other_keys(tmp_path: Path) -> None:
    """Slots a worker held streams in before it was started again are free: a new key
    takes one without giving up a live window."""
    native.create_table(tmp_path / "table", 1)  # one group of 8 slots
    first = shared(tmp_path / "table", time.time)
    first.join(0, 1)
    for i in range(8):
        assert first.acquire([f"tenant:{i}"], [1]) is None
    again = shared(tmp_path / "table", time.time)
    again.join(0, 1)  # started again: the 8 slots are its earlier life's
    assert again.hit("k", "fixed_window", 1, 60)[0] and again.acquire(["tenant:0"], [1]) is None
    assert again.table_stats["evictions"] == 0
