"""``workers = 2``, what must cover the whole PoP and not only the admin worker:
one scrape of /metrics (and `edgefn cache stats`) counts every worker's requests; an
AI-cache purge empties
every worker's AI cache before it answers. Real `edgefn serve` processes over
loopback; a request is sent to a chosen worker on a keep-alive connection that
``worker_header`` showed to be served by it."""

from __future__ import annotations

import http.client
import json
import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support import listening, wait_for
from tests.test_workers import POP_TOML, Workers, deploy, running, serving

METRICS_TOML = POP_TOML + "[metrics]\nworker_timeout = 10\n"  # the most: a loaded box
# a pinned connection waits while the other worker's first model call runs (seconds)
AI_TOML = POP_TOML + "[http]\nkeepalive_timeout = 300\n"


@contextmanager
def pinned(w: Workers, path: str = "/f") -> Iterator[tuple[dict[str, http.client.HTTPConnection],
                                                           int]]:
    """One keep-alive connection per worker (pid -> connection), found by sending
    GET `path` on fresh connections; and how many GETs that took."""
    found: dict[str, http.client.HTTPConnection] = {}
    sent = 0
    with ExitStack() as stack:
        while len(found) < 2:
            assert sent < 200, f"the kernel sent {sent} connections to one worker"
            conn = http.client.HTTPConnection(w.host, w.port, timeout=30)
            stack.callback(conn.close)
            worker = get(conn, path)[1]
            sent += 1
            found.setdefault(worker, conn)
        yield found, sent


def get(conn: http.client.HTTPConnection, path: str, rids: list[str] | None = None
        ) -> tuple[int, str]:
    """Status and worker of a GET on `conn`; its request id is added to `rids`."""
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    if rids is not None:
        rids.append(resp.getheader("x-request-id") or "")
    return resp.status, resp.getheader("x-edgefn-worker") or ""


def scrape(w: Workers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The admin listener's /metrics: (sample name, sorted labels) -> value."""
    host, port = w.admin.info.admin.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        text = resp.read().decode()
        assert resp.status == 200, text
    finally:
        conn.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def test_one_scrape_counts_the_requests_of_every_worker(tmp_path: Path) -> None:
    with serving(tmp_path, METRICS_TOML) as w:
        deploy(w, tmp_path, 1)
        with pinned(w) as (conns, sent):
            served = {}
            for extra, (pid, conn) in enumerate(sorted(conns.items())):
                answers = [get(conn, "/f") for _ in range(7 + 5 * extra)]
                assert set(answers) == {(200, pid)}  # this worker served them all
                served[pid] = len(answers)
        samples = scrape(w)
        stats = w.admin.request("GET", "/v1/cache/stats")["stats"]  # summed too
    n = sent + sum(served.values())
    assert [r["requests"] for r in stats if r["function"] == "f"] == [n]
    assert total(samples, "edgefn_requests_total", function="f") == n
    assert total(samples, "edgefn_request_duration_seconds_count", function="f") == n
    assert total(samples, "edgefn_scrape_workers_missing") == 0


def chat(conn: http.client.HTTPConnection, worker: str, question: str) -> str:
    """Ask the model on `conn` (served by `worker`); the AI cache's outcome."""
    body = json.dumps({"model": "smollm2-135m", "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]})
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    text = resp.read()
    assert resp.status == 200, text
    assert resp.getheader("x-edgefn-worker") == worker
    return resp.getheader("x-edgefn-cache") or ""


def test_ai_purge_reaches_every_worker(tmp_path: Path) -> None:
    """Before the purge answers, every worker's AI cache lost its entries. (A short
    name: DATA/ai/worker.sock under pytest's tmp_path must fit a unix socket's 108
    bytes.)"""
    with serving(tmp_path, AI_TOML, ai=True) as w, pinned(w, "/healthz") as (conns, _):
        for question in ("Name a colour.", "Name a fruit."):
            for pid, conn in conns.items():  # each worker has an AI cache of its own
                assert chat(conn, pid, question) == "miss"
                assert chat(conn, pid, question) == "hit-exact"
        out = w.admin.request("POST", "/v1/cache/ai/purge", b'{"model": "smollm2-135m"}')
        assert out == {"purged": 4, "model": "smollm2-135m", "tenant": None}
        for pid, conn in conns.items():
            assert chat(conn, pid, "Name a fruit.") == "miss"


def test_the_events_of_every_worker_reach_the_admin_workers_ring(tmp_path: Path) -> None:
    with serving(tmp_path) as w:
        deploy(w, tmp_path, 1)
        with pinned(w) as (conns, _):
            rids: dict[str, list[str]] = {pid: [] for pid in conns}
            for pid, conn in conns.items():
                assert {get(conn, "/f", rids[pid]) for _ in range(9)} == {(200, pid)}
        sent = {r for mine in rids.values() for r in mine}
        assert len(sent) == 18 and "" not in sent

        def listed() -> set[str]:
            out = w.admin.request("GET", "/v1/events?function=f&limit=1000")
            return {e["rid"] for e in out["events"]}

        wait_for(lambda: sent <= listed(), 30, "every worker's events in the ring")


CACHED = """
from edgefn import Response

def handle(request, env):
    return Response("cached", headers={"cache-control": "public, max-age=3600"})
"""


def deploy_cached(w: Workers, tmp_path: Path) -> None:
    """CACHED as function "c", routed at /c/*: every response stored for an hour."""
    from tests.support import python_function

    d = python_function(tmp_path, "c", CACHED)
    (d / "edgefn.toml").write_text((d / "edgefn.toml").read_text().replace(
        'routes = ["/c"]', 'routes = ["/c/*"]'))
    w.admin.deploy(d)


def test_a_purge_counts_the_entries_of_every_worker(tmp_path: Path) -> None:
    """It said the admin worker's count only ("purged 1" for a URL both held)."""
    with serving(tmp_path, POP_TOML) as w:
        deploy_cached(w, tmp_path)
        with pinned(w, "/c/x") as (conns, _):
            for pid, conn in conns.items():
                assert get(conn, "/c/x") == (200, pid)  # stored by each worker
        out = w.admin.request("POST", "/v1/cache/purge", b'{"prefix": "/c/"}')
    assert out == {"purged": 2, "prefix": "/c/"}


def cache_of(conn: http.client.HTTPConnection, method: str, path: str) -> tuple[int, str, str]:
    """Status, worker and ``x-edgefn-cache`` of one request on `conn`."""
    conn.request(method, path)
    resp = conn.getresponse()
    resp.read()
    return resp.status, resp.getheader("x-edgefn-worker") or "", \
        resp.getheader("x-edgefn-cache") or ""


def test_a_post_on_one_worker_drops_the_url_on_every_worker(tmp_path: Path) -> None:
    """A POST's success dropped the URL's stored response on the worker it reached
    only: the other kept serving the old one as a HIT for its whole lifetime.
    The shared disk tier's record is now the truth every worker checks, so the
    other worker stores a fresh answer; and it finds what a worker stored."""
    from tests.support import EXAMPLES

    with serving(tmp_path, POP_TOML) as w:
        deploy_cached(w, tmp_path)
        w.admin.deploy(EXAMPLES / "hello-wat")
        with pinned(w, "/hello") as (conns, _):  # neither has stored anything of c
            (a, ca), (b, cb) = conns.items()
            assert cache_of(ca, "GET", "/c/x")[1:] == (a, "MISS")
            assert cache_of(cb, "GET", "/c/x")[1:] == (b, "HIT")  # what a stored
            assert cache_of(ca, "POST", "/c/x") == (200, a, "BYPASS")
            assert cache_of(cb, "GET", "/c/x")[1:] == (b, "MISS")  # not the dropped one
            assert cache_of(ca, "GET", "/c/x")[1:] == (a, "HIT")  # what b stored


def request_on(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]
               ) -> tuple[int, dict[str, str], bytes]:
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


BOTS_TOML = POP_TOML + ('[bots]\npow_difficulty = 8\ndirectories = ["{origin}"]\n'
                        '[bots.policy]\ndeclared_agent = "challenge"\n')


def test_challenges_and_signatures_are_checked_alike_by_every_worker(tmp_path: Path) -> None:
    """Each worker signed challenges with a random secret of its own (a solution that
    reached the other worker was "forged") and remembered solutions and Web Bot Auth
    signatures alone (one used on a worker passed again on the other)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from runtime.security.bots import pow, webbotauth
    from tests.security.bots_helpers import served_directory
    from tests.support import EXAMPLES

    key = Ed25519PrivateKey.generate()
    gptbot = {"user-agent": "Mozilla/5.0 (compatible; GPTBot/1.1; +https://openai.com/gptbot)"}
    with (served_directory({"keys": [webbotauth.public_jwk(key)]}) as origin,
          serving(tmp_path, BOTS_TOML.format(origin=origin)) as w):
        w.admin.deploy(EXAMPLES / "hello-wat")
        with pinned(w, "/hello") as (conns, _):
            (a, ca), (b, cb) = conns.items()
            status, headers, _ = request_on(ca, "/hello", gptbot)
            assert (status, headers["x-edgefn-worker"]) == (429, a)
            solution = {**gptbot, "x-edgefn-pow": pow.solve(headers["x-edgefn-challenge"])}
            status, headers, body = request_on(cb, "/hello", solution)
            assert (status, headers["x-edgefn-worker"]) == (200, b), body
            status, _, body = request_on(ca, "/hello", solution)
            assert status == 429 and json.loads(body)["error"]["solution"] == "reused"
            signed = webbotauth.sign(key, "GET", f"http://{w.host}:{w.port}/hello",
                                     signature_agent=origin)
            assert request_on(ca, "/hello", signed)[0] == 200
            status, headers, body = request_on(cb, "/hello", signed)  # replayed
            assert (status, headers["x-edgefn-worker"]) == (403, b), body


def test_counts_stay_whole_when_a_worker_and_then_the_admin_worker_restart(
        tmp_path: Path) -> None:
    """The summed counters never fall: a restarted worker's counts are carried (a
    fall reads as a reset to Prometheus, which counted the whole sum again), the
    admin worker's own from what it saved at its last scrape."""
    with serving(tmp_path, METRICS_TOML) as w:
        deploy(w, tmp_path, 1)
        with pinned(w) as (conns, sent):
            for conn in conns.values():
                assert {get(conn, "/f")[0] for _ in range(5)} == {200}
        n = sent + 10
        assert total(scrape(w), "edgefn_requests_total", function="f") == n
        admin_port = int(w.admin.info.admin.rsplit(":", 1)[1])
        (leader,) = [p for p in w.children() if admin_port in listening(p)]
        (other,) = w.children() - {leader}
        for victim in (other, leader):
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda v=victim: not running(v), 10, "the killed worker gone")
            wait_for(lambda: len(w.children()) == 2, 60, "a worker started again")
            seen: list[float] = []

            def whole(seen: list[float] = seen) -> bool:
                try:
                    samples = scrape(w)
                except OSError:  # the admin worker is not back yet
                    return False
                seen.append(total(samples, "edgefn_requests_total", function="f"))
                return total(samples, "edgefn_scrape_workers_missing") == 0

            wait_for(whole, 60, "every worker answering the scrape")
            assert set(seen) == {n}, (victim == leader, seen)


def test_the_shared_rate_limit_table_is_in_one_scrape_once(tmp_path: Path) -> None:
    """The workers' shared table (`[ratelimit] shared_keys = 8`: one group of 8 slots)
    is read by the admin worker alone: ten clients' windows there give up two, and the
    scrape says 2 (not 2 per worker), the table's 8 keys and no lock taken over."""
    toml = METRICS_TOML + ('[ratelimit]\nshared_keys = 8\n'
                           'rules = [{ by = "ip", limit = "100/minute" }]\n')
    with serving(tmp_path, toml) as w:
        deploy(w, tmp_path, 1)
        for i in range(10):  # ten clients: 127.0.0.10 .. 127.0.0.19
            conn = http.client.HTTPConnection(w.host, w.port, timeout=30,
                                              source_address=(f"127.0.0.{10 + i}", 0))
            try:
                assert get(conn, "/f")[0] == 200
            finally:
                conn.close()
        samples = scrape(w)
        assert total(samples, "edgefn_ratelimit_table_evictions_total") == 2
        assert total(samples, "edgefn_ratelimit_table_recovered_total") == 0
        assert total(samples, "edgefn_ratelimit_table_keys") == 8
