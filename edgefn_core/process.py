"""Process-wide set-up that must happen before native libraries load."""

from __future__ import annotations

import ctypes


def load_system_libstdcxx() -> None:
    """Load the system libstdc++ with RTLD_GLOBAL.

    usearch's wheel carries its own libstdc++ and exports its symbols
    process-wide; a C++ library loaded after it in the same process
    (onnxruntime) then binds to them and crashes on import. Loading the system
    libstdc++ globally first keeps every later library on it. Call it where a
    process starts, before anything imports usearch. Raises OSError if the
    library is missing.
    """
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
