"""The Python isolate's watchdog and thread stopping, in this process (the same code
runs inside each isolate's interpreter): limits land within one tick of the
configured figure, never early, and a disarmed watchdog raises nothing."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefn_core.errors import CpuInterrupt, IsolateInterrupt, ThreadStop, WallInterrupt
from runtime.executors.python import watchdog
from runtime.executors.python.watchdog import Watchdog, quiet_thread_stop, stop_threads


@pytest.fixture(autouse=True)
def no_collection_meanwhile() -> Iterator[None]:
    """Every test here lands exceptions in running threads (`PyThreadState_SetAsyncExc`).
    A collection that runs in one of them meanwhile (any thread may run the one another
    scheduled) can take it inside an earlier test's finalizer: fresh-clone CI, seed
    713736070, a ThreadStop in a wasmtime InstancePre's `__del__`, an unraisable error.
    So the collector runs before each test, and not during it."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_guarded(cpu_ms: int, wall_ms: int, work: str, seconds: float = 2.0,
                before: float = 0.03) -> tuple[type[BaseException] | None, float, float]:
    """Run `work` ("spin" burns CPU, "sleep" naps in 1 ms steps) on a fresh thread under
    a watchdog for up to `seconds`: what interrupted it, and the thread's CPU and wall
    time until then. The thread first burns `before` seconds of CPU and then idles a
    few ticks with the watchdog disarmed, as an isolate between two requests does: only
    this request's own time may count."""
    out: dict[str, object] = {}

    def handler(wall0: float) -> None:
        # In its own frame, as a handler is: CPython 3.13.0 lets an asynchronous
        # exception raised in a `while <call>:` test skip that frame's own handlers.
        while time.monotonic() - wall0 < seconds:
            if work == "sleep":
                time.sleep(0.001)

    def target() -> None:
        dog = Watchdog(threading.get_ident(), cpu_ms, wall_ms)
        spent = time.thread_time()
        while time.thread_time() - spent < before:  # an earlier request's CPU
            pass
        time.sleep(3 * dog.tick)  # idle: the watchdog wakes and finds nothing armed
        wall0, cpu0 = time.monotonic(), time.thread_time()
        try:
            dog.arm()
            try:
                handler(wall0)
            finally:
                dog.disarm()
        except IsolateInterrupt as e:
            out["raised"] = type(e)
        out["cpu"], out["wall"] = time.thread_time() - cpu0, time.monotonic() - wall0
        dog.stop()

    t = threading.Thread(target=target)
    t.start()
    t.join()
    return out.get("raised"), out["cpu"], out["wall"]  # type: ignore[return-value]


def test_the_tick_is_a_quarter_of_the_tighter_limit_within_5_to_100_ms() -> None:
    ticks = []
    for cpu, wall in ((40, 1000), (1000, 80), (1, 1), (10_000, 60_000)):
        dog = Watchdog(threading.get_ident(), cpu, wall)
        ticks.append(dog.tick)
        dog.stop()
    assert ticks == [0.01, 0.02, 0.005, 0.1]


def test_a_spinning_handler_stops_within_a_tick_of_its_cpu_limit() -> None:
    raised, cpu, _ = run_guarded(cpu_ms=40, wall_ms=5000, work="spin")
    assert raised is CpuInterrupt
    assert 0.040 <= cpu < 0.040 + 0.030  # a tick is 10 ms: three of slack for a busy box


def test_a_sleeping_handler_stops_within_a_tick_of_its_wall_limit() -> None:
    raised, cpu, wall = run_guarded(cpu_ms=1000, wall_ms=80, work="sleep")
    assert raised is WallInterrupt
    assert 0.080 <= wall < 0.080 + 0.060
    assert cpu < 0.080  # it was the wall limit, not the CPU one


def test_a_handler_within_its_limits_is_never_interrupted() -> None:
    raised, _, wall = run_guarded(cpu_ms=1000, wall_ms=1000, work="sleep", seconds=0.2)
    assert raised is None and wall >= 0.2


def test_a_reused_cpu_reading_never_lands_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """`arm` soon after the last reading of the thread's CPU clock reuses it (no clock
    read): the CPU the thread spent meanwhile (an earlier request's) is not this
    request's, so the limit still lands only once this request has spent it, and
    within the wall time since that reading (plus a tick) after."""
    monkeypatch.setattr(watchdog, "REREAD_AFTER", 10.0)  # reuse, however slow the box
    out: dict[str, float] = {}

    def target() -> None:
        dog = Watchdog(threading.get_ident(), 20, 5000)
        dog.arm()  # reads the clock
        dog.disarm()
        spent = time.thread_time()
        while time.thread_time() - spent < 0.030:  # an earlier request's CPU, past the limit
            pass
        read_at, wall0, cpu0 = dog.read_at, time.monotonic(), time.thread_time()
        try:
            dog.arm()
            try:
                while True:
                    pass
            finally:
                dog.disarm()
        except CpuInterrupt:
            out["cpu"] = time.thread_time() - cpu0
        out["reused"] = float(dog.read_at == read_at)
        out["since"] = wall0 - read_at
        dog.stop()

    t = threading.Thread(target=target)
    t.start()
    t.join()
    assert out["reused"] == 1.0
    assert 0.020 <= out["cpu"] < 0.020 + out["since"] + 0.015  # ticks of 5 ms


def test_an_interrupt_is_raised_once_then_again_only_after_a_second() -> None:
    """A handler that swallows its interrupt gets another one, but not within the
    moment the request loop needs to disarm."""
    landed: list[tuple[float, float]] = []  # (wall, CPU) since arming

    def target() -> None:
        dog = Watchdog(threading.get_ident(), 20, 5000)
        began, cpu0 = time.monotonic(), time.thread_time()
        dog.arm()
        while len(landed) < 2 and time.monotonic() - began < 3:
            try:
                while True:
                    pass
            except CpuInterrupt:
                landed.append((time.monotonic() - began, time.thread_time() - cpu0))
        dog.disarm()
        dog.stop()

    t = threading.Thread(target=target)
    t.start()
    t.join()
    assert len(landed) == 2, landed
    assert 0.020 <= landed[0][1] < 0.020 + 0.015  # within 3 ticks of 5 ms of CPU
    gap = landed[1][0] - landed[0][0]
    assert watchdog.RERAISE_AFTER <= gap < watchdog.RERAISE_AFTER + 0.5


def test_the_limit_is_named_in_the_message() -> None:
    dog = Watchdog(threading.get_ident(), 1000, 3000)
    try:
        assert dog.exceeded("cpu_limit") == "exceeded its CPU limit of 1000 ms"
        assert dog.exceeded("wall_limit") == "exceeded its wall-time limit of 3000 ms"
    finally:
        dog.stop()


def test_stop_threads_ends_spinning_threads_and_reports_blocked_ones() -> None:
    halt = threading.Event()

    def spin() -> None:
        while not halt.is_set():
            pass

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    blocked = threading.Thread(target=halt.wait, args=(5,))
    for t in (*spinners, blocked):
        t.start()
    ended_by: list[type[BaseException] | None] = []

    def hook_(args: threading.ExceptHookArgs) -> None:
        ended_by.append(args.exc_type)

    hook, threading.excepthook = threading.excepthook, hook_
    try:
        began = time.monotonic()
        left = stop_threads([*spinners, blocked], grace=0.3)
        assert left == [blocked]  # waiting in C (a lock): the exception cannot land yet
        assert time.monotonic() - began >= 0.3
        assert not any(t.is_alive() for t in spinners)
    finally:
        halt.set()
        blocked.join()
        threading.excepthook = hook
    # once it returns to Python it takes the pending ThreadStop and ends
    assert not blocked.is_alive()
    assert ended_by == [ThreadStop] * 3


def test_stop_threads_returns_at_once_when_none_runs() -> None:
    began = time.monotonic()
    assert stop_threads([], grace=5) == []
    assert time.monotonic() - began < 0.1


def test_a_thread_stop_is_not_reported_as_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    hook, threading.excepthook = threading.excepthook, quiet_thread_stop
    try:
        def boom(exc: type[BaseException]) -> None:
            raise exc
        for exc in (ThreadStop, ValueError):
            t = threading.Thread(target=boom, args=(exc,))
            t.start()
            t.join()
    finally:
        threading.excepthook = hook
    err = capsys.readouterr().err
    assert "ValueError" in err and "ThreadStop" not in err


def switches(thread: threading.Thread) -> int:
    """How many times `thread` has gone to sleep (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def spin() -> None:
    """Two seconds of CPU, in its own frame, as in `run_guarded`."""
    began = time.monotonic()
    while time.monotonic() - began < 2:
        pass


def parked_dog() -> Watchdog:
    """A watchdog for this thread (cpu_ms 20, a tick of 5 ms, parking after 50 ms),
    once it has parked (or after 2 s)."""
    dog = Watchdog(threading.get_ident(), 20, 5000)
    dog.park_after = 0.05
    began = time.monotonic()
    while not dog.parked and time.monotonic() - began < 2:
        time.sleep(0.01)
    return dog


def spin_watched(dog: Watchdog, out: dict[str, object]) -> None:
    """`spin` as a request under `dog`: what interrupted it (``raised``) and the CPU it
    took (``cpu``) into `out`."""
    cpu0 = time.thread_time()
    try:
        dog.arm()
        try:
            spin()
        finally:
            dog.disarm()
    except IsolateInterrupt as e:
        out["raised"] = type(e)
    out["cpu"] = time.thread_time() - cpu0


def in_thread(target: Callable[[], None]) -> None:
    t = threading.Thread(target=target)
    t.start()
    t.join(10)


def test_an_idle_watchdog_parks_and_the_next_request_wakes_it() -> None:
    """Idle, it stops ticking (an idle isolate woke 80 times a second); a request armed
    after that is still stopped within a tick of its limit, and `stop` ends it parked."""
    out: dict[str, object] = {}

    def target() -> None:
        dog = parked_dog()
        before = switches(dog.thread)
        time.sleep(0.3)  # 60 ticks, were it ticking
        out["parked"], out["woke"] = dog.parked, switches(dog.thread) - before
        spin_watched(dog, out)
        began = time.monotonic()
        while not dog.parked and time.monotonic() - began < 3:  # parked again
            time.sleep(0.01)
        stopper = threading.Thread(target=dog.stop)
        stopper.start()
        stopper.join(2)
        out["stopped"] = not stopper.is_alive()

    in_thread(target)
    assert out["parked"] is True and out["woke"] == 0, out
    assert out.get("raised") is CpuInterrupt, out
    assert 0.020 <= out["cpu"] < 0.020 + 0.030, out  # type: ignore[operator]
    assert out["stopped"] is True


def test_a_request_shorter_than_a_tick_after_a_park_leaves_the_watchdog_watching() -> None:
    """A request armed and disarmed before the woken watchdog's next tick (most are)
    finds it idle again, not gone: the next request past its limit is still stopped
    within a tick (the idle count restarts at 0 after a park)."""
    out: dict[str, object] = {}

    def target() -> None:
        dog = parked_dog()
        out["parked"] = dog.parked
        dog.arm()  # wakes it
        dog.disarm()  # before its next tick
        time.sleep(0.03)  # a few idle ticks
        out["alive"] = dog.thread.is_alive()
        spin_watched(dog, out)
        dog.stop()

    in_thread(target)
    assert out["parked"] is True and out["alive"] is True, out
    assert out.get("raised") is CpuInterrupt, out
    assert 0.020 <= out["cpu"] < 0.020 + 0.030, out  # type: ignore[operator]
