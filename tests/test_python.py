"""Python functions in pre-warmed subinterpreters, end to end over loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.admin.client import AdminError
from tests.support import EXAMPLES, Running, pop_thread, python_function, running


def py_function(root: Path, name: str, source: str, *, limits: str = "", pool: str = "",
                env: str = "") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.py").write_text(source)
    (d / "edgefn.toml").write_text(
        f'name = "{name}"\nruntime = "python"\nentry = "main.py"\nroutes = ["/{name}"]\n'
        f"[limits]\n{limits}\n[pool]\n{pool or 'min = 1\nmax = 2'}\n[env]\n{env}\n")
    return d


def test_examples_hello_json_api_and_stream(pop: Running) -> None:
    for name in ("python-hello", "python-api", "python-stream"):
        assert pop.deploy(EXAMPLES / name)["abi"] == "python"
    status, headers, body = pop.get("/py/hello?name=Ada")
    assert (status, body) == (200, b"Hello, Ada, from a Python isolate!\n")
    assert headers["x-edgefn-function"].startswith("python-hello@")
    status, _, body = pop.request("POST", "/py/api/todos", b'{"title": "ship it"}')
    assert status == 201 and json.loads(body)["title"] == "ship it"
    assert pop.request("POST", "/py/api/todos", b"not json")[0] == 400
    who = json.loads(pop.get("/py/api/whoami")[2])
    assert who["name"] == "python-api" and who["mode"] == "example" and len(who["version"]) == 16
    status, headers, body = pop.get("/py/stream?n=3")
    assert headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    assert body == b"data: tick 0\n\ndata: tick 1\n\ndata: tick 2\n\ndata: [DONE]\n\n"


def test_async_handler_and_async_stream(pop: Running, tmp_path: Path) -> None:
    pop.deploy(py_function(tmp_path, "aio", """
import asyncio
from edgefn import Response

async def handle(request, env):
    await asyncio.sleep(0.01)
    if request.query.get("stream"):
        async def parts():
            for i in range(3):
                await asyncio.sleep(0)
                yield f"{i};"
        return Response(parts())
    return Response.json({"method": request.method, "len": len(request.body)})
"""))
    assert json.loads(pop.request("PUT", "/aio", b"12345")[2]) == {"method": "PUT", "len": 5}
    assert pop.get("/aio?stream=1")[2] == b"0;1;2;"


CODEC_PROBE = """
from edgefn import Response
from edgefn_core import abi, fastcodec, frames

def handle(request, env):
    try:
        open(fastcodec._loaded or "/", "rb").close()
        readable = "readable"
    except OSError:
        readable = "unreadable"
    return Response(f"{abi.NATIVE is not None} {frames._native is not None} {readable} "
                    f"{request.headers.get('x-b')} {request.params}")
"""


@pytest.mark.parametrize("switch", ["", "0"])
def test_a_sandboxed_guest_runs_the_c_codec_its_host_loaded(
        pop: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    """The host loads the C codec before its sandbox and tells its guests the path:
    a guest, which cannot open the library's file, finds it already loaded. The
    PoP's ``EDGEFN_NATIVE_CODEC=0`` reaches the host: Python on both sides."""
    from edgefn_core import abi

    if abi.NATIVE is None:
        pytest.skip("the C codec did not build here")
    if switch:
        monkeypatch.setenv("EDGEFN_NATIVE_CODEC", switch)
    pop.deploy(python_function(tmp_path, "codec", CODEC_PROBE))
    status, _, body = pop.request("GET", "/codec", headers={"x-b": "v1"})
    native = b"False False" if switch else b"True True"
    assert (status, body) == (200, native + b" unreadable v1 {}")


def test_a_head_on_a_long_stream_ends_the_stream_and_frees_its_isolate(
        pop: Running, tmp_path: Path) -> None:
    """A HEAD waited out the whole stream (an SSE endpoint held it to wall_ms) though
    nothing of it is sent; it stops at its first chunk, and the isolate (the only one)
    is told to stop and serves the next request."""
    pop.deploy(py_function(tmp_path, "ticks", """
import time
from edgefn import Response

def handle(request, env):
    if request.query.get("once"):
        return Response("once")
    def ticks():
        for i in range(400):
            time.sleep(0.025)
            yield f"data: {i}\\n\\n"
    return Response(ticks(), headers={"content-type": "text/event-stream"})
""", limits="wall_ms = 20000", pool="min = 1\nmax = 1\nstandby = false"))
    started = time.monotonic()
    status, headers, body = pop.request("HEAD", "/ticks")
    assert (status, body) == (200, b"") and headers["content-type"] == "text/event-stream"
    assert pop.get("/ticks?once=1")[2] == b"once"
    assert time.monotonic() - started < 5  # the stream alone takes 10 s


def test_a_module_that_never_finishes_importing_is_refused_saying_so(
        pop: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.executors.python import hosts

    monkeypatch.setattr(hosts, "READY_TIMEOUT", 1.5)  # 30 s in a PoP
    with pytest.raises(AdminError) as err:
        pop.deploy(py_function(tmp_path, "loops", "while True:\n    pass\n",
                               pool="min = 1\nmax = 1\nstandby = false"))
    assert "importing main.py (its top-level code) did not finish" in str(err.value)


HOSTILE = {
    "spin": ("def handle(request, env):\n    while True:\n        pass\n",
             "cpu_ms = 50", 503, "cpu_limit"),
    "hog": ("def handle(request, env):\n    keep = []\n    while True:\n"
            "        keep.append(bytearray(b'x' * (8 << 20)))\n",
            "cpu_ms = 5000\nwall_ms = 10000\nmemory_mb = 64", 503, "memory_limit"),
    "raises": ("def handle(request, env):\n    raise ValueError('bad input')\n", "", 500, "trap"),
    # an exception that cannot be said: its isolate crashed (a 502, the host replaced)
    "unsayable": ("class E(Exception):\n    def __str__(self):\n        raise RuntimeError\n"
                  "def handle(request, env):\n    raise E()\n", "", 500, "trap"),
    "badjson": ("import json\ndef handle(request, env):\n    return json.loads('{bad')\n", "",
                500, "trap"),
    "nap": ("import time\ndef handle(request, env):\n    time.sleep(60)\n",
            "wall_ms = 300", 504, "wall_limit"),
    "segv": ("import ctypes\ndef handle(request, env):\n    ctypes.string_at(0)\n", "", 502, "crash"),
}


def test_hostile_functions_are_contained_while_others_keep_serving(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(EXAMPLES / "python-hello")
    pop.deploy(EXAMPLES / "echo")
    for name, (src, limits, _, _) in HOSTILE.items():
        pop.deploy(py_function(tmp_path, name, src, limits=limits))
    errors: list[str] = []
    served = [0]
    stop = threading.Event()

    def bystander(path: str, body: bytes | None, expect: bytes) -> None:
        while not stop.is_set():
            status, _, got = pop.request("POST" if body else "GET", path, body)
            if (status, got) != (200, expect):
                errors.append(f"{path}: {status} {got[:200]!r}")
            served[0] += 1

    threads = [threading.Thread(target=bystander, args=args) for args in (
        ("/py/hello", None, b"Hello, world, from a Python isolate!\n"),
        ("/echo", b"ping", b"ping"))]
    for t in threads:
        t.start()
    try:
        for _ in range(2):
            for name, (_, _, status, kind) in HOSTILE.items():
                got, headers, body = pop.get(f"/{name}", timeout=20)
                assert (got, headers["x-edgefn-error"]) == (status, kind), body
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [] and served[0] > 10
    assert b"raised ValueError: bad input (main.py:2 in handle)" in pop.get("/raises")[2]
    # the user's line, not the library's (it said "decoder.py:... in raw_decode")
    assert b"(main.py:3 in handle)" in pop.get("/badjson")[2]


def test_crashed_host_is_replaced_by_a_warm_standby_within_a_second(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(py_function(tmp_path, "fragile", """
import ctypes, os
from edgefn import Response

def handle(request, env):
    if request.query.get("crash"):
        ctypes.string_at(0)
    return Response(str(os.getpid()))
"""))
    pid_before = pop.get("/fragile")[2]
    assert pop.get("/fragile?crash=1")[1]["x-edgefn-error"] == "crash"
    crashed_at = time.monotonic()
    status, _, pid_after = pop.get("/fragile")
    took = time.monotonic() - crashed_at
    assert status == 200 and pid_after != pid_before
    assert took < 1.0, f"replacement took {took:.2f}s"
    # and a new standby is warmed in the background: a second crash is absorbed too
    time.sleep(2)
    assert pop.get("/fragile?crash=1")[0] == 502
    assert pop.get("/fragile")[0] == 200


def test_the_readmes_rejected_import_is_what_deploy_prints(pop: Running,
                                                           tmp_path: Path) -> None:
    """README showed `edgefn: needsext: ...` without saying that needsext is the
    function's name: a reader deploying `pyfn` read "pyfn:" as a different message."""
    text = (Path(__file__).parents[1] / "README.md").read_text()
    block = text[text.index("a deploy that\nimports one is rejected"):].split("```")[1]
    command, printed = block.strip().splitlines()
    name = re.fullmatch(r'\$ edgefn deploy (\S+)/ +# edgefn.toml: name = "\1"; main.py: '
                        r"import msgspec", command)
    assert name is not None, command
    d = py_function(tmp_path, name[1], "import msgspec\n\ndef handle(request, env):\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "deploy", str(d), "--data",
                        str(pop.data)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith(printed.removesuffix("(...)")), r.stderr


def test_unsupported_import_is_rejected_at_deploy_naming_the_module(
        pop: Running, tmp_path: Path) -> None:
    d = py_function(tmp_path, "needsext", "import msgspec\n\ndef handle(request, env):\n    pass\n")
    with pytest.raises(AdminError) as err:
        pop.deploy(d)
    assert err.value.status == 400
    assert "main.py imports `msgspec`, which cannot load in a subinterpreter" in str(err.value)
    (d / "lib").mkdir()
    (d / "lib" / "__init__.py").write_text("")
    (d / "lib" / "util.py").write_text("X = 1\nif X:\n  def f(\n")
    for src, words in (("import nosuchmodule_xyz\n", "No module named 'nosuchmodule_xyz'"),
                       ("def other(request, env):\n    pass\n", "has no function 'handle'"),
                       # handlers no request can call: deployed, then every request failed
                       ("def handle():\n    pass\n", r"main\.handle\(\) cannot be called with "
                        r"\(request, env\): define `def handle\(request, env\):`"),
                       ("def handle(request):\n    pass\n", r"main\.handle\(request\) cannot"),
                       ("handle = 5\n", "main.handle is int, not a function"),
                       ("async def handle(request, env):\n    yield b''\n",
                        "main.handle is a generator function"),
                       # at the author's file and line, on one line (the PoP's own copy,
                       # which the failed deploy deletes, was named over four lines)
                       ("def handle(:\n", r"failed: main\.py:1: SyntaxError: [^\n]*$"),
                       ("X = 1\nY = Z\n", r"failed: main\.py:2: NameError: name 'Z' is not"),
                       ("import lib.util\n", r"failed: lib/util\.py:3: SyntaxError: "),
                       # a message of two lines, on one (the CLI printed a forged line)
                       ("raise RuntimeError('import fail\\nts=2026 method=GET')\n",
                        r"main\.py:1: RuntimeError: import fail\\nts=2026 method=GET$")):
        (d / "main.py").write_text(src)
        with pytest.raises(AdminError, match=words) as err:
            pop.deploy(d)
        assert "versions" not in str(err.value)
    assert pop.get("/needsext")[0] == 404


def test_isolates_recycle_after_n_requests(pop: Running, tmp_path: Path) -> None:
    pop.deploy(py_function(tmp_path, "counter", """
from edgefn import Response
COUNT = 0

def handle(request, env):
    global COUNT
    COUNT += 1
    return Response(str(COUNT))
""", pool="min = 1\nmax = 1\nrecycle_after = 3\nstandby = false"))
    seen = [pop.get("/counter")[2] for _ in range(7)]
    assert seen == [b"1", b"2", b"3", b"1", b"2", b"3", b"1"]


def test_redeploy_drains_old_isolates_and_stops_their_hosts(pop: Running, tmp_path: Path) -> None:
    src = """
import os, time
from edgefn import Response

def handle(request, env):
    if request.query.get("slow"):
        time.sleep(0.5)
    return Response(f"{env.vars['V']} {os.getpid()}")
"""
    d = py_function(tmp_path, "gen", src, env='V = "1"', limits="wall_ms = 5000")
    v1 = pop.deploy(d)["version"]
    old_pid = int(pop.get("/gen")[2].split()[1])
    result: dict[str, tuple[int, dict[str, str], bytes]] = {}
    t = threading.Thread(target=lambda: result.setdefault("r", pop.get("/gen?slow=1")))
    t.start()
    time.sleep(0.15)
    py_function(tmp_path, "gen", src, env='V = "2"', limits="wall_ms = 5000")
    pop.deploy(d)
    assert pop.get("/gen")[2].startswith(b"2 ")
    t.join(10)
    status, headers, body = result["r"]
    assert (status, body.split()[0], headers["x-edgefn-function"]) == (200, b"1", f"gen@{v1}")
    deadline = time.monotonic() + 5
    while running(old_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(old_pid), "old isolate host still running after drain"


def test_a_request_routed_before_a_switch_finishes_on_its_version(
        pop: Running, tmp_path: Path) -> None:
    """The job was submitted when the caller first awaited (`handle` was a coroutine):
    a switch in between, with nothing in flight yet, stopped the old version's
    hosts, and the request waited on a stopped isolate to its wall limit (a 504 in 5
    of 6 runs of deploys under load)."""
    from runtime.net.message import Request

    d = py_function(tmp_path, "switched", "from edgefn import Response\n\n"
                    "def handle(request, env):\n    return Response('old')\n",
                    limits="wall_ms = 3000")
    pop.deploy(d)
    assert pop.get("/switched")[2] == b"old"
    registry = pop.pop.registry
    assert pop.loop is not None

    async def routed_then_switched() -> tuple[int, bytes]:
        fn = registry.functions["switched"]
        pending = fn.executor.handle(Request(b"GET", b"/switched", b"", [], b"x", "1.1", True,
                                             "127.0.0.1:9"), "/switched", {})
        fn.executor.retire()  # what a switch does to the version it leaves
        response = await asyncio.wait_for(pending, 2)
        assert isinstance(response.body, bytes)
        return response.status, response.body

    assert asyncio.run_coroutine_threadsafe(routed_then_switched(), pop.loop).result(10) == (
        200, b"old")


def test_python_functions_survive_a_pop_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pop_thread(data) as first:
        first.deploy(EXAMPLES / "python-hello")
    with pop_thread(data) as second:
        assert second.get("/py/hello")[0] == 200


ISOLATED = """
from edgefn import Response
import time
LAST = None

def handle(request, env):
    global LAST
    LAST = request.query["token"]
    time.sleep(0.002)
    return Response(f"{env.vars['WHO']}:{LAST}")
"""


@pytest.fixture(scope="module")
def shared_pop(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("iso")
    with pop_thread(root / "data") as running:
        for who in ("a", "b", "c"):
            running.deploy(py_function(root, f"iso-{who}", ISOLATED, env=f'WHO = "{who}"',
                                       pool="min = 2\nmax = 3\nstandby = false"))
        yield running


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 10**9)),
                      min_size=2, max_size=12))
def test_concurrent_requests_never_see_each_others_state(shared_pop: Running,
                                                         calls: list[tuple[str, int]]) -> None:
    results: dict[int, bytes] = {}

    def call(i: int, who: str, token: int) -> None:
        results[i] = shared_pop.get(f"/iso-{who}?token={token}")[2]

    threads = [threading.Thread(target=call, args=(i, who, tok))
               for i, (who, tok) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(calls))] == [f"{w}:{t}".encode() for w, t in calls]


def test_recycling_under_concurrent_load_never_mixes_up_responses(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(py_function(tmp_path, "tokens", """
from edgefn import Response

def handle(request, env):
    return Response(request.query["t"])
""", pool="min = 2\nmax = 2\nrecycle_after = 5\nstandby = false"))
    bad: list[str] = []

    def client(c: int) -> None:
        for i in range(25):
            token = f"{c}-{i}"
            status, _, body = pop.get(f"/tokens?t={token}")
            if (status, body) != (200, token.encode()):
                bad.append(f"{token}: {status} {body[:100]!r}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


WALL_MS = 25_000  # a client waits longer: a request is answered, with a 504 at worst
FRESH = """
import os
from edgefn import Response
SERVED = []

def handle(request, env):
    SERVED.append(request.query["t"])
    return Response(f"{request.query['t']} {len(SERVED)} {os.getpid()}")
"""


@pytest.mark.slow
@pytest.mark.parametrize(("standby", "per_client"), [(False, 40), (True, 20)])
def test_recycling_every_request_outlasts_the_hosts_memory_cap(
        pop: Running, tmp_path: Path, standby: bool, per_client: int) -> None:
    """Each recycled interpreter leaves ~8 MiB behind in its host (CPython 3.13 keeps
    its allocator's arenas), so a few hundred recycles are several times what fits
    under one host's RLIMIT_AS (~30 here): the host must ask to be replaced in time,
    and the swap must not fail or mix up a single request, whether a warm standby
    takes over at once or a new host has to start while the old one serves.
    The wall limit (which covers a request's wait) is 25 s, not 5: 6 clients queue
    on 2 isolates that each start an interpreter per request, ~1-2 s apiece on 2
    cores loaded 4x over, and 5 s made 504s of the queue (~70 of 240) there."""
    pop.deploy(py_function(tmp_path, "fresh", FRESH, limits=f"wall_ms = {WALL_MS}",
                           pool="min = 2\nmax = 2\nrecycle_after = 1\n"
                           f"standby = {str(standby).lower()}"))
    bad: list[str] = []
    hosts: set[bytes] = set()

    def client(c: int) -> None:
        for i in range(per_client):
            token = f"{c}-{i}"
            status, _, body = pop.get(f"/fresh?t={token}", timeout=WALL_MS / 1000 + 5)
            # "<token> 1 <pid>": its own answer, from a fresh interpreter
            if status == 200 and body.startswith(f"{token} 1 ".encode()):
                hosts.add(body.split()[2])
            else:
                bad.append(f"{token}: {status} {body[:100]!r}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
    assert len(hosts) > 1, "all recycles fit in one host: does CPython free them now?"


def test_a_stream_failing_midway_or_bad_head_never_leaks_into_the_next_request(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pop.deploy(py_function(tmp_path, "flaky", """
from edgefn import Response

def handle(request, env):
    mode = request.query.get("mode")
    if mode == "break":
        def parts():
            yield "first;"
            raise ValueError("stream broke")
        return Response(parts())
    if mode == "badhead":
        return Response(iter(["x"]), headers={"bad name": "x"})
    if mode == "status":
        return Response("x", status=int(request.query["s"]))
    if mode == "strstatus":
        return Response("x", status="200")
    if mode == "intbody":
        return Response(123)
    if mode == "dictbody":
        return Response({"a": 1})
    if mode == "dict":
        return {"a": 1}
    if mode == "view":
        return Response(memoryview(b"abc"))
    if mode == "intheader":
        return Response("x", headers={"x-n": 5})
    if mode == "reflect":
        return Response("x", headers={"x-name": request.headers.get("x-name")})
    if mode == "exit":
        import sys
        sys.exit(3)
    if mode == "intchunk":
        def parts():
            yield b"a"
            yield 42
        return Response(parts())
    return Response("ok:" + request.query.get("n", ""))
""", pool="min = 1\nmax = 1\nstandby = false"))
    import http.client

    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
    conn.request("GET", "/flaky?mode=break")
    resp = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead):
        resp.read()  # the stream is cut, not ended cleanly
    conn.close()
    # the function's traceback is logged as its own; the front adds no traceback of its
    # own for it (every failed stream logged a PoP-internal ERROR too)
    assert not [r for r in caplog.records if r.name == "edgefn.http" and r.levelno >= 40]
    status, headers, _ = pop.get("/flaky?mode=badhead")
    assert (status, headers["x-edgefn-error"]) == (502, "bad_response")
    # a status or body no HTTP response can carry: a 502 before anything is sent
    for query, words in (("mode=status&s=100", b"invalid HTTP status 100"),
                         ("mode=status&s=101", b"invalid HTTP status 101"),
                         ("mode=status&s=-1", b"invalid HTTP status -1"),
                         ("mode=strstatus", b"invalid HTTP status '200'"),
                         ("mode=intbody", b"response body is int"),
                         # a dict streamed its keys after a 200 (Response.json is for JSON)
                         ("mode=dictbody", b"response body is dict"),
                         # (a handler's value that is no Response: it was a 500 `trap`)
                         ("mode=dict", b"handler returned dict, expected edgefn.Response "
                                       b"(Response.json(...) for JSON)"),
                         ("mode=intheader", b"response header 'x-n': name and value must be "
                                            b"str, got str and int")):
        status, headers, body = pop.get(f"/flaky?{query}")
        assert (status, headers["x-edgefn-error"]) == (502, "bad_response"), query
        assert words in body, (query, body)
    # a request header's value comes back as it came, non-ASCII too (it was decoded as
    # UTF-8 and encoded as Latin-1: mangled, or a trap for a character past U+00FF)
    for value in ("Jos\u00e9", "Zo\u00eb \u2713"):
        conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
        conn.putrequest("GET", "/flaky?mode=reflect")
        conn.putheader("x-name", value.encode())
        conn.endheaders()
        resp = conn.getresponse()
        resp.read()
        raw = [v for k, v in resp.msg.raw_items() if k.lower() == "x-name"]
        conn.close()
        assert resp.status == 200 and [r.encode("latin-1") for r in raw] == [value.encode()]
    # sys.exit() is the handler's exception, named, not its isolate ending (502 crash)
    status, headers, body = pop.get("/flaky?mode=exit")
    assert (status, headers["x-edgefn-error"]) == (500, "trap") and b"raised SystemExit: 3" in body
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
    conn.request("GET", "/flaky?mode=intchunk")  # not 42 NUL bytes: the stream is cut
    resp = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()
    assert pop.get("/flaky?mode=view")[::2] == (200, b"abc")  # bytes, not a stream of ints
    for i in range(5):
        assert pop.get(f"/flaky?n={i}")[2] == f"ok:{i}".encode()


def test_max_response_mb_caps_plain_and_streamed_bodies(pop: Running, tmp_path: Path) -> None:
    pop.deploy(py_function(tmp_path, "big", """
from edgefn import Response

def handle(request, env):
    n = int(request.query["n"])
    if request.query.get("stream"):
        def parts():
            left = n
            while left > 0:
                yield b"x" * min(left, 65536)
                left -= 65536
        return Response(parts())
    return Response(b"x" * n)
""", limits="max_response_mb = 1", pool="min = 1\nmax = 1\nstandby = false"))
    mib = 1 << 20
    for n in (3 * mib, mib + 1):
        status, headers, body = pop.get(f"/big?n={n}")
        assert (status, headers["x-edgefn-error"]) == (502, "bad_response"), body[:200]
        assert b"exceeds the limit of 1048576 bytes (limits.max_response_mb = 1)" in body
    for n in (mib * 9 // 10, mib):
        status, _, body = pop.get(f"/big?n={n}")
        assert (status, len(body)) == (200, n)
    import http.client

    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
    conn.request("GET", f"/big?stream=1&n={3 * mib}")
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead) as cut:
        resp.read()  # the stream is cut at the limit, not ended cleanly
    assert len(cut.value.partial) <= mib
    conn.close()
    for n in (mib * 9 // 10, mib):
        status, _, body = pop.get(f"/big?stream=1&n={n}")
        assert (status, len(body)) == (200, n)


def test_an_uncaught_denied_binding_call_answers_binding_not_trap(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(py_function(tmp_path, "nosy", """
import edgefn
from edgefn import Response

def handle(request, env):
    if request.query.get("catch"):
        try:
            env.kv("secret").get("k")
        except edgefn.BindingError as e:
            assert isinstance(e, RuntimeError)  # code written for RuntimeError still works
            return Response(f"denied: {e}", status=403)
    env.kv("secret").get("k")
"""))
    status, headers, body = pop.get("/nosy")
    assert (status, headers["x-edgefn-error"]) == (500, "binding"), body
    assert b"did not declare KV namespace 'secret'" in body
    assert b"failed in a binding call at main.py:12 in handle: function 'nosy' did not" in body
    status, _, body = pop.get("/nosy?catch=1")
    assert status == 403 and body.startswith(b"denied: ") and b"'secret'" in body


LAZY_EXT = """
from edgefn import Response

def handle(request, env):
    which = request.query.get("m")
    if which == "numpy":
        import numpy
    elif which == "lmdb":
        from lmdb import Environment
    elif which == "helper":
        import helper
    else:
        import msgspec.json
    return Response("unreachable")
"""


def test_a_c_extension_imported_in_a_handler_fails_clearly_and_is_warned_at_deploy(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = py_function(tmp_path, "lazyext", LAZY_EXT)
    (d / "helper.py").write_text("def f():\n    import uvloop\n")
    with caplog.at_level(logging.WARNING, logger="edgefn.functions"):
        version = pop.deploy(d)["version"]
    warned = [r.getMessage() for r in caplog.records if r.name == "edgefn.functions"]
    for name, where in (("numpy", "main.py:7"), ("lmdb", "main.py:9"), ("msgspec", "main.py:13"),
                        ("uvloop", "helper.py:2")):
        assert any(m.startswith(f"lazyext@{version}: ") and f"`{name}`" in m and where in m
                   for m in warned), (name, warned)
    assert not any("`helper`" in m for m in warned)  # the function's own module is fine
    for query, name, line in (("numpy", "numpy", 7), ("lmdb", "lmdb", 9), ("", "msgspec", 13)):
        status, headers, body = pop.get(f"/lazyext?m={query}")
        assert (status, headers["x-edgefn-error"]) == (500, "trap"), body
        assert json.loads(body)["error"]["message"] == (
            f"function 'lazyext' cannot import module '{name}' inside an isolate: C extensions "
            "that do not support isolated subinterpreters are unavailable "
            f"(main.py:{line} in handle; README: Python functions)")
    assert pop.get("/lazyext?m=nothing")[0] == 500  # the isolate still serves


def test_function_logs_and_tracebacks_go_to_the_functions_logger(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = py_function(tmp_path, "chatty", """
from edgefn import Response

def handle(request, env):
    env.log("hello", 42)
    if request.query.get("fail"):
        raise KeyError("nope")
    return Response("ok")
""")
    with caplog.at_level(logging.INFO, logger="edgefn.functions"):
        version = pop.deploy(d)["version"]
        assert pop.get("/chatty")[0] == 200
        assert pop.get("/chatty?fail=1")[0] == 500
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "edgefn.functions"]
    assert lines.count((logging.INFO, f"chatty@{version}: hello 42")) == 2
    (tb,) = [(level, m) for level, m in lines if "Traceback" in m]
    assert tb[0] >= logging.WARNING and tb[1].startswith(f"chatty@{version}: Traceback")
    assert "main.py\", line 7, in handle" in tb[1] and tb[1].endswith("KeyError: 'nope'")


def test_a_functions_log_lines_and_error_texts_cannot_forge_lines_or_flood(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`env.log` wrote its text raw (a newline started a line that read like the
    access log's; 200k calls wrote 54 MB in a second), and so did an exception's
    message in the traceback and in the PoP's `trap` warning."""
    forged = "ts=2026-12-02T02:00:00.000Z method=GET path=/admin status=200"
    d = py_function(tmp_path, "forger", f"""
from edgefn import Response

def handle(request, env):
    if request.query.get("flood"):
        for i in range(1000):
            env.log("line", i)
        return Response("ok")
    env.log("innocent\\n{forged}\\x1b[2J")
    raise ValueError("boom\\n{forged}")
""")
    with caplog.at_level(logging.INFO):
        version = pop.deploy(d)["version"]
        label = f"forger@{version}"
        assert pop.get("/forger")[0] == 500
        started = time.monotonic()
        assert pop.get("/forger?flood=1")[0] == 200
        took = time.monotonic() - started
    messages = [r.getMessage() for r in caplog.records
                if r.name in ("edgefn.functions", "edgefn.pop")]
    lines = [line for m in messages for line in m.split("\n")]
    assert not any(line.startswith("ts=") for line in lines), lines
    assert not any("\x1b" in m or "\r" in m for m in messages)
    assert f"{label}: innocent\\n{forged}\\x1b[2J" in messages
    (tb,) = [m for m in messages if "Traceback" in m]
    assert all(line.startswith(f"{label}") for line in tb.split("\n")), tb
    assert f"{label}: trap: raised ValueError: boom\\n{forged}" in " ".join(messages)
    logged = sum(m.startswith(f"{label}: line ") for m in messages)
    # the host output's burst (200, one taken by the first request's line) and rate
    assert 199 <= logged <= 200 + 20 * took


def test_env_values_are_not_on_a_hosts_command_line_and_stdin_is_empty(
        pop: Running, tmp_path: Path) -> None:
    """`[env]` (where API keys go) reached every isolate host's argv, readable by any
    local user in /proc/PID/cmdline; and a handler's `input()` waited on the PoP's
    command pipe until the wall-time limit, then the host was killed."""
    from tests.support import host_pids

    pop.deploy(py_function(tmp_path, "stdin", """
import os
from edgefn import Response

def handle(request, env):
    try:
        line = input()
    except EOFError:
        line = "<eof>"
    return Response(line + " " + os.environ["API_KEY"][:3])
""", env='API_KEY = "sk-very-secret-value"', pool="min = 1\nmax = 1\nstandby = false"))
    started = time.monotonic()
    status, _, body = pop.get("/stdin")
    assert (status, body) == (200, b"<eof> sk-")
    assert time.monotonic() - started < 2  # at once, not at the 5 s wall limit
    pids = host_pids("stdin")
    assert pids  # found by the name it carries on its command line
    for pid in pids:
        assert b"sk-very-secret-value" not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_a_response_over_64_mib_goes_up_to_max_response_mb(pop: Running, tmp_path: Path) -> None:
    """`max_response_mb` goes to 256, but a body over the isolate wire's 64 MiB frame
    failed as an internal error (500 trap, 'frame ... exceeds')."""
    import msgspec

    from runtime.executors.python import wire
    from runtime.functions.manifest import Limits

    info = msgspec.inspect.type_info(Limits)  # the manifest's ceiling is the wire's
    assert isinstance(info, msgspec.inspect.StructType)
    field = next(f.type for f in info.fields if f.name == "max_response_mb")
    assert isinstance(field, msgspec.inspect.IntType)
    ceiling = field.le
    assert ceiling is not None and ceiling << 20 == wire.MAX_BODY
    src = """
from edgefn import Response

def handle(request, env):
    return Response(b"z" * int(request.query["n"]))
"""
    pop.deploy(py_function(tmp_path, "huge", src,
                           limits="max_response_mb = 80\nmemory_mb = 512\ncpu_ms = 5000",
                           pool="min = 1\nmax = 1\nstandby = false"))
    pop.deploy(py_function(tmp_path, "capped", src, limits="memory_mb = 512\ncpu_ms = 5000",
                           pool="min = 1\nmax = 1\nstandby = false"))
    n = 70 << 20
    status, headers, body = pop.get(f"/huge?n={n}", timeout=60)
    assert (status, len(body), headers["content-length"]) == (200, n, str(n)), body[:300]
    status, headers, body = pop.get(f"/capped?n={n}", timeout=60)
    assert (status, headers["x-edgefn-error"]) == (502, "bad_response")
    assert b"exceeds the limit of 16777216 bytes (limits.max_response_mb = 16)" in body
    assert pop.get("/huge?n=5")[2] == b"zzzzz"  # the isolate serves on


LEAK = """
from edgefn import Response

kept = []  # module level: lives as long as the interpreter

def handle(request, env):
    if request.query.get("leak"):
        while True:
            kept.append(bytearray(8 << 20))
    return Response(f"{len(bytearray(4 << 20))} {len(kept)}")
"""


def test_an_interpreter_that_ran_out_of_memory_is_recycled(pop: Running, tmp_path: Path) -> None:
    """Its module-level leak stayed: every request after the MemoryError answered
    memory_limit too, until recycle_after requests had passed."""
    pop.deploy(py_function(tmp_path, "leaky", LEAK,
                           limits="cpu_ms = 5000\nwall_ms = 10000\nmemory_mb = 64",
                           pool="min = 1\nmax = 1\nstandby = false"))
    status, headers, _ = pop.get("/leaky?leak=1", timeout=60)
    assert (status, headers["x-edgefn-error"]) == (503, "memory_limit")
    status, _, body = pop.get("/leaky", timeout=60)
    assert (status, body) == (200, b"4194304 0")  # a fresh interpreter: nothing kept


MAPS = """
import mmap
from edgefn import Response

def handle(request, env):
    if request.query.get("big"):
        mmap.mmap(-1, 1 << 30)  # past memory_mb: RLIMIT_AS refuses it (ENOMEM)
    return Response(f"{len(mmap.mmap(-1, 1 << 20))}")
"""


def test_a_mapping_past_memory_mb_is_the_memory_limit(pop: Running, tmp_path: Path) -> None:
    """mmap raises OSError(ENOMEM), not MemoryError: it was a 500 `exception` naming
    an OSError, as if the function had a bug."""
    pop.deploy(py_function(tmp_path, "maps", MAPS, limits="memory_mb = 64"))
    status, headers, body = pop.get("/maps?big=1", timeout=60)
    assert (status, headers["x-edgefn-error"]) == (503, "memory_limit"), body
    assert b"ran out of memory (OSError ENOMEM)" in body
    assert pop.get("/maps", timeout=60)[::2] == (200, b"1048576")


AWAITS = """
import asyncio, os
from edgefn import Response

calls = []

async def handle(request, env):
    calls.append(1)
    if request.query.get("nap"):
        await asyncio.sleep(5)
    return Response(f"{os.getpid()} {len(calls)}")
"""


def test_an_await_past_wall_ms_is_stopped_without_killing_the_host(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An await sits in select(), where the watchdog's interrupt cannot land: the
    request got its 504, then the host was killed as "stuck in native code" (its
    isolates' state lost, a respawn paid, and innocent requests failed with it)."""
    pop.deploy(py_function(tmp_path, "awaits", AWAITS, limits="wall_ms = 300",
                           pool="min = 1\nmax = 1\nstandby = false"))
    pid = pop.get("/awaits")[2].split()[0]
    with caplog.at_level("WARNING"):
        status, headers, _ = pop.get("/awaits?nap=1", timeout=30)
        assert (status, headers["x-edgefn-error"]) == (504, "wall_limit")
        time.sleep(1.5)  # past the grace after which a stuck host is killed
        status, _, body = pop.get("/awaits")
    assert status == 200 and body == pid + b" 3"  # the same host, its state kept
    assert "stuck in native code" not in caplog.text


THREADED_CALLS = """
import asyncio
import threading
from edgefn import Response

def handle(request, env):
    kv = env.kv("ns")
    if request.query.get("m") == "threads":
        got = []
        def read(key):
            for _ in range(20):
                got.append(kv.get(key))
        threads = [threading.Thread(target=read, args=(k,)) for k in ("a", "b", "a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        alive = [t.is_alive() for t in threads]
        return Response(f"{sorted(set(got))} {len(got)} {alive}")
    if request.query.get("m") == "gather":
        async def both():
            return await asyncio.gather(*(asyncio.to_thread(kv.get, k) for k in "abab"))
        return Response(repr(asyncio.run(both())))
    return Response(repr(kv.get("a")))
"""


def test_binding_calls_from_the_handlers_threads_take_turns(pop: Running,
                                                            tmp_path: Path) -> None:
    """Two threads calling at once read each other's replies: one dropped the other's
    as stale and waited forever, and the next request of the isolate hung to a 504."""
    d = python_function(tmp_path, "threaded", THREADED_CALLS, limits="wall_ms = 10000",
                        extra='[bindings]\nkv = ["ns"]')
    pop.deploy(d)
    for key, value in (("a", "MQ=="), ("b", "Mg==")):  # "1", "2"
        pop.admin.request("POST", "/v1/kv/ns/put",
                          json.dumps({"key": key, "value": value}).encode())
    status, _, body = pop.get("/threaded?m=threads", timeout=30)
    assert (status, body) == (200, b"[b'1', b'2'] 80 [False, False, False, False]"), body
    status, _, body = pop.get("/threaded?m=gather", timeout=30)
    assert (status, body) == (200, b"[b'1', b'2', b'1', b'2']"), body
    assert pop.get("/threaded")[::2] == (200, b"b'1'")  # the isolate serves on


RAISES_BASE = """
import asyncio
from edgefn import Response

class Odd(BaseException):
    pass

async def cancelled():
    t = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    t.cancel()
    await t

def handle(request, env):
    if request.query.get("m") == "cancelled":
        return cancelled()
    if request.query.get("m") == "base":
        raise Odd("odd")
    return Response("ok")
"""


def test_a_handler_raising_a_base_exception_is_a_trap_not_a_crash(pop: Running,
                                                                   tmp_path: Path) -> None:
    """asyncio.CancelledError (a task the handler cancelled and awaited) or any
    BaseException ended the isolate: 502 crash, no traceback, file or line, and the
    host replaced."""
    pop.deploy(python_function(tmp_path, "based", RAISES_BASE))
    for mode, words in (("cancelled", b"raised asyncio.exceptions.CancelledError"),
                        ("base", b"raised main.Odd: odd")):
        status, headers, body = pop.get(f"/based?m={mode}")
        assert (status, headers["x-edgefn-error"]) == (500, "trap"), body
        assert words in body and b"main.py" in body, body
    assert pop.get("/based")[::2] == (200, b"ok")


@pytest.mark.parametrize(("source", "words"), [
    ("import os\nos._exit(0)\n", "the isolate host exited while starting (status 0): does "
                                 "main.py's top-level code end the process (os._exit, "
                                 "os.close)? Its output is in the PoP's log, tagged "),
    # its socket closed, the host still running: the wait for its exit escaped as a 500
    ("import os, time\nos.closerange(3, 1 << 16)\ntime.sleep(30)\n",
     "the isolate host closed its isolate's socket while starting and did not exit"),
])
def test_a_host_ended_by_its_function_at_import_is_refused_saying_so(
        pop: Running, tmp_path: Path, source: str, words: str) -> None:
    d = python_function(tmp_path, "ender", source + "\ndef handle(request, env):\n    pass\n")
    with pytest.raises(AdminError) as err:
        pop.deploy(d)
    assert err.value.status == 400 and words in str(err.value), str(err.value)
