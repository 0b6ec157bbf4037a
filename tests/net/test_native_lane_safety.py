"""The native lane's C entry on hostile bytes, and the lane's switches: random, cut
and overlong input fed to lane.c in a child process (a crash fails the test instead
of killing pytest); the lane off without a compiler or by configuration; a deploy
and a rollback under load never mixing versions after the switch; a pipelined flood
answered within the front's write buffer."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import config as c
from runtime.net import lane as native
from runtime.pipeline.lane import NativeLane
from runtime.pop import PoP
from tests.net.lane_support import exchange, static_reactor
from tests.support import function_dir, pop_thread

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("lane_fuzz_child.py")


class Child:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'functions/sdk/python'}"}
        self.proc = subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, cwd=ROOT)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"ready\n"

    def feed(self, data: bytes, budget: int = 1 << 20) -> tuple[int, int, int, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(struct.pack("<II", len(data), budget) + data)
            self.proc.stdin.flush()
            answer = self.proc.stdout.read(16)
        except BrokenPipeError:
            answer = b""
        if len(answer) != 16:
            rc = self.proc.wait(5)
            pytest.fail(f"the lane's child died (exit {rc}) on {data[:200]!r}")
        used, size, count, waiting = struct.unpack("<IIII", answer)
        return used, size, count, waiting

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def child() -> Iterator[Child]:
    ch = Child()
    yield ch
    ch.close()


PYF_AT = 5  # VALID[5]: a Python call; VALID[6] one that raises
VALID = [b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n",
         b"HEAD /mirror?a=b HTTP/1.1\r\nHost: x:1\r\nUser-Agent: curl/8\r\n\r\n",
         b"GET /odd HTTP/1.1\r\nhost: x\r\nX-A: b\r\n\r\n",
         b"GET /nobody HTTP/1.1\r\nHost: x\r\n\r\n",
         b"POST /mirror HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
         b"GET /pyf?a=b HTTP/1.1\r\nHost: x\r\nUser-Agent: curl/8\r\n\r\n",  # a Python call
         b"GET /pyf?raise=1 HTTP/1.1\r\nHost: x\r\n\r\n",  # one that raises: Python's finish
         b"GET /wild/a//b?c HTTP/1.1\r\nHost: x\r\n\r\n",  # a wildcard's, rate-limited
         b"POST /cap/7/x/y HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab",
         b"POST /mirror HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab",  # held
         b"GET /tiny HTTP/1.1\r\nHost: x\r\n\r\n",  # past its limit: the lane's 429
         b"HEAD /tiny?q HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"]
TINY_AT = 10
pieces = st.one_of(st.sampled_from(VALID), st.binary(max_size=64),
                   st.sampled_from([b"\r\n", b"\n", b":", b" ", b"\x00", b"HTTP/1.1", b"Host: ",
                                    b"GET ", b"/hello", b"/pyf", b"%", b"?", b"Transfer-Encoding: chunked",
                                    b"Content-Length: 99999999999999999999\r\n"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(pieces, max_size=12), cut=st.integers(min_value=0, max_value=4096),
       budget=st.sampled_from([0, 1, 100, 1 << 20]))
def test_hostile_bytes_never_crash_and_stay_in_bounds(child: Child, parts: list[bytes],
                                                      cut: int, budget: int) -> None:
    """Random mixes of valid requests, fragments and junk, cut anywhere: the C answers,
    takes at most the input, and only whole requests it answered; a request it waits
    for (`waiting`) never needs more than the body limit (4096 here)."""
    data = b"".join(parts)
    data = data[:cut] if cut < len(data) else data
    used, size, count, waiting = child.feed(data, budget)
    assert used <= len(data)
    assert (used == 0) == (count == 0) == (size == 0)
    assert count <= data[:used].count(b"HTTP/1.1\r\n")
    assert waiting <= 4096 and (waiting == 0 or used < len(data))


def test_refusals_are_answered_in_one_read(child: Child) -> None:
    """Past its limit a function's requests are the lane's 429s: all of a pipelined
    read's, and a last one not kept alive ends it."""
    plain, tiny, last = VALID[0], VALID[TINY_AT], VALID[TINY_AT + 1]
    used, size, count, _ = child.feed(tiny + tiny + plain + tiny + last + plain)
    assert (used, count) == (len(tiny * 3 + plain + last), 5) and size > 0


def test_a_python_call_is_answered_and_stops_the_lane(child: Child) -> None:
    """A request for a Python function, then two more: the lane takes the call's
    request only (what follows waits for its answer) and the answer is whole."""
    plain, call, raises = VALID[0], VALID[PYF_AT], VALID[PYF_AT + 1]
    for one in (call, raises):
        used, size, count, _ = child.feed(one + plain + plain)
        assert (used, count) == (len(one), 1) and size > 0
    used, _, count, _ = child.feed(plain + call + plain)
    assert (used, count) == (len(plain) + len(call), 2)


@pytest.mark.parametrize("data", [
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # past URL_MAX
    b"GET /hello HTTP/1.1\r\n" + b"X-A: b\r\n" * 5000 + b"Host: x\r\n\r\n",  # past MAX_HEADERS
    b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 100000 + b"\r\n\r\n",  # HEAD_MAX
    b"GET /hello HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"u" * 5000 + b"\r\n\r\n",  # UA_MAX
    b"GET /hello HTTP/1.1\r\n" + b"U" * 100000 + b": v\r\nHost: x\r\n\r\n",  # a long name
    b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n" * 20000,  # many, a small budget below
])
def test_overlong_input_is_left_to_python(child: Child, data: bytes) -> None:
    used, size, count, _ = child.feed(data, budget=4096)
    if data.count(b"GET ") > 1:
        assert size > 0 and used < len(data)  # stopped at the budget
    else:
        assert (used, size, count) == (0, 0, 0)


def test_without_a_compiler_the_lane_is_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """No C compiler: the PoP starts without the lane, says so once, and serves."""
    def no_compiler(*args: object, **kw: object) -> Path:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")

    monkeypatch.setattr(native, "build", no_compiler)
    native.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, "edgefn.http"):
            pop = PoP(c.load(None, data=str(tmp_path / "d"), **{"ai.enabled": False}))
        assert pop.lane is None
        assert "the native lane is unavailable (no C compiler" in caplog.text
        pop.close()
    finally:
        native.load.cache_clear()


def test_configuration_and_environment_turn_it_off(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pop = PoP(c.load(None, data=str(tmp_path / "a"), **{"ai.enabled": False}))
    assert isinstance(pop.lane, NativeLane)
    pop.close()
    pop = PoP(c.load(None, data=str(tmp_path / "b"),
                     **{"ai.enabled": False, "http.native_lane": "off"}))
    assert pop.lane is None
    pop.close()
    monkeypatch.setenv("EDGEFN_NATIVE_LANE", "0")
    pop = PoP(c.load(None, data=str(tmp_path / "c"), **{"ai.enabled": False}))
    assert pop.lane is None
    pop.close()


def test_with_no_route_it_answers_nothing_and_raises_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A PoP with nothing the lane may serve (no function yet): `serve` takes no bytes
    and starts no call (serve's three values: it raised ValueError on unpacking two,
    logged with its traceback for every read), over loopback too."""
    pop = PoP(c.load(None, data=str(tmp_path / "a"), **{"ai.enabled": False}))
    try:
        assert isinstance(pop.lane, NativeLane)
        raw = b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"
        assert pop.lane.serve(raw, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20) == (0, b"", None)
    finally:
        pop.close()
    with caplog.at_level(logging.ERROR, "edgefn.http"), \
            pop_thread(tmp_path / "b", port=28810) as running:
        assert running.pop.lane is not None
        got = exchange(running.port, raw, [b"GET"])
    assert got[0].startswith(b"HTTP/1.1 404 ")
    assert "native lane failed" not in caplog.text


def test_deploy_and_rollback_under_load_never_mix_versions(tmp_path: Path) -> None:
    """A client asks /ver back to back on one keep-alive connection while v2 is deployed
    and v1 rolled back: every answer to a request sent after a switch returned is the
    new version's, and the lane serves most of them."""
    v1 = function_dir(tmp_path / "1", "ver", static_reactor(200, [], b"one"))
    v2 = function_dir(tmp_path / "2", "ver", static_reactor(200, [], b"two"))
    with pop_thread(tmp_path / "data", port=28013) as pop:
        first = pop.deploy(v1)
        lane = pop.pop.lane
        assert isinstance(lane, NativeLane)
        seen: list[tuple[float, bytes]] = []
        stop = threading.Event()
        errors: list[str] = []

        def load() -> None:
            with socket.create_connection((pop.host, pop.port), timeout=5) as s:
                buf = b""
                while not stop.is_set():
                    sent = time.monotonic()
                    s.sendall(b"GET /ver HTTP/1.1\r\nHost: x\r\n\r\n")
                    while b"\r\n\r\n" not in buf or len(buf) < buf.index(b"\r\n\r\n") + 7:
                        chunk = s.recv(65536)
                        if not chunk:
                            errors.append("closed")
                            return
                        buf += chunk
                    end = buf.index(b"\r\n\r\n") + 4
                    seen.append((sent, buf[end:end + 3]))
                    buf = buf[end + 3:]

        thread = threading.Thread(target=load)
        thread.start()
        try:
            time.sleep(0.3)
            pop.deploy(v2)
            switched_2 = time.monotonic()
            time.sleep(0.3)
            pop.admin.request("POST", "/v1/functions/ver/rollback",
                              b'{"version": "%s"}' % first["version"].encode())
            switched_1 = time.monotonic()
            time.sleep(0.3)
        finally:
            stop.set()
            thread.join(10)
        assert not errors
        after_2 = [body for sent, body in seen if switched_2 < sent < switched_1 - 0.05]
        after_1 = [body for sent, body in seen if sent > switched_1]
        assert after_2 and set(after_2) == {b"two"}
        assert after_1 and set(after_1) == {b"one"}
        assert lane.served > len(seen) // 2


def test_pipelined_flood_of_large_answers_stays_within_the_write_buffer(tmp_path: Path
                                                                         ) -> None:
    """Thousands of pipelined requests for a 60 KB answer on a connection that reads
    nothing: the lane stops at the front's write buffer and the rest waits in the
    Python front (which stops reading), so the answers produced stay bounded; then
    all of them come, in order."""
    big = function_dir(tmp_path, "big", static_reactor(200, [], b"b" * 60000))
    n = 3000
    with pop_thread(tmp_path / "data", port=28014) as pop:
        pop.deploy(big)
        lane = pop.pop.lane
        assert isinstance(lane, NativeLane)
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((pop.host, pop.port))
        s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * n)
        time.sleep(1.0)
        produced = lane.served
        # unread: the kernel's buffers plus two write buffers and a response, not 180 MB
        assert produced * 60000 < 24 << 20, produced
        s.settimeout(30)
        ids: list[int] = []
        tail = b""
        while len(ids) < n:
            chunk = s.recv(1 << 20)
            assert chunk
            data = tail + chunk
            cut = data.rfind(b"\r\n")
            lines, tail = data[:cut].split(b"\r\n"), data[cut:]
            ids += [int(line.rsplit(b"-", 1)[1], 16) for line in lines
                    if line.startswith(b"x-request-id: ")]
        s.close()
        assert ids == sorted(ids) and len(ids) == n


def test_a_request_cut_between_reads_is_finished_by_python(tmp_path: Path) -> None:
    """A request whose head arrives in two reads: the lane leaves it to the Python
    parser, which answers it as it would have."""
    with pop_thread(tmp_path / "data", port=28015) as pop:
        pop.deploy(ROOT / "functions" / "examples" / "hello-wat")
        with socket.create_connection((pop.host, pop.port), timeout=5) as s:
            s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hel")
            time.sleep(0.2)
            s.sendall(b"lo HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.2)
            data = s.recv(65536)
        assert data.count(b"Hello from edgefn (WASM)!") == 2
        assert exchange(pop.port, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", [b"GET"])


def test_a_key_made_remakes_the_table_and_a_public_function_stays_on_the_lane(
        tmp_path: Path) -> None:
    """auth is idle for a function while no key exists (its plan skips it): the lane
    serves it. Once a key is made the plans change (auth's stamp), and so is the
    lane's table made again; a public function (auth mode ``none``) stays on the
    lane for requests without a credential, and one sending the key is Python's,
    whose auth proves it (it took every function off the lane before)."""
    with pop_thread(tmp_path / "data", port=28016) as pop:
        pop.deploy(ROOT / "functions" / "examples" / "hello-wat")
        lane = pop.pop.lane
        assert isinstance(lane, NativeLane)
        rebuilt = counting(lane)
        hello = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        exchange(pop.port, hello, [b"GET"])
        assert lane.served == 1
        before = rebuilt[0]
        key = pop.pop.keys.store.create("acme", ("*",))[0]
        pop.admin.request("POST", "/v1/keys/reload")
        [answer] = exchange(pop.port, hello, [b"GET"])
        assert answer.startswith(b"HTTP/1.1 200 ") and lane.served == 2
        assert rebuilt[0] == before + 1
        with_key = hello.replace(b"\r\n\r\n", b"\r\nx-api-key: %s\r\n\r\n" % key.encode())
        [answer] = exchange(pop.port, with_key, [b"GET"])
        assert answer.startswith(b"HTTP/1.1 200 ") and lane.served == 2


def counting(lane: NativeLane) -> list[int]:
    """How many times `lane` made its table again from now on (a list of one count)."""
    made, rebuild = [0], lane._rebuild

    def counted() -> None:
        made[0] += 1
        rebuild()

    lane._rebuild = counted  # type: ignore[method-assign]
    return made


def test_the_stamp_is_checked_once_per_poll_and_again_after_the_drain(tmp_path: Path) -> None:
    """The stages' stamp is read at a loop turn's first read the lane serves; the
    reads after it in the same poll (sent before any answer of it) are served by the
    table it checked, and the first after the drain sees a key made meanwhile (the
    table is made again). Called directly (no loop, so no drain pending) every read
    checks it."""
    import asyncio

    with pop_thread(tmp_path / "data", port=28016) as pop:
        pop.deploy(ROOT / "functions" / "examples" / "hello-wat")
        lane, keys = pop.pop.lane, pop.pop.keys
        assert isinstance(lane, NativeLane)
        hello = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"

        async def one_poll_then_next() -> list[int]:
            lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)  # the table made for the deploy
            await asyncio.sleep(0)
            rebuilt = counting(lane)
            lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)
            made = [rebuilt[0]]
            keys.store.create("acme", ("*",))
            keys.reload()  # the stamp moves, within this poll's reads
            lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)
            made.append(rebuilt[0])
            await asyncio.sleep(0)  # the turn ends: the drain runs
            lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)
            made.append(rebuilt[0])
            await asyncio.sleep(0.05)  # past DRAIN_EVERY: its record drained
            return made

        assert pop.loop is not None
        got = asyncio.run_coroutine_threadsafe(one_poll_then_next(), pop.loop).result(30)
        assert got == [0, 0, 1]
        assert not lane.stamp_checked and not lane.scheduled

    pop2 = PoP(c.load(None, data=str(tmp_path / "d"), **{"ai.enabled": False}))
    try:
        from runtime.functions import deploys

        asyncio.run(pop2.registry.deploy(deploys.pack_dir(ROOT / "functions" / "examples" /
                                                          "hello-wat")))
        lane = pop2.lane
        assert isinstance(lane, NativeLane)
        assert lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)[0] == len(hello)
        rebuilt = counting(lane)
        pop2.keys.store.create("acme", ("*",))
        pop2.keys.reload()
        assert lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)[0] == len(hello)
        assert rebuilt[0] == 1
    finally:
        pop2.close()


def test_a_switch_makes_the_lanes_table_before_the_first_request(tmp_path: Path) -> None:
    """After each switch `PoP.warm` makes the lane's table for the new routes, so the
    first read after a deploy serves from it instead of making it first (0.15-0.25 ms
    that request paid: bench_runtime's first request after a WASM deploy was 1.84x
    the one after a no-op deploy, 1.22x since)."""
    import asyncio
    import shutil

    from runtime.functions import deploys

    hello = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    example = ROOT / "functions" / "examples" / "hello-wat"
    pop = PoP(c.load(None, data=str(tmp_path / "d"), **{"ai.enabled": False}))
    try:
        lane = pop.lane
        assert isinstance(lane, NativeLane)
        rebuilt = counting(lane)
        first = asyncio.run(pop.registry.deploy(deploys.pack_dir(example)))
        assert rebuilt[0] == 1 and lane.router is pop.registry.router
        again = tmp_path / "again"
        shutil.copytree(example, again)
        with open(again / "edgefn.toml", "a") as f:
            f.write('\n[env]\nROUND = "2"\n')
        second = asyncio.run(pop.registry.deploy(deploys.pack_dir(again)))
        assert second.version != first.version and second.changed
        assert rebuilt[0] == 2 and lane.router is pop.registry.router
        used, out, _ = lane.serve(hello, "127.0.0.1:1", b"", b"", 65536)
        assert used == len(hello) and out.startswith(b"HTTP/1.1 200 ")
        assert rebuilt[0] == 2  # served from the table the switch made
    finally:
        pop.close()


def test_a_lane_answer_restarts_the_keep_alive_wait(tmp_path: Path) -> None:
    """The keep-alive wait runs from the last answer the lane wrote, as from
    Python's (`_idle`): a connection that asked 1.5 s after it opened is still open
    1.3 s later with a 2 s `keepalive_timeout` (it was cut at 2 s when the wait ran
    from the connection's start)."""
    with pop_thread(tmp_path / "data", port=28016, **{"http.keepalive_timeout": 2.0}) as pop:
        pop.deploy(ROOT / "functions" / "examples" / "hello-wat")
        lane = pop.pop.lane
        assert isinstance(lane, NativeLane)
        hello = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
        exchange(pop.port, hello, [b"GET"])  # the table made
        served = lane.served
        with socket.create_connection((pop.host, pop.port), timeout=5) as s:
            time.sleep(1.5)
            s.sendall(hello)
            assert b"Hello from edgefn (WASM)!" in s.recv(65536)
            time.sleep(1.3)
            s.sendall(hello)
            assert b"Hello from edgefn (WASM)!" in s.recv(65536)
        pop.delivered()
        assert lane.served == served + 2


def test_a_timed_chain_has_no_lane(tmp_path: Path) -> None:
    """Stage timings time every stage of every request: no target is eligible."""
    pop = PoP(c.load(None, data=str(tmp_path / "d"),
                     **{"ai.enabled": False, "events.stage_timings": True}))
    assert pop.lane is None
    pop.close()


def test_a_call_that_traps_leaves_nothing_behind(tmp_path: Path) -> None:
    """A failed call's trap belongs to the caller: the lane frees it before handing the
    request to Python (30000 traps kept 48 MB when it did not)."""
    import asyncio

    from runtime.functions import deploys
    from tests.net.lane_support import TRAP

    def rss_mb() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / (1 << 20)

    pop = PoP(c.load(None, data=str(tmp_path / "d"), **{"ai.enabled": False}))
    try:
        folder = function_dir(tmp_path, "trap", TRAP)
        asyncio.run(pop.registry.deploy(deploys.pack_dir(folder)))
        lane = pop.lane
        assert isinstance(lane, NativeLane)
        data = b"GET /trap HTTP/1.1\r\nHost: x\r\n\r\n"
        assert lane.serve(data, "127.0.0.1:1", b"", b"", 65536) == (0, b"", None)
        for _ in range(5000):  # the allocator's pools warm
            lane.c.serve(data, b"", b"", 65536, lane.records, "127.0.0.1:1")
        before = rss_mb()
        for _ in range(30000):
            lane.c.serve(data, b"", b"", 65536, lane.records, "127.0.0.1:1")
        assert rss_mb() - before < 16
        assert not lane.records
    finally:
        pop.close()


@pytest.mark.parametrize("extra", [0, 1])
def test_the_header_limit_is_the_fronts(child: Child, extra: int) -> None:
    """The child's max_header_bytes is 2048, counted as the front counts it (each
    field's name and value + 4, the Host included): a request exactly at it is the
    lane's, one byte over is Python's (431)."""
    head = b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Empty:\r\n"
    used_so_far = (4 + 1 + 4) + (7 + 0 + 4)  # host: x, x-empty: (empty)
    name = b"x-fill"
    value = b"v" * (2048 - used_so_far - len(name) - 4 + extra)
    data = head + name + b": " + value + b"\r\n\r\n"
    used, *_ = child.feed(data)
    assert (used > 0) == (extra == 0)


@pytest.mark.parametrize("extra", [0, 1])
def test_the_body_limit_is_the_fronts(child: Child, extra: int) -> None:
    """The child's max_body_bytes is 4096: a POST whose body is exactly that long is
    the lane's, one byte more is Python's (413); so is one past Content-Length's
    framing (chunked); one whose body has not all arrived is waited for."""
    body = b"b" * (4096 + extra)
    data = b"POST /mirror HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)
    used, *_ = child.feed(data)
    assert used == (len(data) if extra == 0 else 0)
    # the body's last byte still to come: the lane waits for it (the front holds the
    # request, `_hold`), but past the limit
    assert child.feed(data[:-1])[::3] == (0, 1 if extra == 0 else 0)
    chunked = (b"POST /mirror HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n0\r\n\r\n")
    assert child.feed(chunked)[0] == 0
