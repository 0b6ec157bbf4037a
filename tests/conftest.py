from __future__ import annotations

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
