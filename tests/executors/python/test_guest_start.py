"""What a fresh isolate's interpreter imports before its first request: it is paid
again at every recycle (`recycle_after`) and every isolate started, on the host's CPU."""

from __future__ import annotations

import socket
from pathlib import Path

from runtime.executors.python import host, interp

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
