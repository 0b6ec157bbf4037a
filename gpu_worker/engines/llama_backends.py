"""Loading llama.cpp's compute backends from the installed package.

edgefn installs llama-cpp-python built with run-time CPU dispatch (`.ci/llama-wheel`):
ggml's CPU backend is one `libggml-cpu-<variant>.so` per x86-64 level in
`llama_cpp/lib`, and ggml loads the best one this CPU supports. ggml looks for them
only in the Python executable's folder and the current directory, so they are loaded
here from the package's own folder first (never from the current directory, where any
file named `libggml-*.so` would be run). A build without dispatch (the CPU backend
linked in) needs nothing loaded.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

from edgefn_core.errors import EngineError

_CPU_VARIANT_PREFIX = "libggml-cpu-"


def lib_dir() -> Path:
    """The folder holding llama-cpp-python's shared libraries. Raises `EngineError`
    when llama-cpp-python is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("invalid_config", 500, "the llamacpp engine needs llama-cpp-python "
                          "(make venv installs it)")
    return Path(spec.submodule_search_locations[0]) / "lib"


def load_backends() -> None:
    """Make llama.cpp's backends available to the next model load; call before
    `llama_backend_init`. Idempotent. Raises `EngineError` when no backend can be
    loaded (a dispatching build whose CPU variants are missing, or none that this
    CPU can run)."""
    ggml = _ggml()
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_reg_count() > 0:
        return
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(str(lib_dir()).encode())
    if ggml.ggml_backend_reg_count() == 0:
        raise EngineError("invalid_config", 500, f"no llama.cpp backend in {lib_dir()} runs on "
                          "this CPU (expected libggml-cpu-<variant>.so files: make venv "
                          "reinstalls llama-cpp-python)")


def loaded_cpu_variant() -> str | None:
    """The CPU variant ggml loaded into this process (e.g. "icelake"), or None when
    none is loaded (not yet, or a build with the CPU backend linked in)."""
    for path in _mapped_files():
        if path.name.startswith(_CPU_VARIANT_PREFIX) and path.suffix == ".so":
            return path.stem[len(_CPU_VARIANT_PREFIX):]
    return None


def _ggml() -> ctypes.CDLL:
    """The libggml that libllama is linked to. A wheel stores `libggml.so`,
    `libggml.so.0`, ... as separate copies, and opening another copy would give a
    second backend registry that llama.cpp never sees."""
    import llama_cpp  # noqa: F401  (loads libllama and, with it, its libggml)

    here = lib_dir().resolve()
    for path in _mapped_files():
        if path.parent == here and path.name.startswith("libggml.so"):
            return ctypes.CDLL(str(path))
    raise EngineError("invalid_config", 500, f"llama-cpp-python did not load libggml from "
                      f"{lib_dir()}")


def _mapped_files() -> list[Path]:
    """The files mapped into this process, in /proc/self/maps order."""
    with open("/proc/self/maps") as maps:
        fields = [line.split(None, 5) for line in maps]
    return [Path(f[5].strip()) for f in fields if len(f) == 6 and f[5].startswith("/")]
