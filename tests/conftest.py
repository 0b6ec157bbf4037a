from __future__ import annotations

import logging
import os
import random
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
    (`runtime.cli.logs.configure`): a handler on that test's captured stderr, which pytest
    closes after it. Every later log line then failed with "--- Logging error ---" and a
    printed call stack, on the thread that logged: 40 requests' wall-limit warnings took
    100+ ms of a PoP loop's CPU so in full runs. After each test, the handlers it added
    (not pytest's) go, and the levels and propagation come back."""
    loggers = [logging.getLogger(), logging.getLogger("edgefn.functions")]
    saved = [(lg, set(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        for h in lg.handlers[:]:
            if type(h) is logging.StreamHandler and h not in handlers:
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
