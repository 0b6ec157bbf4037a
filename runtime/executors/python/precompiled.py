"""edgefn's own modules that every fresh isolate imports, compiled once by its host.

The checkout holds no ``.pyc`` and the host writes none (``PYTHONDONTWRITEBYTECODE``;
a bytecode cache a guest could write to would let one interpreter plant code in the
next), so each fresh interpreter, at every recycle and every isolate started,
compiled the guest loop and the SDK from source again: ~25 of the ~95 ms of CPU it
cost. The host's main interpreter compiles them once, before any function code runs
(`compile_modules`), and hands each new interpreter the marshalled code as bytes
(`interp.share`); there `install` puts a finder first on ``sys.meta_path`` that
loads exactly those modules from it, and only from the file the host compiled (a
module of the same name found elsewhere first, in the function's folder say, is
loaded as it would be without it). Stdlib-only: it runs inside isolates.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import marshal
import sys
from importlib.machinery import ModuleSpec
from types import CodeType
from typing import Any

# what a guest imports of edgefn: the SDK, the ABI under it, the guest loop
MODULES = ("edgefn", "edgefn_core", "edgefn_core.errors", "edgefn_core.fastcodec",
           "edgefn_core.abi", "edgefn_core.frames", "edgefn_core.hostcall",
           "runtime.executors.python.wire", "runtime.executors.python.watchdog",
           "runtime.executors.python.guest")

# (module name, its source file, its code marshalled): what an interpreter is handed
Compiled = tuple[tuple[str, str, bytes], ...]


def compile_modules(names: tuple[str, ...] = MODULES) -> Compiled:
    """Each of `names` compiled from the file this interpreter would import it from,
    as a source loader compiles it; one that is not a source file is left out.
    Raises OSError if a file cannot be read, SyntaxError if it does not compile."""
    out = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            continue
        path = spec.loader.path
        code = compile(spec.loader.get_data(path), path, "exec", dont_inherit=True)
        out.append((name, path, marshal.dumps(code)))
    return tuple(out)


class Loader(importlib.machinery.SourceFileLoader):
    """A source loader whose code is the host's, not compiled again."""

    def __init__(self, name: str, path: str, code: bytes) -> None:
        super().__init__(name, path)
        self.code = code

    def get_code(self, fullname: str) -> CodeType:
        code: CodeType = marshal.loads(self.code)
        return code


class Finder:
    """First on ``sys.meta_path``: the modules the host compiled, where the usual
    search finds them in the file the host compiled."""

    def __init__(self, compiled: Compiled) -> None:
        self.code = {name: (path, code) for name, path, code in compiled}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        entry = self.code.get(name)
        if entry is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.origin != entry[0]:
            return None  # found elsewhere first: imported as usual
        spec.loader = Loader(name, *entry)
        return spec


def install(compiled: Compiled) -> None:
    """Import the modules in `compiled` from it from now on, in this interpreter."""
    if compiled:
        sys.meta_path.insert(0, Finder(compiled))
