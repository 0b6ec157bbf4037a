"""A request whose body comes in a later read than its head (httpx writes the two
apart; on a real network a body often comes in a later segment): the front holds
what came (protocol.py `_hold`) when the lane would take the request whole (lane.c
`held`), and the lane serves it once the rest is read. Two real PoPs on loopback,
the lane on and off, the same bytes sent to both in the same pieces: the same
answers, events and log lines; the lane serves what it held; what the front must
answer before the body (a 100 Continue, a 413) is never held; a client that stops
sending gets the 408 the Python front gives, in its shape."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.net.lane_support import exchange, normal
from tests.net.test_native_lane import ROOT, Side, build, lane_pair, one_request, request
from tests.net.test_native_lane_python import python_folder

PORTS = {"auto": 28022, "off": 28023}
BODY_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    root = tmp_path_factory.mktemp("held")
    folders = [ROOT / "functions" / "examples" / "echo",
               ROOT / "functions" / "examples" / "hello-wat", python_folder(root / "fns")]
    with lane_pair(root, PORTS, folders, **{"http.body_timeout": BODY_TIMEOUT,
                                             "http.max_body_bytes": 1 << 16}) as sides:
        yield sides


def both_cut(pair: tuple[Side, Side], raw: bytes, methods: list[bytes],
             cuts: tuple[int, ...], gap: float = 0.03) -> list[bytes]:
    """`raw` sent to both PoPs in the same pieces: the same answers, events, log lines."""
    got, want = ([normal(r, side.prefix) for r in exchange(side.r.port, raw, methods,
                                                           cuts=cuts, gap=gap)]
                 for side in pair)
    on, off = pair
    assert got == want, (raw, cuts)
    assert on.new_events() == off.new_events(), (raw, cuts)
    assert on.new_log() == off.new_log(), (raw, cuts)
    return got


def served(side: Side) -> int:
    side.r.delivered()  # the lane counts what it served as it drains
    assert side.lane is not None
    return side.lane.served


@pytest.mark.parametrize("path", ["/echo?q=1", "/pyecho"])
@pytest.mark.parametrize("where", ["head", "head+1", "body", "three", "in the head"])
def test_a_body_read_after_its_head_is_served_by_the_lane(pair: tuple[Side, Side], path: str,
                                                          where: str) -> None:
    """A POST cut after its head (as httpx writes it), one byte into its body, in its
    body, or in three pieces: served by the lane (before, it was Python's), answered
    as Python answers it; then a GET on the same connection (in the last piece),
    served too (but behind a Python function's call, which the front parses while
    the call runs). Cut in its head, it is Python's, and so is what comes with it."""
    on, _ = pair
    body = bytes(range(256)) * 8
    post = request("POST", path, [("Host", "x"), ("Content-Type", "application/json")], body)
    head = len(post) - len(body)
    cuts, by_lane = {"head": ((head,), 2), "head+1": ((head + 1,), 2),
                     "body": ((head + 1000,), 2), "three": ((head + 3, head + 700, head + 1500), 2),
                     "in the head": ((head - 5,), 0)}[where]
    get = request("GET", "/hello", [("Host", "x")])
    before = served(on)
    got = both_cut(pair, post + get, [b"POST", b"GET"], cuts)
    if path == "/pyecho" and by_lane:  # what came behind a Python call is the front's
        by_lane = 1  # while the call runs: the GET, read with the body's end
    assert served(on) - before == by_lane
    assert len(got) == 2 and got[1].endswith(b"Hello from edgefn (WASM)!\n")
    if path.startswith("/echo"):
        assert got[0].endswith(b"\r\n\r\n" + body)
    else:
        assert got[0].endswith(b"POST 2048 'application/json' " + body[:40])


def test_what_must_be_answered_before_the_body_is_never_held(pair: tuple[Side, Side]) -> None:
    """Held, these would wait for a body the client does not send yet: a 100-continue
    (the client waits for it before sending its body), a body past max_body_bytes (the
    413 comes at once, and the upload is not read). Both PoPs answer from the head,
    well before body_timeout (when a held request would be read for its 408)."""
    for side in pair:
        with socket.create_connection(("127.0.0.1", side.r.port),
                                      timeout=BODY_TIMEOUT / 2) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Content-Length: 4\r\n\r\n")
            assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(b"abcd")
            assert s.recv(4096).endswith(b"\r\n\r\nabcd")
        with socket.create_connection(("127.0.0.1", side.r.port),
                                      timeout=BODY_TIMEOUT / 2) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\nab"
                      % ((1 << 16) + 1))
            assert s.recv(4096).startswith(b"HTTP/1.1 413 ")
    on, off = pair
    assert on.new_events() == off.new_events()


@pytest.mark.parametrize("ctype", ["application/json", "text/plain"])
def test_a_client_that_stops_sending_gets_the_fronts_408(pair: tuple[Side, Side],
                                                         ctype: str) -> None:
    """Head and half the body, then nothing: both PoPs answer 408 once body_timeout
    passed (JSON to a client that sent JSON: the held head is read for it), and close."""
    answers = []
    for side in pair:
        with socket.create_connection(("127.0.0.1", side.r.port), timeout=10) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n"
                      b"Content-Length: 10\r\n\r\nabcde" % ctype.encode())
            sent = time.monotonic()
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            waited = time.monotonic() - sent
        assert BODY_TIMEOUT <= waited <= BODY_TIMEOUT + 1.5, waited
        answers.append(normal(data, side.prefix))
    assert answers[0] == answers[1]
    assert answers[0].startswith(b"HTTP/1.1 408 ") and b"connection: close" in answers[0]
    assert (b'"code": "timeout"' in answers[0]) == (ctype == "application/json"), answers[0]


def test_a_client_gone_before_the_body_came_leaves_nothing(pair: tuple[Side, Side]) -> None:
    """Head and part of the body, then the client closes: no answer, no event, on
    either PoP; the next connection is served."""
    on, off = pair
    for side in pair:
        with socket.create_connection(("127.0.0.1", side.r.port), timeout=5) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            time.sleep(0.05)
    assert on.new_events() == off.new_events() == []
    both_cut(pair, request("GET", "/hello", [("Host", "x")]), [b"GET"], ())


@settings(max_examples=100, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(one_request, min_size=1, max_size=3),
       fractions=st.lists(st.floats(0, 1), max_size=3))
def test_random_batches_in_random_pieces_answered_alike(
        pair: tuple[Side, Side], batch: list[tuple[str, str, str, str | None,
                                                   list[tuple[str, str]], bytes]],
        fractions: list[float]) -> None:
    """Random pipelined batches (odd headers, bodies, hosts, versions, paths) cut at
    random places into reads: the same bytes back, events and log lines."""
    raw = b"".join(build(r) for r in batch)
    both_cut(pair, raw, [r[0].encode() for r in batch],
             tuple(int(f * len(raw)) for f in fractions), gap=0.01)


@pytest.mark.parametrize("path", ["/echo?q=1", "/pyecho"])
def test_a_last_request_whose_body_comes_later_is_the_lanes_and_closes(
        pair: tuple[Side, Side], path: str) -> None:
    """A POST with ``Connection: close`` cut after its head: held, then served by the
    lane with ``connection: close``, as Python answers it; what follows it on the
    connection is never answered."""
    on, _ = pair
    body = b"x" * 300
    post = request("POST", path, [("Host", "x"), ("Connection", "close")], body)
    get = request("GET", "/hello", [("Host", "x")])
    before = served(on)
    got = both_cut(pair, post + get, [b"POST", b"GET"], (len(post) - len(body),))
    assert served(on) - before == 1
    assert len(got) == 1 and b"\r\nconnection: close\r\n" in got[0]
