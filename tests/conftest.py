from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefn_core.process import load_system_libstdcxx

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
