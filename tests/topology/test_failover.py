"""kill -9 one edge and one regional under load: clients of the dead edge's
geography go to the nearest healthy edge, edges go around the dead regional, no
request fails beyond those in flight on the killed node, recovery <= 2 s; and
`topology down` afterwards leaves no process behind (the killed PoPs' model
workers included).

What a loaded machine stretches is measured in the same run rather than raced: how
long the news of the edge's death took to reach a client (a kept connection through
its geography's entry, closed by the link), and how long the requests in flight at
each kill took (recovery counts from when a client could send again)."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.topology import runner
from runtime.topology.load import Client, Sample, failed_beyond, in_flight, recovery
from runtime.topology.rundir import PopEntry, read_state
from tests.topologies import HELLO, network, pop, running

REGIONALS = ["reg-a", "reg-b", "central"]
TOPOLOGY = (network(10, 30, 100, reroute_rtt_ms=[40, 40], health_interval_s=0.2, jitter_ms=1.0)
            + pop("central", "central") + pop("reg-a", "regional", parents=["central"])
            + pop("reg-b", "regional", parents=["central"])
            + pop("edge-1", "edge", geo="g1", parents=REGIONALS, functions=[HELLO])
            + pop("edge-2", "edge", geo="g2", parents=REGIONALS, functions=[HELLO]))
GRACE = 0.1  # a link's one-way delay, rounded up: how long the news of a death travels
BOUND = 2.0  # seconds: recovery, and the news of a death reaching a client


def _load(port: int, geo: str, stop: threading.Event, out: list[Sample]) -> None:
    """Alternate a function call and a chat nobody asked before (it must reach central)."""
    with Client(geo, port, timeout=30) as client:
        while not stop.is_set():
            out.append(client.send("fn", "GET", "/hello"))
            body = json.dumps({"model": "smollm2-135m", "max_tokens": 1, "temperature": 0,
                               "messages": [{"role": "user", "content": uuid.uuid4().hex}]})
            out.append(client.send("chat", "POST", "/v1/chat/completions", body.encode(),
                                   {"content-type": "application/json"}))


class _Once(threading.Event):
    """An Event that is set after one round."""

    def is_set(self) -> bool:
        done, self.done = getattr(self, "done", False), True
        return done


class _Closed(threading.Thread):
    """A kept-alive connection through entry `port`, idle after one answer; `at` is
    when its far side closed it (monotonic), None until then: when the news of a
    death behind it reached a client (the link passes the FIN on, or closes idle
    connections to a route that is down)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("GET", "/hello")
        self.conn.getresponse().read()
        self.at: float | None = None
        self.start()

    def run(self) -> None:
        assert self.conn.sock is not None
        if select.select([self.conn.sock], [], [], 60)[0]:
            self.at = time.monotonic()
        self.conn.close()


def _chat(client: Client) -> Sample:
    """A one-token chat nobody asked before (no cache answers it)."""
    body = json.dumps({"model": "smollm2-135m", "max_tokens": 1,
                       "messages": [{"role": "user", "content": uuid.uuid4().hex}]})
    return client.send("chat", "POST", "/v1/chat/completions", body.encode(),
                       {"content-type": "application/json"})


@contextmanager
def _hung(pop: PopEntry) -> Iterator[None]:
    """`pop` stopped (SIGSTOP: it accepts, and answers nothing) once its own
    `/readyz` no longer answers and a link's probe round (0.5 s timeout) has seen it
    down; continued after."""
    os.kill(pop.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while runner.ready(pop.public) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        yield
    finally:
        os.kill(pop.pid, signal.SIGCONT)


def _chats_after(samples: list[Sample], t: float) -> int:
    """Chats from g1 (whose edge is dead) sent after `t` that succeeded."""
    return sum(s.geo == "g1" and s.kind == "chat" and s.status == 200 and s.started > t
               for s in list(samples))


def test_kill_an_edge_and_a_regional_under_load(tmp_path: Path) -> None:
    with running(tmp_path, TOPOLOGY) as run:
        state, net = read_state(run), runner.read_network(run)
        assert state is not None
        pids = {p.name: p.pid for p in state.pops}
        for g in ("g1", "g2"):  # each tier's model worker and its first call, uncounted
            _load(net.entries[g], g, _Once(), [])
        samples: list[Sample] = []
        stop = threading.Event()
        threads = [threading.Thread(target=_load, args=(net.entries[g], g, stop, samples))
                   for g in ("g1", "g2")]
        for t in threads:
            t.start()
        time.sleep(3)  # load runs through edge-1, edge-2 and reg-a
        news = _Closed(net.entries["g1"])  # a connection to edge-1, as g1's client keeps
        kills = [time.monotonic()]
        os.kill(pids["edge-1"], signal.SIGKILL)
        time.sleep(3)
        kills.append(time.monotonic())
        os.kill(pids["reg-a"], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _chats_after(samples, kills[1] + GRACE) < 2:
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
        news.join(60)
    # a request sent on g1's kept connection before the news reached it could not know
    heard = (news.at if news.at is not None else float("inf")) - kills[0]
    beyond = failed_beyond(samples, kills, [max(GRACE, heard + GRACE), GRACE])
    failed = [s for s in samples if s.status != 200]
    edge_back = recovery(samples, kills[0], {"g1"})
    regional_back = recovery(samples, kills[1], {"g1", "g2"}, "chat")
    chats = sorted(s.seconds for s in samples if s.kind == "chat" and s.status == 200)
    # a request in flight at a kill ends (answered elsewhere, or failed) within the
    # bound past the slowest of its kind before the kills: it is not waited out
    slowest = {kind: max(s.seconds for s in samples if s.kind == kind
                         and s.started + s.seconds < kills[0]) for kind in ("fn", "chat")}
    late = [(s.kind, s.status, round(s.started + s.seconds - k, 3)) for k in kills
            for s in in_flight(samples, k) if s.started + s.seconds - k > BOUND + slowest[s.kind]]
    print(f"{len(samples)} requests, {len(failed)} failed (in flight on a killed PoP), "
          f"{len(beyond)} beyond; the edge's death reached a client in {heard:.3f} s; "
          f"recovery after the edge: {edge_back:.3f} s, after the regional: "
          f"{regional_back:.3f} s (from when a client could send); chat p50 "
          f"{chats[len(chats) // 2]:.3f} s, slowest before the kills {slowest['chat']:.3f} s")
    assert heard <= BOUND, heard
    assert beyond == [], beyond
    assert edge_back <= BOUND and regional_back <= BOUND
    assert late == [], late
    # the load really went on through the other edge and around the regional
    assert _chats_after(samples, kills[1] + GRACE) >= 2
    assert runner.stragglers(run) == []
    assert not any(runner.alive(pid) for pid in pids.values())


def test_a_hung_regional_is_gone_around_though_edges_kept_connections_to_it(
        tmp_path: Path) -> None:
    """SIGSTOP of a regional (it accepts, and answers nothing): edge-1's worker keeps
    its connection to its parent between model calls, which leads to reg-a. Once the
    link's probes see reg-a not ready, the link closes that idle connection, so the
    next chat goes to reg-b; kept, it would wait out the upstream's timeout."""
    topology = (network(10, 30, 100, health_interval_s=0.2)
                + pop("central", "central") + pop("reg-a", "regional", parents=["central"])
                + pop("reg-b", "regional", parents=["central"])
                + pop("edge-1", "edge", geo="g1", parents=REGIONALS))
    with running(tmp_path, topology) as run:
        state, net = read_state(run), runner.read_network(run)
        assert state is not None
        reg_a = next(p for p in state.pops if p.name == "reg-a")
        with Client("g1", net.entries["g1"], timeout=30) as client:
            for _ in range(2):  # the second on the kept connection, through reg-a
                assert _chat(client).status == 200
            with _hung(reg_a):  # (then a probe round's idle close)
                sample = _chat(client)
        print(f"chat after reg-a hung: {sample.status} in {sample.seconds:.3f} s")
        assert sample.status == 200, sample.error
        assert sample.seconds < 5.0  # the upstream's timeout is 30 s or more


def test_a_hung_only_parent_is_a_prompt_error_not_the_upstreams_timeout(
        tmp_path: Path) -> None:
    """SIGSTOP of an edge's only parent: the link's probes mark it down, yet a new
    connection still tries it (every probe could be stale), and the hung PoP accepts
    it and answers nothing. Once a probe begun after that connection fails too, the
    link resets it: the chat fails within about a probe round, not the upstream's
    120 s; and goes through again once the parent is back."""
    topology = (network(10, 30, 100, health_interval_s=0.2)
                + pop("central", "central") + pop("reg-a", "regional", parents=["central"])
                + pop("edge-1", "edge", geo="g1", parents=["reg-a"]))
    with running(tmp_path, topology) as run:
        state, net = read_state(run), runner.read_network(run)
        assert state is not None
        reg_a = next(p for p in state.pops if p.name == "reg-a")

        def chat() -> Sample:
            with Client("g1", net.entries["g1"], timeout=60) as client:
                return _chat(client)

        assert chat().status == 200
        with _hung(reg_a):
            hung = chat()
        deadline = time.monotonic() + 10
        back = chat()
        while back.status != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
            back = chat()
    print(f"chat with its only parent hung: {hung.status} in {hung.seconds:.3f} s; "
          f"after SIGCONT: {back.status}")
    assert hung.status in (502, 503, 504), (hung.status, hung.error)
    # a probe round is 0.2 s + its 0.5 s timeout; the upstream's timeout is 120 s
    assert hung.seconds < 3.0, hung.seconds
    assert back.status == 200, back.error
