"""Bounded memory in the HTTP front, measured on a real PoP process: clients that
never read a streamed Python response, and a pipelined flood of 1 MiB responses
on unread connections, while a second client keeps getting `/hello`."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from runtime.admin.client import AdminClient
from runtime.net.server import ServerConfig
from tests.net.pop_process import Prober, get, non_reader, pop_process
from tests.support import EXAMPLES, pop_thread, python_function

MIB = 1 << 20
# What the PoP may grow by during the floods below (README "Bounded memory"): per
# connection one transport buffer (64 KiB) plus one response or chunk (1 MiB here),
# and for a stream the job's queue (256 KiB + one 1 MiB frame) and one frame being
# read: under 4 MiB for each of the 4 connections. The rest is allocator slack.
RSS_BOUND = 64 * MIB
FLOOD_SECONDS = 6.0
P99_TARGET = 0.020  # issue 10: other clients' p99 during a hostile one
SWEEP = ServerConfig().sweep_interval

FLOOD = """
from edgefn import Response

CHUNK = b"x" * (1 << 20)

def handle(request, env):
    n = int(request.query.get("n", "0"))  # 0: until the client goes away

    def body():
        i = 0
        while not n or i < n:
            i += 1
            yield CHUNK

    return Response(body())
"""

BIG = """
from edgefn import Response

BODY = b"y" * (1 << 20)

def handle(request, env):
    return Response(BODY)
"""


def test_pop_rss_stays_bounded_under_slow_readers_and_a_pipelined_flood(
        tmp_path: Path) -> None:
    with pop_process(tmp_path) as pop, contextlib.ExitStack() as sockets:
        admin = AdminClient(tmp_path / "data")
        admin.deploy(python_function(tmp_path, "flood", FLOOD,
                                     limits="wall_ms = 60000\nmax_response_mb = 256",
                                     pool="min = 2\nmax = 2\nstandby = false"))
        admin.deploy(python_function(tmp_path, "big", BIG))
        admin.deploy(EXAMPLES / "hello-wat")
        assert get(pop.host, pop.port, "/big")[0] == 200
        assert get(pop.host, pop.port, "/flood?n=1")[2].endswith(b"\r\n0\r\n\r\n")
        hello = get(pop.host, pop.port, "/hello")[2]
        baseline = pop.rss()

        prober = Prober(pop.host, pop.port, "/hello", hello)
        probing = threading.Thread(target=prober.run)
        probing.start()
        for raw in [b"GET /flood HTTP/1.1\r\nhost: t\r\n\r\n"] * 2 + [
                b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n" * 1000] * 2:
            sockets.enter_context(non_reader(pop.host, pop.port, raw))
        peak, end = baseline, time.monotonic() + FLOOD_SECONDS
        while time.monotonic() < end:
            peak = max(peak, pop.rss())
            time.sleep(0.05)
        prober.stop.set()
        probing.join(10)
        print(f"PoP RSS baseline {baseline / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB "
              f"(+{(peak - baseline) / MIB:.1f} MiB); /hello p99 {prober.p99() * 1000:.1f} ms "
              f"over {len(prober.latencies)} requests")
        assert prober.errors == []
        assert len(prober.latencies) > 100
        assert prober.p99() <= P99_TARGET
        assert peak - baseline <= RSS_BOUND

        sockets.close()
        # The cut streams were cancelled: both isolates of `flood` serve again.
        for _ in range(2):
            status, _, body = get(pop.host, pop.port, "/flood?n=2", timeout=10)
            assert status == 200
            assert body.count(b"x") == 2 * MIB


def test_a_client_that_reads_nothing_is_cut_after_send_timeout_and_its_stream_cancelled(
        tmp_path: Path) -> None:
    send_timeout = 1.0
    with pop_thread(tmp_path / "data", **{"http.send_timeout": send_timeout}) as pop:
        pop.deploy(python_function(tmp_path, "flood", FLOOD,
                                   limits="wall_ms = 60000\nmax_response_mb = 256"))
        with non_reader(pop.host, pop.port, b"GET /flood HTTP/1.1\r\nhost: t\r\n\r\n") as s:
            time.sleep(send_timeout + 2 * SWEEP)
            s.settimeout(10)
            received = bytearray()
            while data := s.recv(1 << 20):
                received += data
        # Cut (no last chunk) with only what the kernel buffers held, not 256 MiB streamed.
        assert not received.endswith(b"\r\n0\r\n\r\n")
        assert MIB <= len(received) < 16 * MIB
        # Its one isolate was freed by the cancel: it serves the next request.
        status, _, body = get(pop.host, pop.port, "/flood?n=1", timeout=10)
        assert (status, body.count(b"x")) == (200, MIB)
