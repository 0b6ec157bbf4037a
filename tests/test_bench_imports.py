"""Every script under bench/ imports: the benchmarks are run by hand, so a name one
of them takes from the runtime (bench/_front_only.py's `wait_for_signal`, gone when
`StopSignals` replaced it) would otherwise break only when someone next measures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_a_bench_script_imports(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])  # restored after: scripts
    spec = importlib.util.spec_from_file_location(  # add their folders to it
        f"bench_under_test_{script[:-3]}", BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)  # its top level only: `main` runs under __main__
    finally:  # bench's own modules leave (`_wrk`, `bench_runtime`): nothing else sees them
        for name, m in list(sys.modules.items()):
            if name == spec.name or str(getattr(m, "__file__", "") or "").startswith(
                    str(BENCH)):
                del sys.modules[name]
