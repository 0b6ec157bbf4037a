"""The function ABI's hot paths in C (``codec.c``, the `_edgefn_codec` extension),
compiled on first use with the system C compiler.

`abi` and `frames` ask `module()` once, at import: the extension, or None, and then
they use their pure-Python code, which stays the reference (the C answers only what
it is sure of and hands the rest, errors included, to it). None when
``EDGEFN_NATIVE=0`` or ``EDGEFN_NATIVE_CODEC=0``, or when there is no compiler or no
``Python.h`` (logged once).

Only the main interpreter builds (into ``$EDGEFN_NATIVE_CACHE``, default
``~/.cache/edgefn/native``, as the WASM reactor's library). A subinterpreter never
compiles: it loads the library the process's main interpreter loaded, if it was
told its path (`use`: the isolate host's bootstrap does so before a guest imports
the SDK); its loader then finds the library already mapped, which a sandboxed guest
could not open. Stdlib-only, as `abi` is.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a build needs them: a guest only loads, and these
    # (with logging) were ~15 of the ~100 ms of CPU a fresh isolate's interpreter costs
    from pathlib import Path

SOURCE = os.path.join(os.path.dirname(__file__), "codec.c")
NAME = "_edgefn_codec"  # the module name codec.c's PyInit_ is for
OFF = ("EDGEFN_NATIVE", "EDGEFN_NATIVE_CODEC")  # either set to "0": pure Python

_given: str | None = None  # the library's path, in a subinterpreter told it (`use`)
_loaded: str | None = None  # the path `module()` loaded


def use(path: str | None) -> None:
    """In a subinterpreter, before `abi` is imported: load the extension from `path`
    (what `loaded_path()` said in the main interpreter); None: pure Python."""
    global _given
    _given = path


def loaded_path() -> str | None:
    """The library `module()` loaded in this interpreter, or None."""
    module()
    return _loaded


@cache
def module() -> ModuleType | None:
    """The extension, built if needed (main interpreter only), or None."""
    global _loaded
    if any(os.environ.get(name, "1") == "0" for name in OFF):
        return None
    main = _in_main_interpreter()
    if not main and _given is None:
        return None
    try:
        path = _given if not main and _given else str(build())
        mod = import_extension(NAME, path)
    except (OSError, RuntimeError, ImportError) as e:
        if main:
            import logging

            logging.getLogger("edgefn.native").warning(
                "the C codec is unavailable (%s); using the Python one", e)
        return None
    _loaded = str(path)
    return mod


def _in_main_interpreter() -> bool:
    try:
        import _interpreters
    except ImportError:  # a Python without subinterpreters has only the main one
        return True
    return bool(_interpreters.get_current()[0] == _interpreters.get_main()[0])


def import_extension(name: str, path: str | Path) -> ModuleType:
    """The shared library at `path` imported as the extension module `name` (not put
    in sys.modules). Raises ImportError."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {path} as {name}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@cache
def python_headers() -> Path | None:
    """Where ``Python.h`` is, if this Python's headers are installed."""
    import sysconfig  # here and in `build`: a guest, which only loads, never imports them
    from pathlib import Path

    include = Path(sysconfig.get_paths()["include"])
    return include if (include / "Python.h").exists() else None


def build(source: str | Path = SOURCE, stem: str = "codec", parts: tuple[Path, ...] = ()
          ) -> Path:
    """`source` compiled as a CPython extension for this Python (`compile_cached`,
    keyed by the Python build and the bytes of `parts`, the files `source`
    ``#include``s). Raises RuntimeError without a C compiler or Python's headers, or
    if the build fails."""
    from pathlib import Path

    headers = python_headers()
    if headers is None:
        raise RuntimeError("no Python.h: this Python's headers are not installed")
    key = (sys.version + str(headers)).encode() + b"".join(p.read_bytes() for p in parts)
    return compile_cached(Path(source), stem, key, ["-Wall", f"-I{headers}"])


def compile_cached(source: Path, stem: str, key: bytes, args: list[str]) -> Path:
    """`source` compiled with the system C compiler (``$CC``, else cc, gcc or clang)
    and `args` into a shared library in the native cache (``$EDGEFN_NATIVE_CACHE``,
    default ``~/.cache/edgefn/native``) as ``STEM-HASH.so``, keyed by the source and
    `key`; built once (the WASM reactor's and the codec's libraries alike). Raises
    RuntimeError without a C compiler or if the build fails."""
    import hashlib
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    digest = hashlib.sha256(source.read_bytes() + key).hexdigest()[:16]
    cache_dir = Path(os.environ.get("EDGEFN_NATIVE_CACHE",
                                    Path.home() / ".cache" / "edgefn" / "native"))
    out = cache_dir / f"{stem}-{digest}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [cc, "-O2", "-shared", "-fPIC", "-std=c11", "-o", str(tmp_out), str(source), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.SubprocessError as e:  # it timed out
            raise RuntimeError(f"building {source.name} failed: {e}") from None
        if proc.returncode != 0:
            raise RuntimeError(f"building {source.name} failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp_out, out)
    return out
