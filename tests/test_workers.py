"""``workers = 2``: real `edgefn serve` processes, real HTTP over loopback. Requests
land on both workers; after a deploy or rollback call returns no worker serves the
old version; a worker killed with SIGKILL loses no later request and comes back;
one that cannot follow a deploy is killed before the call returns; there is one
admin listener; SIGTERM drains them all; bad `workers` values are refused."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config
from runtime.admin.client import AdminClient
from tests.support import ROOT, function_dir, listening, python_function, reactor, running, wait_for

POP_TOML = """workers = 2
worker_header = true
worker_ack_timeout = 3
[events]
file = "events.jsonl"
"""


@dataclass
class Workers:
    proc: subprocess.Popen[str]
    host: str
    port: int
    data: Path
    stderr: list[str] = field(default_factory=list)

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.data)

    def get(self, path: str = "/f") -> tuple[int, str, str]:
        """Status, ``x-edgefn-function`` and ``x-edgefn-worker`` of a GET on a fresh
        connection (so the kernel picks a worker for each)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return (resp.status, resp.getheader("x-edgefn-function") or "",
                    resp.getheader("x-edgefn-worker") or "")
        finally:
            conn.close()

    def post(self, path: str, body: object) -> tuple[int, object, str]:
        """Status, JSON body and ``x-edgefn-worker`` of a POST of JSON `body` on a fresh
        connection."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("POST", path, json.dumps(body).encode(),
                         {"content-type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read()), resp.getheader("x-edgefn-worker") or ""
        finally:
            conn.close()

    def children(self) -> set[int]:
        """The worker processes: children of the PoP running `runtime.workers`."""
        return {pid for pid in _children(self.proc.pid) if running(pid)
                and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()}


def _children(parent: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if int(ppid) == parent:
                found.add(int(entry.name))
    return found


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with serving(tmp_path) as w:
        yield w


@contextlib.contextmanager
def serving(tmp_path: Path, pop_toml: str = POP_TOML, ai: bool = False) -> Iterator[Workers]:
    """`edgefn serve` with `pop_toml` (and the model worker with `ai`), stopped and
    every worker gone on exit."""
    (tmp_path / "pop.toml").write_text(pop_toml)
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "serve", "--config", str(tmp_path / "pop.toml"),
         *([] if ai else ["--no-ai"]), "--port", "0", "--data", str(data)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    stderr: list[str] = []
    drain = threading.Thread(target=stderr.extend, args=(proc.stderr,), daemon=True)
    drain.start()
    pids: set[int] = set()
    try:
        address = ""
        for line in proc.stdout:
            if line.startswith("edgefn PoP listening on http://"):
                address = line.split("http://", 1)[1].split()[0]
            if line.startswith("serving "):
                break
        assert address, "the PoP did not start:\n" + "".join(stderr)
        host, port = address.rsplit(":", 1)
        w = Workers(proc, host, int(port), data, stderr)
        pids = w.children()  # kept: a worker orphaned by a failed test is killed too
        yield w
    finally:
        pids |= _children(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for pid in pids:  # none is left behind, even by a failed test
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        drain.join(5)
        proc.stdout.close()
        proc.stderr.close()


def deploy(w: Workers, root: Path, rev: int) -> str:
    """Deploy function `f` at revision `rev`; its version."""
    d = function_dir(root / f"r{rev}", "f", reactor(""), extra=f"# rev {rev}")
    return str(w.admin.deploy(d)["version"])


class Load:
    """Threads sending GET /f on fresh connections until stopped; each result with
    the time its request was sent."""

    def __init__(self, w: Workers, threads: int = 6) -> None:
        self.w = w
        self.results: list[tuple[float, int, str, str]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            self.results.append((sent, *self.w.get()))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def after(self, t: float) -> list[tuple[float, int, str, str]]:
        return [r for r in self.results if r[0] > t]


def test_requests_land_on_both_workers(workers: Workers, tmp_path: Path) -> None:
    deploy(workers, tmp_path, 1)
    answers = [workers.get() for _ in range(60)]
    served = {a[2] for a in answers}
    assert {int(p) for p in served} == workers.children()
    assert len(served) == 2
    # each worker writes its own events file: one writer rotates each
    files = [workers.data / "events.jsonl", workers.data / "events.w1.jsonl"]

    def logged() -> list[int]:
        return [len(f.read_text().splitlines()) if f.exists() else 0 for f in files]

    wait_for(lambda: sum(logged()) == 60, 10, "every request's event in a file")
    assert all(n > 0 for n in logged())


def test_no_worker_serves_the_old_version_after_a_deploy_or_rollback(
        workers: Workers, tmp_path: Path) -> None:
    v1 = deploy(workers, tmp_path, 1)
    with Load(workers) as load:
        time.sleep(0.5)
        v2 = deploy(workers, tmp_path, 2)
        deployed = time.monotonic()
        time.sleep(1.0)
        workers.admin.request("POST", "/v1/functions/f/rollback", b"{}")
        rolled_back = time.monotonic()
        time.sleep(1.0)
    assert v1 != v2
    assert {r[1] for r in load.results} == {200}  # nothing lost while switching
    between = [r for r in load.after(deployed) if r[0] <= rolled_back - 0.3]
    assert {r[2] for r in between} == {f"f@{v2}"}
    assert len({r[3] for r in between}) == 2  # both workers served the new version
    after = load.after(rolled_back)
    assert {r[2] for r in after} == {f"f@{v1}"} and len({r[3] for r in after}) == 2


def test_a_killed_worker_loses_no_later_request_and_comes_back(
        workers: Workers, tmp_path: Path) -> None:
    v1 = deploy(workers, tmp_path, 1)
    before = workers.children()
    victim = max(before)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not running(victim), 10, "the killed worker gone")
    answers = [workers.get() for _ in range(40)]
    assert {a[0] for a in answers} == {200}
    wait_for(lambda: len(workers.children()) == 2, 60, "a worker started again")
    wait_for(lambda: len({workers.get()[2] for _ in range(20)}) == 2, 60,
             "the new worker serving")
    (replacement,) = workers.children() - before
    assert {a for a in (workers.get() for _ in range(30)) if a[2] == str(replacement)} \
        == {(200, f"f@{v1}", str(replacement))}
    assert any("exited with -9" in line for line in workers.stderr)


def test_a_worker_that_cannot_follow_a_deploy_is_killed_before_the_call_returns(
        workers: Workers, tmp_path: Path) -> None:
    deploy(workers, tmp_path, 1)
    admin_port = int(workers.admin.info.admin.rsplit(":", 1)[1])
    (stuck,) = [p for p in workers.children() if admin_port not in listening(p)]
    os.kill(stuck, signal.SIGSTOP)
    try:
        started = time.monotonic()
        v2 = deploy(workers, tmp_path, 2)
        took = time.monotonic() - started
        assert not running(stuck)  # killed before the call returned
    finally:
        if running(stuck):
            os.kill(stuck, signal.SIGCONT)
    assert took >= 3  # it waited worker_ack_timeout for the answer
    answers = [workers.get() for _ in range(30)]
    assert {a[:2] for a in answers} == {(200, f"f@{v2}")}
    wait_for(lambda: len(workers.children()) == 2, 60, "the killed worker started again")
    assert any(f"pid {stuck}) did not follow sync: no answer in 3s" in line
               for line in workers.stderr)


def test_a_worker_whose_loop_stops_answering_is_killed_and_started_again(
        workers: Workers) -> None:
    """A worker stopped (SIGSTOP, as a loop frozen in a native call would be) answers
    no liveness ping: within LIVENESS_EVERY plus twice worker_ack_timeout (3 s) the
    primary kills it, and a new one serves (before, it served none of the connections
    the kernel gave it, for good)."""
    from runtime.workers.primary import LIVENESS_EVERY

    time.sleep(LIVENESS_EVERY + 1)  # pinged once at least: both answer
    assert not any("liveness" in line for line in workers.stderr)
    admin_port = int(workers.admin.info.admin.rsplit(":", 1)[1])
    (stuck,) = [p for p in workers.children() if admin_port in listening(p)]  # the admin one
    (other,) = workers.children() - {stuck}
    os.kill(stuck, signal.SIGSTOP)
    wait_for(lambda: not running(stuck), LIVENESS_EVERY + 2 * 3 + 5, "the stuck worker killed")
    assert any(f"(pid {stuck}) did not answer a liveness ping: no answer in 6s" in line
               for line in workers.stderr)
    wait_for(lambda: len(workers.children()) == 2, 60, "a worker started again")
    wait_for(lambda: len({workers.get()[2] for _ in range(20)}) == 2, 60,
             "the new worker serving")
    assert running(other)


def test_stuck_workers_are_killed_together_past_the_grace_on_sigterm(tmp_path: Path) -> None:
    """Both workers stopped (SIGSTOP): the primary's SIGTERM waits `grace_seconds`
    plus `STOP_MARGIN` for all of them together, then kills them (each waited its
    own in turn: two stuck workers took twice as long)."""
    from runtime.workers.primary import STOP_MARGIN

    with serving(tmp_path, "grace_seconds = 0.5\n" + POP_TOML) as w:
        stuck = w.children()
        assert len(stuck) == 2
        for pid in stuck:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        w.proc.send_signal(signal.SIGTERM)
        w.proc.wait(120)
        took = time.monotonic() - started
    assert 0.5 + STOP_MARGIN <= took < 0.5 + STOP_MARGIN + 5, took
    assert sum("still runs after" in line for line in w.stderr) == 2


def test_a_restarted_admin_worker_brings_the_others_to_what_was_saved(
        workers: Workers, tmp_path: Path) -> None:
    """The admin worker saves a deploy's record, then tells the others: killed in
    between, it came back serving the new version while the others kept the old one
    for good. Here the record is saved by a registry of this process (as the admin
    worker would), and nobody is told."""
    import asyncio

    from runtime.bindings import Stores
    from runtime.executors.wasm.engine import WasmEngine
    from runtime.functions import deploys
    from runtime.functions.registry import Registry

    deploy(workers, tmp_path, 1)
    engine, stores = WasmEngine(tmp_path / "cache"), Stores(workers.data)
    saver = Registry(workers.data, engine, stores)
    try:
        d = function_dir(tmp_path / "r2", "f", reactor(""), extra="# rev 2")
        v2 = asyncio.run(saver.deploy(deploys.pack_dir(d))).version
    finally:
        saver.close()
        stores.close()
        engine.close()
    assert {workers.get()[1] for _ in range(20)} != {f"f@{v2}"}  # not followed yet
    admin_port = int(workers.admin.info.admin.rsplit(":", 1)[1])
    (leader,) = [p for p in workers.children() if admin_port in listening(p)]
    os.kill(leader, signal.SIGKILL)
    wait_for(lambda: len(workers.children() - {leader}) == 2, 60, "the admin worker back")
    wait_for(lambda: {workers.get()[1] for _ in range(20)} == {f"f@{v2}"}, 30,
             "every worker serving what was saved")
    assert len({workers.get()[2] for _ in range(30)}) == 2  # both workers answered


def test_a_dev_sessions_503_left_by_a_killed_pop_is_cleared_at_start(tmp_path: Path) -> None:
    """A PoP killed while `edgefn dev` deployed leaves its 503 ``starting`` in the data
    dir (for workers started again meanwhile: `runtime.workers.starting`); the next
    PoP clears it before its workers start, so a path nothing serves is a 404 on
    every one of them, and says so again when the admin API is told to."""
    from runtime.workers import starting

    (tmp_path / "data").mkdir()
    starting.save(tmp_path / "data", "edgefn dev is deploying (0 of 3 done)")
    with serving(tmp_path) as w:
        assert starting.load(w.data) is None
        assert {w.get("/nothing")[::2] for _ in range(30)} == {(404, p) for p in
                                                              map(str, w.children())}
        w.admin.request("PUT", "/v1/dev/starting", b'{"why": "deploying"}')
        assert starting.load(w.data) == "deploying"
        assert {w.get("/nothing")[0] for _ in range(10)} == {503}
        w.admin.request("PUT", "/v1/dev/starting", b'{"why": null}')
        assert starting.load(w.data) is None
        assert {w.get("/nothing")[0] for _ in range(10)} == {404}


def test_the_dev_starting_record_reads_none_when_missing_or_garbled(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from runtime.workers import starting

    assert starting.load(tmp_path) is None
    for garbled in ("", "{", "[1]", '{"why": 3}', "null"):
        (tmp_path / starting.NAME).write_text(garbled)
        assert starting.load(tmp_path) is None, garbled
    starting.save(tmp_path, "x")
    assert starting.load(tmp_path) == "x"
    assert [p.name for p in tmp_path.iterdir()] == [starting.NAME]  # no temp file left
    starting.clear(tmp_path)
    starting.clear(tmp_path)  # nothing to clear: no error
    assert not any(tmp_path.iterdir())
    with caplog.at_level(logging.WARNING, "edgefn.workers"):
        starting.save(tmp_path / "gone", "x")  # cannot be written: logged, not raised
    assert starting.load(tmp_path / "gone") is None
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "cannot record edgefn dev's 503 for workers started again"]


def test_one_admin_listener_and_both_workers_on_the_public_port(workers: Workers) -> None:
    admin_port = int(workers.admin.info.admin.rsplit(":", 1)[1])
    ports = [listening(p) for p in sorted(workers.children())]
    assert [admin_port in p for p in ports].count(True) == 1
    assert all(workers.port in p for p in ports)
    assert listening(workers.proc.pid) == set()  # the parent only holds the ports
    assert workers.admin.request("GET", "/v1/functions") == {"functions": []}


VECTORS_FN = """
from edgefn import Response


def handle(request, env):
    index = env.vectors("notes")
    body = request.json()
    op = request.query.get("op")
    if op == "put":
        return Response.json(index.upsert([{"id": body["id"], "vector": body["vector"]}]))
    if op == "delete":
        return Response.json(index.delete([body["id"]]))
    return Response.json(sorted(hit["id"] for hit in index.query(body["vector"], k=50)))
"""


def note(i: int) -> list[float]:
    return [1.0 if j == i % 16 else 0.1 * (i // 16) for j in range(16)]


def query_on(w: Workers, want: set[str], *, not_on: str = "", on: str = "") -> None:
    """Query (fresh connections) until a worker other than `not_on` (or worker `on`,
    which may still be starting) answers; every answer, from any worker, must be the
    ids `want`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, ids, served = w.post("/vec?op=query", {"vector": [1.0] * 16})
        assert status == 200 and isinstance(ids, list), (status, ids)
        assert set(ids) == want, f"worker {served}"
        if served != not_on and served == (on or served):
            return
    raise AssertionError(f"the kernel never picked {'worker ' + on if on else 'another'}")


def test_a_vector_write_in_one_worker_is_seen_by_the_other_at_once(
        workers: Workers, tmp_path: Path) -> None:
    d = python_function(tmp_path, "vec", VECTORS_FN, extra='[bindings]\nvectors = ["notes"]')
    workers.admin.deploy(d)
    stored: set[str] = set()
    for i in range(10):
        status, n, writer = workers.post("/vec?op=put", {"id": f"n{i}", "vector": note(i)})
        assert (status, n) == (200, 1)
        stored.add(f"n{i}")
        if i % 3 == 2:  # and a delete, through whichever worker
            assert workers.post("/vec?op=delete", {"id": f"n{i - 1}"})[:2] == (200, 1)
            stored.discard(f"n{i - 1}")
        query_on(workers, stored, not_on=writer)
    # a worker killed and started again loads the index and follows later writes
    before = workers.children()
    os.kill(max(before), signal.SIGKILL)
    wait_for(lambda: len(workers.children() - before) == 1, 60, "a worker started again")
    fresh = str(next(iter(workers.children() - before)))
    query_on(workers, stored, on=fresh)
    assert workers.post("/vec?op=put", {"id": "late", "vector": note(40)})[:2] == (200, 1)
    query_on(workers, stored | {"late"}, on=fresh)


def test_sigterm_drains_every_worker(workers: Workers, tmp_path: Path) -> None:
    deploy(workers, tmp_path, 1)
    pids = workers.children()
    workers.proc.send_signal(signal.SIGTERM)
    assert workers.proc.wait(60) == 0
    assert not any(running(p) for p in pids)
    assert not (workers.data / "pop.json").exists()


@pytest.mark.parametrize(("value", "said"), [
    (0, "expected `int` >= 1"), (-1, "expected `int` >= 1"),
    ("many", "invalid enum value 'many' (expected 'auto' or an integer)"),
    ("AUTO", "invalid enum value 'AUTO' (expected 'auto' or an integer)"), (2.5, "expected `int | str`, got `float`")])
def test_invalid_workers_values_name_the_key(tmp_path: Path, value: object, said: str) -> None:
    text = f"workers = {value!r}\n".replace("'", '"')
    (tmp_path / "pop.toml").write_text(text)
    with pytest.raises(InvalidConfig) as e:
        config.load(tmp_path / "pop.toml")
    assert str(e.value) == f"{tmp_path / 'pop.toml'}: field `workers`: {said}"


def test_auto_is_one_worker_a_core() -> None:
    assert config.load(None, workers="auto").worker_count() == os.cpu_count()
    assert config.load(None).worker_count() == 1


def test_workers_stop_when_the_parent_is_killed(workers: Workers) -> None:
    pids = workers.children()
    assert len(pids) == 2
    workers.proc.kill()
    workers.proc.wait(10)
    wait_for(lambda: not any(running(p) for p in pids), 30, "the workers gone")


def test_request_migration_is_turned_on_or_reported(tmp_path: Path) -> None:
    from runtime.workers.primary import migrate_requests
    knob = tmp_path / "tcp_migrate_req"
    knob.write_text("0\n")
    assert migrate_requests(knob) and knob.read_text() == "1\n"
    assert not migrate_requests(tmp_path / "absent" / "tcp_migrate_req")


def test_the_waf_blocks_in_every_worker(tmp_path: Path) -> None:
    """libmodsecurity parses its rules only after the system libstdc++: each spawned
    worker loads it before anything imports usearch (both exited at start before)."""
    with serving(tmp_path, POP_TOML + '[waf]\nmode = "block"\n') as w:
        deploy(w, tmp_path, 1)
        seen = set()
        for _ in range(40):
            conn = http.client.HTTPConnection(w.host, w.port, timeout=10)
            try:
                conn.request("GET", "/f?q=%3Cscript%3Ealert(1)%3C/script%3E")
                resp = conn.getresponse()
                resp.read()
                assert (resp.status, resp.getheader("x-edgefn-error")) == (403, "waf_blocked")
                seen.add(resp.getheader("x-edgefn-worker"))
            finally:
                conn.close()
            if len(seen) == 2:
                break
        assert len(seen) == 2, seen  # both workers answered, both blocked
        assert w.get()[0] == 200


def test_memory_rate_limits_count_across_workers(tmp_path: Path) -> None:
    """``storage = "memory://"`` with two workers: one limit of 20 a minute, not 20
    per worker (both answered 200s and 429s; before the shared table, each let 20
    through), and bots' `abusive_rate` of 45 a minute PoP-wide (the 46th request on is
    abusive, blocked: each worker saw ~30). A worker killed and started again counts
    on: its limit stays full. The table is the parent's memfd: nothing is left of it
    in /dev/shm. (A rule by function: one by ip would count bots' 403s too, and answer
    its 429 for them once full: test_ratelimit_e2e.py.)"""
    toml = POP_TOML + ('[ratelimit]\nrules = [{ by = "function", limit = "20/minute" }]\n'
                       '[bots]\nabusive_rate = "45/minute"\n')
    with serving(tmp_path, toml) as w:
        for pid in w.children():  # the parent's memfd, mapped by each
            assert "/memfd:edgefn-ratelimit" in Path(f"/proc/{pid}/maps").read_text()
        deploy(w, tmp_path, 1)
        answers = [w.get() for _ in range(60)]
        assert [a[0] for a in answers] == [200] * 20 + [429] * 25 + [403] * 15, answers
        assert {a[2] for a in answers if a[0] == 200} == {a[2] for a in answers} \
            == {str(p) for p in w.children()}  # each worker admitted some, refused some
        victim = max(w.children())
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(w.children() - {victim}) == 2, 60, "a worker started again")
        wait_for(lambda: len({w.get()[2] for _ in range(20)}) == 2, 60, "both serving")
        assert {w.get()[0] for _ in range(20)} == {403}
    assert not any(p.name.startswith("edgefn-") for p in Path("/dev/shm").glob("*"))


def test_a_function_no_worker_loads_costs_no_worker_its_life(tmp_path: Path) -> None:
    """A recorded version every worker refused at start (a stored file changed after
    its deploy) is not served, and another function's deploy does not kill the
    workers over it (each follow retried it and failed, and the admin worker killed
    the other one, deploy after deploy)."""
    g = function_dir(tmp_path / "g", "g", reactor(""))
    with serving(tmp_path) as w:
        deploy(w, tmp_path, 1)
        g_version = str(w.admin.deploy(g)["version"])
    stored = tmp_path / "data" / "versions" / "g" / g_version / "main.wat"
    stored.write_text(stored.read_text() + "\n;; changed after the deploy\n")
    with serving(tmp_path) as w:
        before = w.children()
        assert len(before) == 2
        v2 = deploy(w, tmp_path, 2)
        v3 = deploy(w, tmp_path, 3)
        assert w.children() == before  # nobody killed
        answers = [w.get() for _ in range(20)]
        assert {a[:2] for a in answers} == {(200, f"f@{v3}")} and v2 != v3
        assert {w.get("/g")[0] for _ in range(10)} == {404}  # not served by any worker
        assert not any("did not follow sync" in line for line in w.stderr), w.stderr
