"""Whether this machine can sandbox Python functions, as the PoP sees it.

`probe` runs the sandbox (`sandbox.apply`) in a throwaway process once and
reads back which layers hold. A PoP refuses Python functions (`require`) while a
layer is missing, unless it was started with ``--insecure-python``; it says which
at start (`report`) and `edgefn doctor` lists them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import tempfile

from edgefn_core.errors import SandboxMissing
from runtime.executors.python import sandbox
from runtime.executors.python.host import IMPORT_ROOTS

log = logging.getLogger("edgefn.pop")

PROBE_TIMEOUT = 30.0


@functools.cache
def probe() -> dict[str, str]:
    """Each layer of `sandbox.LAYERS` and its state on this machine: "enforced",
    "not applicable: ..." or "missing: why". Cached: the machine does not change."""
    with tempfile.TemporaryDirectory(prefix="edgefn-probe-") as scratch:
        try:
            out = subprocess.run(
                [sys.executable, "-P", "-m", "runtime.executors.python.sandbox", scratch],
                capture_output=True, env=_probe_env(),
                timeout=PROBE_TIMEOUT, check=False)
            state: dict[str, str] = json.loads(out.stdout)
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            why = f"missing: the sandbox probe failed ({e})"
            return dict.fromkeys(sandbox.LAYERS, why)
    return {layer: state.get(layer, "missing: not reported") for layer in sandbox.LAYERS}


def _probe_env() -> dict[str, str]:
    env = sandbox.host_environment(IMPORT_ROOTS)
    if sandbox.SKIP_ENV in os.environ:
        env[sandbox.SKIP_ENV] = os.environ[sandbox.SKIP_ENV]
    return env


def missing(state: dict[str, str]) -> dict[str, str]:
    """The layers of `state` that are missing, with why."""
    return {k: v.removeprefix("missing: ") for k, v in state.items() if v.startswith("missing")}


def require(insecure: bool, label: str) -> None:
    """Raises `SandboxMissing` naming the missing layers, unless none is or `insecure`."""
    gone = missing(probe())
    if gone and not insecure:
        raise SandboxMissing(
            f"{label}: Python functions run only sandboxed, and this machine lacks "
            f"{_describe(gone)}; start the PoP with --insecure-python to run them anyway "
            "(see `edgefn doctor`)")


def report(insecure: bool) -> None:
    """Log, once at PoP start, the sandbox layers this machine lacks."""
    gone = missing(probe())
    if not gone:
        log.info("Python sandbox: every layer enforced")
    elif insecure:
        log.warning("Python sandbox incomplete, running Python functions anyway "
                    "(--insecure-python): missing %s", _describe(gone))
    else:
        log.warning("Python sandbox incomplete: Python functions will be refused "
                    "(--insecure-python runs them anyway): missing %s", _describe(gone))


def _describe(gone: dict[str, str]) -> str:
    return "; ".join(f"{layer} ({why})" for layer, why in gone.items())
