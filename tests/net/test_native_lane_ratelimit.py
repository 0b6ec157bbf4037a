"""Rate limits on the native lane (lane.c `serve_one`, `answer_frame`, `refuse`;
runtime/pipeline/lane.py `_limit_admits`, `_refusal`; `RateLimit.lane_checks`,
`lane_refusal`, the counters' `count`): two real PoPs on loopback, the lane on and off,
the same PoP rule by ip and the same functions with rules of their own (each algorithm,
by ip and by function), the same requests sent to both in the same order. The lane
serves what ratelimit admits, counted in the stage's own counters, and writes the 429s
it refuses with: the same answers (the RateLimit fields, a 429 where the limit is
full), events, log lines and counts as the Python front's."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.net.lane_support import exchange, normal, to_the_close
from tests.net.test_native_lane import Side, lane_pair, request
from tests.support import function_dir, python_function, reactor

PORTS = {"auto": 28024, "off": 28025}
LIMIT = 4  # each function's own, per minute
FUNCTIONS = {  # name: its [[rate_limits]]
    "slide": '[[rate_limits]]\nby = "ip"\nlimit = "4/minute"\n',
    "fixed": '[[rate_limits]]\nby = "ip"\nlimit = "4/minute"\nalgorithm = "fixed_window"\n',
    "moving": '[[rate_limits]]\nby = "ip"\nlimit = "4/minute"\nalgorithm = "moving_window"\n',
    "byfn": '[[rate_limits]]\nby = "function"\nlimit = "4/minute"\n',
    "twice": '[[rate_limits]]\nby = "ip"\nlimit = "6/minute"\n'
             '[[rate_limits]]\nby = "ip"\nlimit = "4/minute"\nalgorithm = "fixed_window"\n',
}
PYTHON = {"pylimit": "ok", "pyboom": "boom"}  # name: what it does; each limited as "slide"
PYFN = '''
from edgefn import Response


def handle(request, env):
    if request.path == "/pyboom":
        raise RuntimeError("boom")
    return Response(b"py " + request.body, headers={"x-py": "1"})
'''
POP_RULE = [{"by": "ip", "limit": "200/minute"}]  # (every test's requests count)
GUARDED = FUNCTIONS["slide"] + '[bots]\nautomation = "block"\n'  # limited, and bots acts
BROWSER = [("Host", "x"), ("User-Agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 "
                                         "(KHTML, like Gecko) Chrome/126.0.0.0 Safari/537.36"),
           ("Accept", "text/html"), ("Accept-Language", "en"), ("Sec-Fetch-Mode", "navigate")]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    root = tmp_path_factory.mktemp("limits")
    folders = [function_dir(root / "fns", name, reactor(""), extra=rules)
               for name, rules in {**FUNCTIONS, "open": "", "guarded": GUARDED,
                                   "closing": FUNCTIONS["slide"]}.items()]
    folders += [python_function(root / "fns", name, PYFN, extra=FUNCTIONS["slide"])
                for name in PYTHON]
    with lane_pair(root, PORTS, folders, **{"ratelimit.rules": POP_RULE}) as sides:
        yield sides


def steady(response: bytes) -> bytes:
    """`response` without the seconds to a window's reset (`t=`, `Retry-After`): the
    two PoPs' first hits were a moment apart, across a second's edge at times."""
    response = re.sub(rb";t=\d+", b";t=T", response)
    response = re.sub(rb"retry after \d+ s", b"retry after N s", response)
    return re.sub(rb"\r\nretry-after: \d+\r\n", b"\r\nretry-after: N\r\n", response)


def sent(pair: tuple[Side, Side], raw: bytes, method: bytes = b"GET") -> bytes:
    """`raw` sent to both PoPs: the same answer, events and log lines (but the seconds
    to a reset)."""
    on, off = pair
    got, want = (steady(normal(exchange(side.r.port, raw, [method])[0], side.prefix))
                 for side in pair)
    assert got == want, raw
    assert [steady_event(e) for e in on.new_events()] == \
        [steady_event(e) for e in off.new_events()], raw
    assert [steady(x) for x in on.new_log()] == [steady(x) for x in off.new_log()], raw
    return got


def steady_event(event: dict[str, object]) -> dict[str, object]:
    return {k: (steady(v.encode()).decode() if isinstance(v, str) else v)
            for k, v in event.items()}


def served(side: Side) -> int:
    side.r.delivered()
    assert side.lane is not None
    return side.lane.served


@pytest.mark.parametrize("name", [*FUNCTIONS, *PYTHON])
def test_the_lane_serves_what_ratelimit_admits_and_refuses_the_rest(
        pair: tuple[Side, Side], name: str) -> None:
    """Up to the function's limit each request is the lane's, answered with the
    RateLimit fields its counts give (the remaining quota goes down by one each
    time, as on the Python PoP); past it each is the lane's 429, from the same counts
    (the function never called): the lane counted what it served, and the refusals
    as the stage counts them. A Python function's call is counted as it is
    submitted; one that raises answers the isolate's 500, with the fields too. The
    scrape's counts (the 429s', their policy's) are the Python PoP's."""
    on, off = pair
    assert on.lane is not None
    answers = []
    for i in range(LIMIT + 3):
        before, calls = served(on), on.lane.calls
        method = b"HEAD" if i == LIMIT + 2 else b"POST" if i % 2 else b"GET"
        got = sent(pair, request(method.decode(), f"/{name}", [("Host", "x")],
                                 b"b" * i if method == b"POST" else b""), method)
        answers.append(got)
        # a Python function's: its call started by the lane (one that raised was
        # finished by the stages' code: no record of the C's)
        took = on.lane.calls - calls if name in PYTHON and i < LIMIT else served(on) - before
        assert took == 1, (name, i)
        if i >= LIMIT:  # refused: no call
            assert on.lane.calls == calls, (name, i)
    ok = b"500" if name == "pyboom" else b"200"
    assert [a.split(b" ", 2)[1] for a in answers] == [ok] * LIMIT + [b"429"] * 3
    assert answers[-1].endswith(b"\r\n\r\n")  # HEAD's: its length, no body
    assert b"\r\nratelimit: " in answers[0] and b"\r\nratelimit-policy: " in answers[0]
    remaining = [re.findall(rb'"fn-ip(?:-2)?";r=(\d+)|"fn-function";r=(\d+)', a)
                 for a in answers[:LIMIT]]
    assert len({tuple(r) for r in remaining}) == LIMIT  # one fewer each time
    assert on.metrics() == off.metrics()
    assert on.cache_stats() == off.cache_stats()


def test_bots_blocks_before_ratelimit_counts_on_the_lane_too(pair: tuple[Side, Side]) -> None:
    """A request whose bot class the function blocks is bots' 403 (its event with the
    bots record's ``block``, the metrics' bot actions), counted against the PoP's rule
    by ip (`stages.refusals`; so Python's, not the lane's: the lane writes bots' 403
    where nothing counts it, test_native_lane_guarded) but not against the function's
    own limits (its requests after it are all admitted, the lane's), and with the
    limit full it is still the 403."""
    on, off = pair
    curl = [("Host", "x"), ("User-Agent", "curl/8")]
    for _ in range(2):
        before = served(on)
        got = sent(pair, request("GET", "/guarded", curl))
        assert got.split(b" ", 2)[1] == b"403" and served(on) == before
        assert b"\r\nx-edgefn-error: bot_blocked\r\n" in got
    for _ in range(LIMIT):
        assert sent(pair, request("GET", "/guarded", BROWSER)).split(b" ", 2)[1] == b"200"
    for headers, status, lane in ((curl, b"403", 0), (BROWSER, b"429", 1)):
        before = served(on)
        assert sent(pair, request("GET", "/guarded", headers)).split(b" ", 2)[1] == status
        assert served(on) - before == lane
    assert on.metrics() == off.metrics()


def test_a_blocked_clients_refusals_are_counted_by_the_pop_rule(pair: tuple[Side, Side]
                                                                 ) -> None:
    """A class a function blocks (``[bots] automation = "block"``): its 403s count
    against the PoP's rule by ip (`stages.refusals`), which the lane does not do for
    bots, so they are Python's (with no such rule, the lane's: test_native_lane_guarded
    `test_bots_answers_before_auth`); its HEAD (the length, no body) and its POST (a
    body read, never run) answered alike on both PoPs, and counted alike."""
    on, off = pair
    for method in ("HEAD", "POST"):
        before = served(on)
        got = sent(pair, request(method, "/guarded", [("Host", "x"), ("User-Agent", "curl/8")],
                                 b"x" if method == "POST" else b""), method.encode())
        assert got.split(b" ", 2)[1] == b"403" and served(on) == before
    assert on.metrics() == off.metrics()


def test_a_refusal_says_how_its_connection_goes_on(pair: tuple[Side, Side]) -> None:
    """The lane's 429 to a request not kept alive (``Connection: close``, HTTP/1.0)
    says ``connection: close`` and is the connection's last; to HTTP/1.0 kept alive,
    ``connection: keep-alive``: as the front writes the stages' 429."""
    on, _ = pair
    for _ in range(LIMIT):
        sent(pair, request("GET", "/closing", [("Host", "x")]))
    cases = {b"GET /closing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n":
             b"\r\nconnection: close\r\n",
             b"GET /closing HTTP/1.0\r\nHost: x\r\n\r\n": b"\r\nconnection: close\r\n",
             b"GET /closing HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n":
             b"\r\nconnection: keep-alive\r\n"}
    for raw, says in cases.items():
        before = served(on)
        got = sent(pair, raw)
        assert got.split(b" ", 2)[1] == b"429" and says in got, raw
        assert served(on) - before == 1
    for side in pair:  # the last one read: what follows a close is never answered
        closed = to_the_close(side.r.port, next(iter(cases)) + request("GET", "/open",
                                                                       [("Host", "x")]))
        assert closed.count(b"HTTP/1.1 ") == 1 and b" 429 " in closed


def test_a_function_without_rules_of_its_own_meets_the_pops(pair: tuple[Side, Side]) -> None:
    """The PoP's rule by ip alone (`open`): the lane's, with that rule's fields and its
    pass in the event; the scrape's counts the same on both PoPs."""
    on, off = pair
    for _ in range(2):
        before = served(on)
        got = sent(pair, request("GET", "/open", [("Host", "x")]))
        assert served(on) - before == 1
        assert b'\r\nratelimit-policy: "by-ip";q=200;w=60\r\n' in got
    assert on.metrics() == off.metrics()


def test_a_redeploy_with_new_limits_counts_by_them_on_a_connection_left_open(
        pair: tuple[Side, Side], tmp_path: Path) -> None:
    """The lane keeps each connection's checks (`limit_checks`, by route index): a
    redeploy that changes a function's limit drops them, so the next request on a
    connection opened before it is counted by the new limit, as on the Python PoP
    (kept, it answered with the old limit's fields and counted the old counter)."""
    on, _ = pair
    got = []
    for side in pair:
        folder = tmp_path / side.r.pop.config.data_dir.name
        conn = http.client.HTTPConnection("127.0.0.1", side.r.port, timeout=10)
        answers = []
        for limit in (3, 5):
            side.r.deploy(function_dir(folder, "relimit", reactor(""),
                                       extra=f'[[rate_limits]]\nby = "ip"\nlimit = "{limit}/minute"\n'))
            for _ in range(2):
                before = served(on)
                conn.request("GET", "/relimit")
                response = conn.getresponse()
                response.read()
                answers.append((response.status, response.getheader("ratelimit-policy"),
                                response.getheader("ratelimit")))
                if side is on:
                    assert served(on) - before == 1
        conn.close()
        side.new_events(), side.new_log()  # read: the next test compares what follows
        got.append([(s, p, re.sub(r";t=\d+", "", r)) for s, p, r in answers])
    assert got[0] == got[1]
    assert [(status, policy) for status, policy, _ in got[0]] == \
        [(200, f'"by-ip";q=200;w=60, "fn-ip";q={q};w=60') for q in (3, 3, 5, 5)]
    assert [re.findall(r'"fn-ip";r=(\d+)', state) for _, _, state in got[0]] == \
        [["2"], ["1"], ["4"], ["3"]]
