from __future__ import annotations

import logging
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from edgefn_core.process import load_system_libstdcxx

# Under `make mutate` (mutmut sets MUTANT_UNDER_TEST) every call of mutated code goes
# through a trampoline, at nice 10 beside other work: an example of test_abi took 311 ms
# against hypothesis's 200 ms deadline and stopped the stats run ("failed to collect
# stats. runner returned 1"); a deadline there would also count a slow example as a kill.
if "MUTANT_UNDER_TEST" in os.environ:
    settings.register_profile("mutmut", deadline=None)
    settings.load_profile("mutmut")

# A suite started in the background of a script (`make test &`, `nohup ... &`) inherits
# SIGINT ignored (POSIX, for asynchronous commands without job control), and so did
# every child it spawned: Python keeps an ignored SIGINT ignored, so the tests of
# Ctrl-C (`edgefn tail`, `edgefn topology up`) found children deaf to it (a fresh clone
# run that way failed them). Handled here, the children start with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# pytest runs the PoP (usearch) and the ONNX engine in one process: the system
# libstdc++ must be global before anything imports usearch (load_system_libstdcxx).
load_system_libstdcxx()

from tests.support import Running, pop_thread  # noqa: E402


@pytest.fixture
def pop(tmp_path: Path) -> Iterator[Running]:
    """A real PoP on an ephemeral loopback port with a fresh data dir."""
    with pop_thread(tmp_path / "data") as running:
        yield running


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """`edgefn` commands run in-process (tests/cli, tests/rollout) configure logging
    (`runtime.cli.logs.configure`). Its handlers were bound to that test's captured
    stderr, which pytest closes after it: every later log line failed with "--- Logging
    error ---" and a printed call stack, on the thread that logged (40 requests'
    wall-limit warnings took 100+ ms of a PoP loop's CPU so in full runs). They now
    write to the stderr of the moment (`logs.Stderr`), but each test still gets the
    logging it started with: the handlers it added (not pytest's) go, and the levels
    and propagation come back."""
    loggers = [logging.getLogger(), logging.getLogger("edgefn.functions")]
    saved = [(lg, set(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        for h in lg.handlers[:]:
            if h not in handlers and not type(h).__module__.startswith("_pytest"):
                lg.removeHandler(h)
        lg.setLevel(level)
        lg.propagate = propagate


@pytest.fixture
def rand() -> random.Random:
    """Seeded randomness that prints its seed (rerun with EDGEFN_SEED=...)."""
    seed = int(os.environ.get("EDGEFN_SEED", random.randrange(2**32)))
    print(f"EDGEFN_SEED={seed}")
    return random.Random(seed)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """The random order's seed, even with -q, so a failing order can be replayed."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and getattr(config.option, "randomly_reorganize", True):
        terminalreporter.write_line(f"tests ran in random order: replay it with "
                                    f"--randomly-seed={seed}")


_exit_status: list[int] = []
# how long threads still running after the tests may take to end (tests/test_suite_exit.py)
LEFT_THREADS_S = float(os.environ.get("EDGEFN_TEST_LEFT_THREADS_S", "60"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Once the summary is out, end what interpreter exit would join: worker pools are
    told to stop, as at exit, and other threads get `LEFT_THREADS_S` in all. One still
    running then would keep the process alive until CI kills it (a guest spinning on a
    closed engine's thread did: the run ran out of its 5400 s after its summary), so
    its stack is printed and the process exits with the tests' status, or 3 if they
    passed. Only where this process ends with pytest (`make test`), not in-process runs
    such as mutmut's, which go on using thread pools."""
    import concurrent.futures.thread as pool_threads
    import faulthandler
    import sys
    import threading
    import time

    if Path(sys.argv[0]).name not in ("pytest", "py.test") and \
            not sys.argv[0].endswith(os.path.join("pytest", "__main__.py")):
        return
    with pool_threads._global_shutdown_lock:
        pool_threads._shutdown = True
    for _, q in list(pool_threads._threads_queues.items()):
        q.put(None)  # what concurrent.futures does at exit: idle workers end
    until = time.monotonic() + LEFT_THREADS_S

    def running() -> list[threading.Thread]:
        return [t for t in threading.enumerate()
                if t is not threading.main_thread() and not t.daemon and t.is_alive()]

    for t in running():
        t.join(max(until - time.monotonic(), 0))
    left = running()
    if left:
        sys.stdout.flush()
        sys.stderr.write(f"\n{len(left)} thread(s) still running {LEFT_THREADS_S:g} s after the "
                         f"tests would keep this process from exiting: "
                         f"{', '.join(t.name for t in left)}\n")
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit((_exit_status or [0])[0] or 3)
