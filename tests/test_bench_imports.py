"""Every script under bench/ imports: the benchmarks are run by hand, so a name one
of them takes from the runtime (bench/_front_only.py's `wait_for_signal`, gone when
`StopSignals` replaced it) would otherwise break only when someone next measures.
They are imported in a child process: some set what they measure at import
(bench_observe_inprocess.py sets the inline slice to 10 s, bench_vectors.py
OPENBLAS_NUM_THREADS), which in the suite's process broke six tests of the slice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import importlib.util, sys, traceback
from pathlib import Path
bench = Path(sys.argv[1])
sys.path[:0] = [str(bench.parent), str(bench)]
failed = []
for script in sorted(bench.glob("*.py")):
    spec = importlib.util.spec_from_file_location("bench_under_test_" + script.stem, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)  # its top level only: `main` runs under __main__
    except BaseException:
        failed.append(script.name + ": " + traceback.format_exc(limit=3))
print("\\n".join(failed) if failed else "all imported", flush=True)
"""


def test_every_bench_script_imports() -> None:
    child = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "bench")],
                           capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().splitlines()[-1:] == ["all imported"], child.stdout[-5000:]
