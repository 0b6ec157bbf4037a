"""What a fresh isolate's interpreter imports before its first request: it is paid
again at every recycle (`recycle_after`) and every isolate started, on the host's CPU."""

from __future__ import annotations

import socket
from pathlib import Path

from runtime.executors.python import host, interp, precompiled

HELLO = Path(__file__).resolve().parents[3] / "functions" / "examples" / "python-hello"
# imported only where they are used: an awaitable from a handler (asyncio and its
# executor) or a C codec build, which only the PoP's main interpreter does
NOT_AT_START = ("asyncio", "concurrent.futures", "subprocess", "logging")


def test_a_fresh_isolate_imports_no_asyncio_until_a_handler_awaits(tmp_path: Path) -> None:
    cfg = {"function_dir": str(HELLO), "module": "main", "handler": "handle",
           "sandbox": {"scratch": str(tmp_path)}}
    ours, theirs = socket.socketpair()
    i = interp.create()
    try:
        (tmp_path / f"isolate-{theirs.fileno()}").mkdir()
        interp.share(i, "_edgefn_precompiled", precompiled.compile_modules())
        # the host's own bootstrap, then what an async handler's request does (`_until`)
        code = host.prepare_code(cfg, theirs.fileno()) + (
            f"import sys\nat_start = [m for m in {NOT_AT_START!r} if m in sys.modules]\n"
            "assert not at_start, at_start\n"
            "session = guest.Session(prepared[0], prepared[1], 50, 2000, edgefn)\n"
            "async def answer():\n    return 42\n"
            "assert session._until(answer()) == 42\n"
            "assert 'asyncio' in sys.modules\n"
            "session.dog.stop()\nsession.loop_.close()\nprepared[0].close()\n")
        assert interp.run_error(i, code) is None
    finally:
        interp.destroy(i)
        ours.close()
        theirs.close()


def test_a_fresh_isolate_loads_edgefn_as_its_host_compiled_it(tmp_path: Path) -> None:
    """Every module of edgefn a guest imports to serve (but the packages around the
    loop and `precompiled` itself) comes from the host's compiled code, none from source;
    a module the host did not compile, or found elsewhere first, loads as usual."""
    (tmp_path / "fn").mkdir()
    (tmp_path / "fn" / "main.py").write_text("def handle(request, env):\n    return None\n")
    # a module named like one of edgefn's, found first: that one is imported
    (tmp_path / "other" / "edgefn_core").mkdir(parents=True)
    (tmp_path / "other" / "edgefn_core" / "__init__.py").write_text("")
    (tmp_path / "other" / "edgefn_core" / "hostcall.py").write_text("MINE = True\n")
    cfg = {"function_dir": str(tmp_path / "fn"), "module": "main", "handler": "handle",
           "sandbox": {"scratch": str(tmp_path)}}
    ours, theirs = socket.socketpair()
    (tmp_path / f"isolate-{theirs.fileno()}").mkdir()
    i = interp.create()
    try:
        interp.share(i, "_edgefn_precompiled", precompiled.compile_modules())
        code = host.prepare_code(cfg, theirs.fileno()) + (
            "import runtime.executors.python.guest\n"
            "from edgefn_core import hostcall\n"  # edgefn's: imported before sys.path changed
            "ours = sorted(n for n, m in sys.modules.items() if n.split('.')[0] in "
            "('edgefn', 'edgefn_core', 'runtime') and getattr(m, '__file__', None))\n"
            "source = [n for n in ours if type(sys.modules[n].__loader__).__name__ != "
            "'Loader' and n not in ('runtime', 'runtime.executors', "
            "'runtime.executors.python', 'runtime.executors.python.precompiled')]\n"
            "assert not source, source\n"
            "import importlib, os\n"
            f"sys.path.insert(0, {str(tmp_path / 'other')!r})\n"
            "del sys.modules['edgefn_core.hostcall'], sys.modules['edgefn_core']\n"
            "assert importlib.import_module('edgefn_core.hostcall').MINE\n"
            "prepared[0].close()\n")
        assert interp.run_error(i, code) is None
    finally:
        interp.destroy(i)
        ours.close()
        theirs.close()
