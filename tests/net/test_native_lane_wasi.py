"""The native lane's front for WASI commands (lane.c `python_call`, `respond`;
runtime/pipeline/lane.py `_submit`, `_command`, `answer`, `_finish`) against the
Python front: two real PoPs on loopback, the lane on and off, the same commands
deployed on both (real wasmtime), the same raw bytes sent to both. Answers (but the
date and the request id's per-process prefix), events, access-log lines and the
scrape's counts must be the same; the lane must start the call for the requests it
may. `/env` answers with every CGI variable the command got, so what the lane's
request (decoded from its frame) gives a command is compared too."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.executors.wasm.function import WasmFunction
from runtime.net.message import Request, Response
from tests.net.test_native_lane import Side, both, request
from tests.net.test_native_lane_python import exchange_rest
from tests.support import function_dir, wait_for

ROOT = Path(__file__).resolve().parents[2]
PORTS = {"auto": 28020, "off": 28021}
WASI = '(import "wasi_snapshot_preview1" "{0}" (func ${0} {1}))'
IMPORTS = "".join(WASI.format(name, sig) for name, sig in {
    "fd_write": "(param i32 i32 i32 i32) (result i32)",
    "environ_sizes_get": "(param i32 i32) (result i32)",
    "environ_get": "(param i32 i32) (result i32)",
    "proc_exit": "(param i32)"}.items())


def command(start: str, data: str = "") -> str:
    """A WASI command whose `_start` is `start` ($out writes N bytes at P to stdout;
    one that calls $sleep imports `poll_oneoff`, which is Python's: never run by C)."""
    sleeps = "$sleep" in start
    imports = IMPORTS + (WASI.format("poll_oneoff", "(param i32 i32 i32 i32) (result i32)")
                         if sleeps else "")
    return f"""(module {imports} (memory (export "memory") 2) {data}
  (func $out (param $p i32) (param $n i32)
    (i32.store (i32.const 16) (local.get $p)) (i32.store (i32.const 20) (local.get $n))
    (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24))))
  {SLEEP if sleeps else ""}
  (func (export "_start") (local $i i32) (local $n i32) {start}))"""


SLEEP = """(func $sleep (param $ns i64)
    (i32.store8 (i32.const 1032) (i32.const 0)) (i32.store (i32.const 1040) (i32.const 1))
    (i64.store (i32.const 1048) (local.get $ns))
    (drop (call $poll_oneoff (i32.const 1024) (i32.const 2048) (i32.const 1) (i32.const 2100))))"""


def writing(out: bytes, before: str = "", after: str = "") -> str:
    """A command that runs `before`, writes `out` to stdout, then runs `after`."""
    data = "".join(f"\\{b:02x}" for b in out)
    return command(f"{before} (call $out (i32.const 64) (i32.const {len(out)})) {after}",
                   f'(data (i32.const 64) "{data}")')


# every variable, one a line ("NAME=value\n"), after a header block
ENV = command("""
    (drop (call $environ_sizes_get (i32.const 0) (i32.const 4)))
    (drop (call $environ_get (i32.const 4096) (i32.const 16384)))
    (local.set $n (i32.load (i32.const 4)))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (if (i32.eqz (i32.load8_u (i32.add (i32.const 16384) (local.get $i))))
        (then (i32.store8 (i32.add (i32.const 16384) (local.get $i)) (i32.const 10))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (call $out (i32.const 64) (i32.const 8))
    (call $out (i32.const 16384) (local.get $n))""", '(data (i32.const 64) "X-A: b\\n\\n")')
ODD = writing(b"Status: 418 teapot\nX-Edgefn-Function: other@1\nCache-Tag: t1\n"
              b"x-request-id: mine\nX-Custom: A b\nContent-Length: 999\n\nshort\n")
TRAP = command("unreachable")
BAD = writing(b"no blank\n")
EXIT = writing(b"X-A: b\n\n", after="(call $proc_exit (i32.const 3))")
EXIT0 = writing(b"X-A: b\n\nbye\n", after="(call $proc_exit (i32.const 0))")  # Go's way
# its first 4 bytes to stderr too: a run that logs is Python's (its lines logged once)
STDERR = writing(b"X-A: b\n\nlogged\n", before="""(i32.store (i32.const 16) (i32.const 64))
  (i32.store (i32.const 20) (i32.const 4))
  (drop (call $fd_write (i32.const 2) (i32.const 16) (i32.const 1) (i32.const 24)))""")
CACHED = writing(b"Cache-Control: max-age=60\n\nkeep\n")
# sleep 50 ms (its first request moves it to the worker threads) or 0.4 s, then answer
SLEEPY = writing(b"X-A: b\n\nslept\n", before="(call $sleep (i64.const 50000000))")
SLOW = writing(b"X-A: b\n\nslept\n", before="(call $sleep (i64.const 400000000))")


def folders(root: Path) -> list[Path]:
    def cmd(name: str, source: str, routes: list[str], limits: str = "", env: str = "") -> Path:
        return function_dir(root, name, source, routes=routes, extra='abi = "wasi"\n' + env,
                            limits=limits or "cpu_ms = 1000\nwall_ms = 2000")
    return [ROOT / "functions" / "examples" / "hello-c",
            cmd("env", ENV, ["/env", "/env2", "/envid/:id/:Part", "/envfiles/*"],
                env='[env]\nMODE = "m"\nEMPTY = ""\n'),
            cmd("odd", ODD, ["/odd"]), cmd("spin", command("(loop $l (br $l))"), ["/spin"],
                                           "cpu_ms = 1000\nwall_ms = 300"),
            cmd("trap", TRAP, ["/trap"]), cmd("bad", BAD, ["/bad"]),
            cmd("exit", EXIT, ["/exit"]), cmd("exit0", EXIT0, ["/exit0"]), cmd("stderr", STDERR, ["/stderr"]), cmd("cached", CACHED, ["/cached"]),
            cmd("sleepy", SLEEPY, ["/sleepy"]),
            cmd("slow", SLOW, ["/slow"], "cpu_ms = 1000\nwall_ms = 2000\nconcurrency = 1")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    from tests.support import pop_thread

    root = tmp_path_factory.mktemp("wasilane")
    with pop_thread(root / "on", port=PORTS["auto"], **{"http.native_lane": "auto"}) as on, \
            pop_thread(root / "off", port=PORTS["off"], **{"http.native_lane": "off"}) as off:
        for folder in folders(root / "fns"):
            on.deploy(folder)
            off.deploy(folder)
        a, b = Side(on), Side(off)
        assert a.lane is not None and b.lane is None
        yield a, b


H = [("Host", "x")]
# name: (request, who answers it: "c" the lane's C runs the command itself (lane.c
# `command_call`), "call" the C hands it to Python (`_command`), "python" the front)
SERVED = {
    "hello-c": (request("GET", "/hello-c?name=Ada", H), "c"),
    "env": (request("GET", "/env?a=1&b=caf%C3%A9", [*H, ("X-Odd", " v "),
                                                      ("User-Agent", "curl/8.5"),
                                                      ("Accept", "*/*"), ("X-Two", "1"),
                                                      ("x-two", "2")]), "c"),
    "second route": (request("GET", "/env2", [("Host", "x:8080")]), "c"),
    "head": (request("HEAD", "/env", H), "c"),
    "crawler": (request("GET", "/env", [*H, ("User-Agent", "Googlebot/2.1 "
                                                "(+http://www.google.com/bot.html)")]), "c"),
    "content types": (request("GET", "/env", [*H, ("Content-Type", "text/a"),
                                               ("content-type", "text/b")]), "c"),
    # UTF-8 arrives byte for byte (the C's); what `_text` would replace is the call's
    "UTF-8": (request("GET", "/env", [*H, ("X-A", "caf\u00c3\u00a9 \u00f0\u009f\u0098\u0080")]),
              "c"),
    "not UTF-8": (request("GET", "/env", [*H, ("X-A", "caf\u00e9")]), "call"),
    "overlong": (request("GET", "/env", [*H, ("X-A", "\u00c0\u00af")]), "call"),
    "surrogate": (request("GET", "/env", [*H, ("X-A", "\u00ed\u00a0\u0080")]), "call"),
    "status and reserved headers": (request("GET", "/odd", H), "c"),
    "trap": (request("GET", "/trap", H), "call"),
    "bad CGI": (request("GET", "/bad", H), "call"),
    "exit 3": (request("GET", "/exit", H), "call"),
    "exit 0": (request("GET", "/exit0", H), "c"),
    "stderr": (request("GET", "/stderr", H), "call"),
    "cacheable": (request("GET", "/cached", H), "call"),
    "sleeps": (request("GET", "/sleepy", H), "call"),
    "post": (request("POST", "/env", [*H, ("Content-Type", "text/plain")], b"abc"), "c"),
    "post, no body": (request("POST", "/env", H), "c"),
    "post to hello-c": (request("POST", "/hello-c", H, b"hello"), "c"),  # stdin: 5 bytes
    "post, binary": (request("POST", "/hello-c", H, bytes(range(256)) * 4), "c"),
    "post, not UTF-8": (request("POST", "/env", [*H, ("X-A", "caf\u00e9")], b"x"), "call"),
    "close": (request("GET", "/env", [*H, ("Connection", "close")]), "c"),
    "browser": (request("GET", "/env", [*H, ("User-Agent", "Mozilla/5.0 (X11; Linux x86_64) "
                                                "AppleWebKit/537.36 (KHTML, like Gecko) "
                                                "Chrome/120.0.0.0 Safari/537.36")]), "c"),
    "http/1.0": (request("GET", "/env", H, version="HTTP/1.0"), "c"),
    "under its route": (request("GET", "/env/a/b?x=1", H), "c"),  # PATH_INFO=/env/a/b
    "post under its route": (request("POST", "/hello-c/x", H, b"hi"), "c"),
    "http/1.0 kept alive": (request("GET", "/env", [*H, ("Connection", "keep-alive")],
                                    version="HTTP/1.0"), "c"),  # SERVER_PROTOCOL=HTTP/1.0
    "http/1.0 kept alive, a call": (request("GET", "/env", [*H, ("Connection", "keep-alive"),
                                                          ("X-A", "caf\u00e9")],
                                            version="HTTP/1.0"), "call"),
    # a route's captures: EDGEFN_PARAM_ID, EDGEFN_PARAM_PART; a wildcard's EDGEFN_WILDCARD
    "captures": (request("GET", "/envid/7/Ab_c?x=1", H), "c"),
    "captures, deeper": (request("POST", "/envid/7/x/y", H, b"p"), "c"),
    "captures, a call": (request("GET", "/envid/7/x", [*H, ("X-A", "caf\u00e9")]), "call"),
    "wildcard": (request("GET", "/envfiles/a/b.txt", H), "c"),
    "wildcard, empty": (request("GET", "/envfiles", H), "c"),
    "wildcard, slash": (request("GET", "/envfiles/", H), "c"),
    "wildcard, a call": (request("GET", "/envfiles/a", [*H, ("X-A", "caf\u00e9")]), "call"),
}


def counts(side: Side) -> tuple[int, int]:
    """Requests the lane's C answered running the command itself, and those whose
    call it started (`_command`)."""
    lane = side.lane
    assert lane is not None
    return lane.c.commands_run, lane.calls


@pytest.mark.parametrize("name", list(SERVED))
def test_each_kind_alone_and_pipelined(pair: tuple[Side, Side], name: str) -> None:
    """Each kind of request, alone and between two plain ones in one write: the same
    answers (every CGI variable included, for /env), events and log lines on both;
    the lane runs the command, or starts the call, exactly when it may."""
    raw, who = SERVED[name]
    on, _ = pair
    if name == "cacheable" and on.r.pop.registry.functions["cached"].label in \
            on.lane.http_cache.cache.caching:  # type: ignore[union-attr]
        who = "python"  # once the HTTP cache holds its answer, the front's
    if who == "c" and not on.lane.commands:  # type: ignore[union-attr]
        who = "call"  # no native WASI run (EDGEFN_NATIVE_WASI=0): each is a call
    method = raw.split(b" ", 1)[0]
    before = counts(on)
    both(pair, raw, [method])
    after = counts(on)
    assert (after[0] - before[0], after[1] - before[1]) == \
        {"c": (1, 0), "call": (0, 1), "python": (0, 0)}[who], name
    plain = SERVED["hello-c"][0]
    got = both(pair, plain + raw + plain, [b"GET", method, b"GET"])
    assert len(got) == (2 if name in ("close", "http/1.0") else 3)
    assert got[0].endswith(b"Hello, Ada from C! method=GET path=/hello-c\n")


@pytest.mark.parametrize("path, want", [
    ("/envid/7/Ab_c?x=1", [b"EDGEFN_PARAM_ID=7", b"EDGEFN_PARAM_PART=Ab_c"]),
    ("/envfiles/a/b.txt", [b"EDGEFN_WILDCARD=a/b.txt"]),
    ("/envfiles", [b"EDGEFN_WILDCARD="]),
])
def test_a_commands_captures_come_from_the_c_as_variables(pair: tuple[Side, Side], path: str,
                                                          want: list[bytes]) -> None:
    """What a route captured reaches a command the C runs as the Python run gives it:
    EDGEFN_PARAM_<NAME> per capture (the name upper-cased), EDGEFN_WILDCARD for the
    rest a final `*` matched (the bytes compared with the Python PoP's by `both`)."""
    on, _ = pair
    before = counts(on)
    got = both(pair, request("GET", path, H), [b"GET"])[0]
    if on.lane is not None and on.lane.commands:
        assert counts(on)[0] - before[0] == 1
    body = got.split(b"\r\n\r\n", 1)[1]
    assert all(w in body.split(b"\n") for w in want), body


def test_what_a_command_gets_and_answers(pair: tuple[Side, Side]) -> None:
    """The bytes themselves (the same on both, by `both`): the CGI variables of a
    request with a query and odd headers, the 418 with the reserved headers dropped,
    the failures as Python contains them; then the scrape's counts."""
    on, off = pair
    env = both(pair, SERVED["env"][0], [b"GET"])[0]
    body = env.split(b"\r\n\r\n", 1)[1]
    assert body.startswith(b"MODE=m\nEMPTY=\nREQUEST_METHOD=GET\n"), body  # the manifest's first
    for line in (b"REQUEST_METHOD=GET", b"PATH_INFO=/env", b"QUERY_STRING=a=1&b=caf%C3%A9",
                 b"HTTP_X_ODD=v", b"HTTP_X_TWO=1", b"HTTP_X_TWO=2", b"HTTP_HOST=x",
                 b"X_MATCHED_ROUTE=/env", b"REMOTE_ADDR=127.0.0.1", b"CONTENT_LENGTH=0",
                 b"EDGEFN_PRINCIPAL_BOT=automation", b"SERVER_PROTOCOL=HTTP/1.1"):
        assert line in body.split(b"\n"), (line, body)
    odd = both(pair, SERVED["status and reserved headers"][0], [b"GET"])[0]
    assert odd.startswith(b"HTTP/1.1 418 ") and odd.endswith(b"\r\n\r\nshort\n")
    assert b"x-custom: A b\r\n" in odd and b"other@1" not in odd and b"mine" not in odd
    assert b"x-edgefn-function: odd@" in odd
    for name, status in (("trap", b"500"), ("bad CGI", b"502"), ("exit 3", b"500")):
        got = both(pair, SERVED[name][0], [b"GET"])[0]
        assert got.startswith(b"HTTP/1.1 " + status + b" "), (name, got[:200])
    for raw, _ in SERVED.values():
        both(pair, raw, [raw.split(b" ", 1)[0]])
    assert on.metrics() == off.metrics()
    assert on.cache_stats() == off.cache_stats()


def test_a_command_on_the_worker_threads_holds_its_slot(pair: tuple[Side, Side]) -> None:
    """`/slow` (limits.concurrency = 1) sleeps 0.4 s, so it runs on a worker thread: a
    second request meanwhile gets dispatch's 503 on both, the slot comes back once,
    and the next request is the lane's call again."""
    answers = []
    for side in pair:
        slow = request("GET", "/slow", H)
        side.send(slow, [b"GET"])  # the first run moves it to the threads
        with socket.create_connection(("127.0.0.1", side.r.port), timeout=10) as s:
            s.sendall(slow)
            time.sleep(0.15)
            answers += side.send(slow, [b"GET"])
            answers.append(exchange_rest(s))
        fn = side.r.pop.registry.functions["slow"]
        wait_for(lambda: fn.inflight == 0, 5, "the slot given back")  # noqa: B023
        assert isinstance(fn.executor, WasmFunction) and fn.executor.threaded
    assert answers[0].startswith(b"HTTP/1.1 503 ") and b"retry-after" in answers[0].lower()
    assert answers[2].startswith(b"HTTP/1.1 503 ")
    assert answers[1].endswith(b"slept\n") and answers[3].endswith(b"slept\n")
    on, off = pair
    assert on.new_events() == off.new_events()
    before = counts(on)[1]
    assert both(pair, request("GET", "/slow", H), [b"GET"])[0].endswith(b"slept\n")
    assert counts(on)[1] - before == 1


def test_client_gone_during_a_threaded_run(pair: tuple[Side, Side]) -> None:
    """A client that leaves while its command sleeps on a worker thread: a 499 event on
    both, and the concurrency count given back."""
    on, off = pair
    for side in pair:
        side.send(request("GET", "/slow", H), [b"GET"])  # on the threads from now on
        side.new_events()
        with socket.create_connection(("127.0.0.1", side.r.port)) as s:
            s.sendall(request("GET", "/slow", H))
            time.sleep(0.1)
        fn = side.r.pop.registry.functions["slow"]
        wait_for(lambda: fn.inflight == 0, 5, "the slot given back")  # noqa: B023
    events_on, events_off = on.new_events(), off.new_events()
    assert [e["status"] for e in events_on] == [499] and events_on == events_off


def test_a_spinning_command_takes_two_slices_of_the_loop_then_a_thread(
        pair: tuple[Side, Side]) -> None:
    """The lane's run cut at the inline slice counts as the first of the two inline tries
    (`lane_cut`): Python runs it inline once more, then on a worker thread with its
    budget (504 at its 300 ms wall limit), the same answer and event on both."""
    on, _ = pair
    fn = on.r.pop.registry.functions["spin"].executor
    assert isinstance(fn, WasmFunction)
    got = both(pair, request("GET", "/spin", H), [b"GET"])
    assert got[0].startswith(b"HTTP/1.1 504 ") and b"x-edgefn-error: wall_limit" in got[0]
    assert not fn.lane_cut  # taken by the rerun
    for side in pair:
        executor = side.r.pop.registry.functions["spin"].executor
        wait_for(lambda: executor.threaded, 5, "moved to the threads")  # noqa: B023


def test_a_command_whose_env_a_request_may_hide_is_not_run_by_the_c(
        pair: tuple[Side, Side]) -> None:
    """`environ` drops a manifest variable a request sets (`HTTP_X` when it sends X):
    per request, so such a command (a stored version may have one) is the call's."""
    on, _ = pair
    lane = on.lane
    assert lane is not None
    if not lane.commands:
        pytest.skip("no native WASI run: the C runs no command")
    fn = on.r.pop.registry.functions["env"].executor
    assert isinstance(fn, WasmFunction)
    assert lane._cgi(fn, "/env") is not None
    for name in ("HTTP_X", "PATH_INFO", "EDGEFN_PRINCIPAL_BOT", "REMOTE_USER"):
        try:
            fn.env[name] = "v"
            assert lane._cgi(fn, "/env") is None, name
        finally:
            del fn.env[name]
    fn.env["NUL"] = "a\0b"
    try:
        assert lane._cgi(fn, "/env") is None
    finally:
        del fn.env["NUL"]


def test_an_auto_abi_command_never_gets_a_manifest_cgi_variable(tmp_path: Path) -> None:
    """A deploy with ``abi = "wasi"`` is refused an env named like a CGI variable; one
    with the default ``"auto"`` (a command found at load) was not, and an anonymous
    request's REMOTE_USER was the manifest's ``admin``."""
    from runtime.executors.wasm.engine import WasmEngine
    from tests.test_wasm import load

    d = function_dir(tmp_path, "autoenv", ENV, extra='[env]\nREMOTE_USER = "admin"\n'
                     'PATH_INFO = "spoof"\nHTTP_X_FORWARDED_FOR = "1.2.3.4"\nMODE = "m"\n')
    engine = WasmEngine(tmp_path / "cache")
    try:
        fn = load(engine, d)
        assert fn.abi == "wasi" and fn.env == {"MODE": "m"}
        result = fn.handle(Request(b"GET", b"/autoenv", b"", [], b"x", "1.1", True,
                                   "127.0.0.1:5"), "/autoenv", {})
        response = result if isinstance(result, Response) else asyncio.run(
            _awaited(result))
        body = response.body
        assert isinstance(body, bytes)
        assert body.startswith(b"MODE=m\n") and b"\nPATH_INFO=/autoenv\n" in body
        assert b"admin" not in body and b"spoof" not in body and b"1.2.3.4\n" not in body
    finally:
        engine.close()


async def _awaited(pending: Any) -> Any:
    return await pending


def test_a_posts_body_is_the_commands_stdin(pair: tuple[Side, Side]) -> None:
    """hello-c reads its stdin and says how many bytes it got; `/env` says its
    CONTENT_LENGTH and CONTENT_TYPE: the lane's C run gives a command the body the
    Python run gives it."""
    on, _ = pair
    before = counts(on)
    hello = both(pair, request("POST", "/hello-c", H, b"x" * 300), [b"POST"])[0]
    env = both(pair, request("POST", "/env", [*H, ("Content-Type", "a/b")], b"abc"),
               [b"POST"])[0]
    if on.lane.commands:  # type: ignore[union-attr]
        assert counts(on)[0] - before[0] == 2
    assert b"method=POST" in hello and b"body-bytes=300" in hello
    assert b"\nCONTENT_LENGTH=3\n" in env and b"\nCONTENT_TYPE=a/b\n" in env


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=st.lists(st.integers(0x20, 0xff).filter(lambda c: c != 0x7f), min_size=1,
                      max_size=12).map(bytes).filter(lambda b: b[0] != 32 and b[-1] != 32))
def test_header_bytes_reach_a_command_as_the_python_run_gives_them(pair: tuple[Side, Side],
                                                                  value: bytes) -> None:
    """Any visible bytes, ASCII or not, in a header value: the same CGI variables on
    both paths; the C runs the command exactly when they are well-formed UTF-8 (as
    `_text` leaves them), the call otherwise."""
    on, _ = pair
    try:
        value.decode("utf-8")
        who = "c" if on.lane.commands else "call"  # type: ignore[union-attr]
    except UnicodeDecodeError:
        who = "call"
    raw = request("GET", "/env", [*H, ("X-V", value.decode("latin-1"))])
    before = counts(on)
    both(pair, raw, [b"GET"])
    after = counts(on)
    assert (after[0] - before[0], after[1] - before[1]) == \
        {"c": (1, 0), "call": (0, 1)}[who], value
