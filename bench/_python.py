"""Which interpreter a benchmark ran on, for its header. On pyenv's CPython 3.13.0
(shared libpython, built without profile-guided and link-time optimization) a Python
hello request cost 1.15-1.22x what it cost on 3.13.5 built with them, its isolate's
part 1.3x (README "An optimized interpreter"), so a figure says which it had.
``make python`` builds the optimized one.

As a script, ``python _python.py VERSION`` exits 0 when the interpreter running it is
CPython VERSION built with both (how `.ci/python-pgo` decides to keep a build)."""

from __future__ import annotations

import platform
import sys
import sysconfig


def optimized(config_args: str) -> bool:
    """Whether `config_args` (sysconfig's CONFIG_ARGS) asked for PGO and LTO
    (``--with-lto``, or ``--with-lto=`` any kind but ``no``)."""
    args = config_args.replace("'", " ").split()
    lto = any(a == "--with-lto" or (a.startswith("--with-lto=") and a != "--with-lto=no")
              for a in args)
    return "--enable-optimizations" in args and lto


def running_optimized() -> bool:
    """Whether the interpreter running this was built with PGO and LTO."""
    return optimized(sysconfig.get_config_var("CONFIG_ARGS") or "")


def build() -> str:
    """This interpreter, as the header line names it."""
    kind = "PGO + LTO" if running_optimized() else "built without PGO and LTO: `make python`"
    return f"{platform.python_implementation()} {platform.python_version()} ({kind})"


if __name__ == "__main__":
    sys.exit(not (platform.python_version() == sys.argv[1] and running_optimized()))
