"""The native epoch ticker parks while no guest can need it and wakes for every
guest that runs: each way a guest starts (the extension's `serve`, the C entry the
native lane calls, a WASI command, a start function at deploy) and a host call
that outlasts the ticker's idle time still end at their deadline after a park; it
parks soon after the last guest ended, however far its deadline was.
A way that did not wake it would spin on past its limit: each such test gives
the guest 2 s, then closes the engine (which ends any guest) and fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefn_core.abi import NO_PAIRS, encode_request
from edgefn_core.errors import DeployError, FunctionError
from runtime.bindings import Bindings, Stores
from runtime.executors.wasm import native as wasm_native
from runtime.executors.wasm.engine import WasmEngine
from runtime.executors.wasm.function import INLINE_SLICE_MS, WasmFunction
from runtime.executors.wasm.native import NativeTicker
from runtime.functions import manifest
from tests.executors.test_wasm_function import failure, wasi
from tests.support import function_dir, reactor

pytestmark = pytest.mark.skipif(wasm_native.load() is None, reason="no C compiler")

IDLE = 0.001  # the ticker's idle time here (the PoP's: 1 s): shorter than any deadline below
SPIN = "(loop $l (br $l))"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[WasmEngine]:
    e = WasmEngine(tmp_path / "cache", ticker_idle=IDLE)
    yield e
    e.close()


def ticker(engine: WasmEngine) -> NativeTicker:
    t = engine.native_ticker
    assert t is not None
    return t


def park(engine: WasmEngine) -> None:
    """Wait until the ticker is parked (it has parked, and not one tick came in 50 ms;
    50 while awake), or fail. (Guests are counted process-wide: another test's guest
    still running keeps it awake.)"""
    t = ticker(engine)
    deadline = time.monotonic() + 5
    while True:
        assert time.monotonic() < deadline, "the ticker never parked"
        ticks = t.ticks()
        time.sleep(0.05)
        if t.parks() and t.ticks() == ticks:
            return


def ends(engine: WasmEngine, run: Callable[[], object]) -> tuple[object, float]:
    """What `run` returned or raised, on a thread given 2 s, and the seconds it took;
    past 2 s the engine closes (every guest ends) and the test fails."""
    out: list[object] = []
    started = time.perf_counter()

    def go() -> None:
        try:
            out.append(run())
        except Exception as e:  # the test looks at what it was
            out.append(e)

    thread = threading.Thread(target=go)
    thread.start()
    thread.join(2)
    if thread.is_alive():
        engine.close()
        thread.join(5)
        pytest.fail("the guest ran on past its deadline: the ticker stayed parked")
    return out[0], time.perf_counter() - started


def stopped_in_time(outcome: tuple[object, float], code: str = "cpu_limit") -> None:
    """It failed with `code` after about its 30 ms: not earlier (ticks caught up for
    the time the ticker was parked would end it at once), nor much later."""
    err, took = outcome
    assert isinstance(err, FunctionError) and err.code == code, err
    assert 0.025 < took < 0.5, took


def test_a_running_guest_keeps_the_ticker_awake_and_it_parks_soon_after_the_guest_ends(
        engine: WasmEngine) -> None:
    t = ticker(engine)
    park(engine)
    parks = t.parks()
    wasm_native.guest_begin()
    try:
        ticks = t.ticks()
        time.sleep(6 * IDLE)
        assert t.ticks() - ticks >= 4 * IDLE * 1000, "not ticking while a guest runs"
        assert t.parks() == parks  # six idle times: still awake, the guest runs
    finally:
        wasm_native.guest_end()
    time.sleep(IDLE + 0.005)
    ticks = t.ticks()
    time.sleep(0.05)
    assert (t.ticks() == ticks, t.parks() > parks) == (True, True)  # parked since the end


def test_a_ticker_with_no_idle_time_never_parks(tmp_path: Path) -> None:
    e = WasmEngine(tmp_path / "cache", ticker_idle=0)
    try:
        t = ticker(e)
        time.sleep(0.15)
        ticks = t.ticks()
        time.sleep(0.1)
        assert (t.parks(), t.ticks() - ticks > 40) == (0, True)
    finally:
        e.close()


def spinner(engine: WasmEngine, tmp_path: Path, cpu_ms: int = 30) -> WasmFunction:
    d = function_dir(tmp_path, "spin", reactor(SPIN), limits=f"cpu_ms = {cpu_ms}")
    fn = WasmFunction(engine, manifest.load(d), d)
    fn.prewarm()
    return fn


def test_a_spinning_reactor_served_after_a_park_stops_at_its_cpu_limit(
        engine: WasmEngine, tmp_path: Path) -> None:
    fn = spinner(engine, tmp_path)  # cut at the inline slice, then run on a thread
    park(engine)
    stopped_in_time(ends(engine, lambda: failure(fn)))


def test_a_spinning_reactor_served_inline_after_a_park_stops_at_its_cpu_limit(
        engine: WasmEngine, tmp_path: Path) -> None:
    fn = spinner(engine, tmp_path, cpu_ms=INLINE_SLICE_MS)  # the extension's serve alone
    park(engine)
    err, took = ends(engine, lambda: failure(fn))
    assert isinstance(err, FunctionError) and err.code == "cpu_limit", err
    assert INLINE_SLICE_MS / 1000 * 0.8 < took < 0.5, took


def test_a_spinning_reactor_through_the_lanes_c_entry_after_a_park_stops_too(
        engine: WasmEngine, tmp_path: Path) -> None:
    call = spinner(engine, tmp_path).new_call()  # `edgefn_reactor_call`, as the lane's C calls
    request = encode_request(b"GET", b"/", b"", [], NO_PAIRS, b"")
    park(engine)
    stopped_in_time(ends(engine, lambda: call(request)))


def test_a_spinning_wasi_command_after_a_park_stops_at_its_cpu_limit(
        engine: WasmEngine, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "wspin", wasi(SPIN), limits="cpu_ms = 30")
    fn = WasmFunction(engine, manifest.load(d), d)
    fn.prewarm()
    park(engine)
    stopped_in_time(ends(engine, lambda: failure(fn)))


def test_a_start_function_looping_at_a_deploy_after_a_park_is_refused(
        engine: WasmEngine, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "start", reactor("", prelude=f"(func $s {SPIN}) (start $s)"),
                     limits="cpu_ms = 30")
    fn = WasmFunction(engine, manifest.load(d), d)  # compiled: the start has not run
    park(engine)
    err, took = ends(engine, fn.prewarm)
    assert isinstance(err, DeployError) and "did not finish within 30 ms" in str(err), err
    assert 0.025 < took < 0.5, took


INCREMENTS = "(drop (call $inc (i32.const 200) (i32.const 1) (i32.const 210) (i32.const 1) " \
             "(i64.const 1)))" * 2  # kv_increment("c", "k", 1), twice (a synced write each)


def test_host_calls_that_outlast_the_tickers_idle_time_keep_it_awake(tmp_path: Path) -> None:
    """Each host call pushes the guest's deadline back by what it took, past the
    ticker's idle time many times over: a guest in a host call still runs, and when it
    is back in its loop the ticker must be ticking."""
    e = WasmEngine(tmp_path / "cache", ticker_idle=IDLE)
    body = f"""(loop $l {INCREMENTS}
      (local.set $i (i32.const 1000000))
      (loop $s (local.set $i (i32.sub (local.get $i) (i32.const 1))) (br_if $s (local.get $i)))
      (br $l))"""
    source = reactor(body, prelude='(data (i32.const 200) "c") (data (i32.const 210) "k")',
                     imports='(import "edgefn" "kv_increment" '
                             '(func $inc (param i32 i32 i32 i32 i64) (result i64)))')
    source = source.replace("(result i64)\n", "(result i64) (local $i i32)\n", 1)
    d = function_dir(tmp_path, "inc", source, limits="cpu_ms = 30\nwall_ms = 1500",
                     extra='[bindings]\nkv = ["c"]')
    stores = Stores(tmp_path / "data")
    try:
        fn = WasmFunction(e, manifest.load(d), d, Bindings.prepare(stores, manifest.load(d)))
        fn.prewarm()
        park(e)
        err, took = ends(e, lambda: failure(fn))
        calls = stores.kv.get("c", b"k")
        assert isinstance(err, FunctionError), err
        # a ticker parked under it: the CPU deadline never came, the wall one did
        assert (err.code, err.status) == ("cpu_limit", 503), (err, took, calls)
        assert took < 0.5, (took, calls)
    finally:
        e.close()
        stores.close()

