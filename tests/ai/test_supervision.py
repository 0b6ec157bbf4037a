"""The model worker's supervision, seen from outside a real PoP over HTTP: the
worker process is SIGKILLed under real requests and must be restarted with
backoff, with its run-time LoRA adapters, while clients get OpenAI-shaped 503s.
Each test runs its own PoP and worker, since each kills it."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import gpu_worker.client
from gpu_worker.adapters import write_random_lora
from gpu_worker.client import WorkerClient
from gpu_worker.models import packaged_model
from tests.support import Running, pop_thread, wait_for

CHAT = "smollm2-135m"
STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]
FIRST_BACKOFF = 0.5  # gpu_worker.client._supervise: 0.5 s, doubling


@pytest.fixture
def ai_pop(tmp_path: Path) -> Iterator[Running]:
    # no AI cache: identical requests must each reach the worker (not wait for one another)
    with pop_thread(tmp_path / "data", ai=True, **{"ai_cache.enabled": False}) as running:
        yield running


@pytest.fixture
def api(ai_pop: Running) -> Iterator[openai.OpenAI]:
    with ai_pop.openai(timeout=30) as c:
        yield c


def worker(pop: Running) -> WorkerClient:
    assert pop.pop.ai is not None
    return pop.pop.ai.client


def metrics(pop: Running) -> dict[str, Any]:
    return pop.admin.request("GET", "/v1/ai/metrics")


def idle(pop: Running) -> bool:
    """No sequence running or waiting in the worker."""
    m = metrics(pop)
    return m["running_batch"] == 0 and m["queue_depth"] == 0


def post(pop: Running, path: str, body: dict[str, Any], timeout: float = 30
         ) -> tuple[int, Any]:
    status, _, data = pop.request("POST", path, json.dumps(body).encode(),
                                  {"content-type": "application/json"}, timeout=timeout)
    return status, json.loads(data)


def kill_worker(pop: Running) -> int:
    pid = worker(pop).pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_worker_fails_requests_in_flight_with_503_and_is_restarted(
        ai_pop: Running, api: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    # a restart takes the first backoff plus a model load (~1 s); 15 s is ample
    monkeypatch.setattr(gpu_worker.client, "READY_WAIT", 15.0)
    stream = iter(api.chat.completions.create(model=CHAT, messages=STORY,  # type: ignore[arg-type]
                                              max_tokens=2000, temperature=0, stream=True))
    next(stream)  # the stream is under way
    box: dict[str, Any] = {}
    plain = threading.Thread(target=lambda: box.update(answer=post(
        ai_pop, "/v1/chat/completions", {"model": CHAT, "messages": STORY,
                                         "max_tokens": 2000, "temperature": 0})))
    plain.start()
    wait_for(lambda: metrics(ai_pop)["running_batch"] >= 2, 30, "both requests running")
    old = kill_worker(ai_pop)

    plain.join(30)
    status, body = box["answer"]
    assert status == 503, body
    err = body["error"]
    assert (err["type"], err["code"], err["param"]) == ("server_error", "worker_unavailable",
                                                        None)
    assert "exited while serving this request" in err["message"]
    with pytest.raises(openai.APIError) as e:  # the stream's SSE error event
        for _ in stream:
            pass
    assert not isinstance(e.value, openai.APIConnectionError)  # an event, not a cut
    assert e.value.code == "worker_unavailable" and e.value.type == "server_error"

    again = api.chat.completions.create(model=CHAT, messages=STORY,  # type: ignore[arg-type]
                                        max_tokens=3, temperature=0)
    assert again.choices[0].message.content  # served by a new worker process
    assert worker(ai_pop).pid not in (None, old) and worker(ai_pop).restarts == 1


def test_a_worker_that_stops_answering_is_killed_and_restarted(
        ai_pop: Running, api: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped (SIGSTOP) or wedged worker was never noticed: /readyz said ready and
    every model call waited its 120 s, until someone sent SIGCONT."""
    monkeypatch.setattr(gpu_worker.client, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(gpu_worker.client, "HUNG_S", 2.0)
    monkeypatch.setattr(gpu_worker.client, "READY_WAIT", 15.0)
    old = worker(ai_pop).pid
    assert old is not None
    time.sleep(1)  # pings answered meanwhile: a live worker is left alone
    assert worker(ai_pop).pid == old
    os.kill(old, signal.SIGSTOP)
    try:
        wait_for(lambda: worker(ai_pop).pid not in (None, old), 15, "the hung worker replaced")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old, signal.SIGCONT)
    again = api.chat.completions.create(model=CHAT, messages=STORY,  # type: ignore[arg-type]
                                        max_tokens=3, temperature=0)
    assert again.choices[0].message.content and worker(ai_pop).restarts == 1


def test_while_the_worker_stays_down_requests_get_503_and_restarts_back_off(
        ai_pop: Running, api: openai.OpenAI, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every restart fails (the worker command becomes a process that records when
    it started and exits): a request waits for the restart under way, not READY_WAIT,
    and gets 503 once it fails; later ones get it at once; the gaps between attempts
    double."""
    ready_wait = 20.0
    monkeypatch.setattr(gpu_worker.client, "READY_WAIT", ready_wait)
    starts = tmp_path / "starts"
    sh = shutil.which("sh")
    assert sh is not None
    client = worker(ai_pop)
    client.command = [sh, "-c", f"date +%s.%N >> {shlex.quote(str(starts))}; exit 3"]
    killed_at = time.time()
    kill_worker(ai_pop)
    wait_for(lambda: client.restarts >= 1, 10, "the PoP noticed the worker died")

    began = time.monotonic()
    status, headers, data = ai_pop.request(
        "POST", "/v1/chat/completions", json.dumps({"model": CHAT, "messages": STORY,
                                                    "max_tokens": 3}).encode(),
        {"content-type": "application/json"}, timeout=30)
    waited, body = time.monotonic() - began, json.loads(data)
    assert status == 503, body
    assert (body["error"]["type"], body["error"]["code"]) == ("server_error",
                                                              "worker_unavailable")
    assert headers["connection"] == "close"  # a retry opens a new connection
    assert "its last start failed (exit status 3)" in body["error"]["message"]
    assert starts.exists()  # answered after the restart under way had failed
    assert waited < ready_wait / 2  # and not after READY_WAIT
    tried = len(starts.read_text().split())
    with pytest.raises(openai.InternalServerError) as e:  # at once: before the next try
        api.models.list()
    assert (e.value.status_code, e.value.code) == (503, "worker_unavailable")
    assert len(starts.read_text().split()) == tried

    wait_for(lambda: len(starts.read_text().split()) >= 3, 15, "three restart attempts")
    times = [float(t) for t in starts.read_text().split()]
    gaps = [b - a for a, b in zip([killed_at, *times], times, strict=False)]
    # each attempt waits at least its backoff (0.5, 1, 2 s) after the previous one ended
    for i, gap in enumerate(gaps[:3]):
        assert gap >= FIRST_BACKOFF * 2**i * 0.95, (i, gaps)
    assert client.restarts >= 3


def test_a_worker_that_ran_for_a_while_restarts_after_the_first_backoff_again(
        ai_pop: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backoff doubles only while the worker keeps dying young: one that ran
    longer than STABLE_AFTER before it exited is restarted after FIRST_BACKOFF."""
    monkeypatch.setattr(gpu_worker.client, "STABLE_AFTER", 1.0)
    starts = tmp_path / "starts"
    sh = shutil.which("sh")
    assert sh is not None
    client = worker(ai_pop)
    runs = 1.5  # each worker lives this long, past STABLE_AFTER, then exits
    client.command = [sh, "-c", f"date +%s.%N >> {shlex.quote(str(starts))}; sleep {runs}; "
                                "exit 3"]
    kill_worker(ai_pop)
    wait_for(lambda: starts.exists() and len(starts.read_text().split()) >= 4, 20,
             "four restart attempts")
    times = [float(t) for t in starts.read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # without the reset the gaps would be runs + 1, 2, 4 s
    for gap in gaps[:3]:
        assert runs + FIRST_BACKOFF * 0.95 <= gap < runs + FIRST_BACKOFF + 0.4, gaps


def test_run_time_loras_are_registered_again_after_a_restart(
        ai_pop: Running, api: openai.OpenAI, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_worker.client, "READY_WAIT", 15.0)
    path = tmp_path / "adapter.gguf"
    write_random_lora(packaged_model(), path, rank=4, seed=5, std=0.1)
    for name in ("kept", "dropped"):
        info = ai_pop.admin.request("POST", "/v1/ai/loras",
                                    json.dumps({"name": name, "path": str(path)}).encode())
        assert info["parent"] == CHAT
    ai_pop.admin.request("DELETE", "/v1/ai/loras/dropped")
    for name in ("gone", "gone2"):  # registered, then its file removed: it cannot load again
        gone = tmp_path / f"{name}.gguf"
        shutil.copy(path, gone)
        ai_pop.admin.request("POST", "/v1/ai/loras", json.dumps({"name": name,
                                                                "path": str(gone)}).encode())
        gone.unlink()
    old = kill_worker(ai_pop)
    wait_for(lambda: worker(ai_pop).restarts >= 1, 10, "the PoP noticed the worker died")

    listed = {m.id: m for m in api.models.list()}  # waits for the new worker
    assert worker(ai_pop).pid not in (None, old)
    assert listed["kept"].model_extra["parent"] == CHAT  # type: ignore[index]
    assert "dropped" not in listed
    r = api.chat.completions.create(model="kept", messages=STORY,  # type: ignore[arg-type]
                                    max_tokens=3, temperature=0)
    assert r.model == "kept" and r.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="dropped", messages=STORY,  # type: ignore[arg-type]
                                    max_tokens=3)
    # those that no longer load are unlisted; one can be removed (it stayed registered,
    # to come back once its file was there again), one added again under its name, once
    assert "gone" not in listed and "gone2" not in listed
    ai_pop.admin.request("DELETE", "/v1/ai/loras/gone")
    ai_pop.admin.request("POST", "/v1/ai/loras", json.dumps({"name": "gone2",
                                                            "path": str(path)}).encode())
    kept = json.loads((ai_pop.data / "ai" / "loras.json").read_text())
    assert [(lo["name"], lo["path"]) for lo in kept] == [("kept", str(path)), ("gone2", str(path))]


def test_a_client_that_disconnects_mid_stream_cancels_its_sequence(ai_pop: Running) -> None:
    body = json.dumps({"model": CHAT, "messages": STORY, "max_tokens": 2000,
                       "temperature": 0, "stream": True}).encode()
    before = metrics(ai_pop)["tokens_total"]
    conn = socket.create_connection((ai_pop.host, ai_pop.port), timeout=30)
    try:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while received.count(b"data: ") < 3:  # the role chunk and two pieces of text
            data = conn.recv(65536)
            assert data, received
            received += data
        assert received.startswith(b"HTTP/1.1 200")
        assert metrics(ai_pop)["running_batch"] == 1  # its sequence holds a slot
    finally:
        conn.close()

    # it ends at the next decode step; a sequence left running would take far longer
    wait_for(lambda: idle(ai_pop), 10, "the disconnected stream's sequence freed")
    generated = metrics(ai_pop)["tokens_total"] - before
    time.sleep(0.3)
    assert metrics(ai_pop)["tokens_total"] - before == generated < 2000


LONG_ANSWER = """
from edgefn import Response

STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]


def handle(request, env):
    ai = env.ai()
    if request.query.get("stream") == "0":
        return Response.json(ai.chat(STORY, model="smollm2-135m", max_tokens=2000,
                                     temperature=0))
    if request.query.get("quick"):
        return Response("quick")
    return Response(ai.chat(STORY, model="smollm2-135m", stream=True, max_tokens=2000,
                            temperature=0))
"""


@pytest.mark.parametrize("stream", [True, False])
def test_a_functions_model_call_stops_when_its_client_goes_away(
        ai_pop: Running, tmp_path: Path, stream: bool) -> None:
    """The model generated on to max_tokens (minutes on a CPU) for a client that had
    left, holding a batch slot, its reservation and the isolate: the guest dropped
    the CANCEL while it waited on the call, and nothing on the PoP stopped the call
    or closed the stream."""
    d = tmp_path / "teller"
    d.mkdir()
    (d / "main.py").write_text(LONG_ANSWER)
    (d / "edgefn.toml").write_text('name = "teller"\nruntime = "python"\nentry = "main.py"\n'
                                   'routes = ["/teller"]\n[limits]\nwall_ms = 120000\n'
                                   '[bindings]\nai = true\n[pool]\nmin = 1\nmax = 1\n'
                                   'standby = false\n')
    ai_pop.deploy(d)
    before = metrics(ai_pop)["tokens_total"]
    conn = socket.create_connection((ai_pop.host, ai_pop.port), timeout=30)
    try:
        path = b"/teller" if stream else b"/teller?stream=0"
        conn.sendall(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path)
        if stream:
            received = b""
            while len(received.split(b"\r\n\r\n", 1)[-1]) < 20:  # the head, some text
                data = conn.recv(65536)
                assert data, received
                received += data
        else:
            wait_for(lambda: metrics(ai_pop)["running_batch"] == 1, 30, "the call generating")
    finally:
        conn.close()

    wait_for(lambda: idle(ai_pop), 10, "the abandoned call's sequence freed")
    generated = metrics(ai_pop)["tokens_total"] - before
    assert generated < 2000
    started = time.monotonic()
    assert ai_pop.get("/teller?quick=1", timeout=10)[2] == b"quick"  # its only isolate: free
    assert time.monotonic() - started < 5



def test_a_wasm_reactors_model_calls_stop_when_its_client_goes_away(
        ai_pop: Running, tmp_path: Path) -> None:
    """Its thread waited on the model call and made the next one, for a client that had
    left, until its wall limit (minutes: `wall_ms` goes to 300 s)."""
    from tests.support import function_dir, reactor

    args = json.dumps({"model": CHAT, "messages": STORY, "max_tokens": 400, "temperature": 0})
    escaped = args.replace("\\", "\\\\").replace('"', '\\"')
    looping = reactor(f"""(loop $again
        (drop (call $call (i32.const 300) (i32.const 7) (i32.const 400) (i32.const {len(args)})
                          (i32.const 4096) (i32.const 16)))
        (br $again))""",
                      imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 '
                              'i32) (result i64)))',
                      prelude=f'(data (i32.const 300) "ai.chat") (data (i32.const 400) "{escaped}")')
    ai_pop.deploy(function_dir(tmp_path, "chatter", looping, extra="[bindings]\nai = true",
                               limits="cpu_ms = 60000\nwall_ms = 60000"))
    conn = socket.create_connection((ai_pop.host, ai_pop.port), timeout=30)
    try:
        conn.sendall(b"GET /chatter HTTP/1.1\r\nhost: x\r\n\r\n")
        wait_for(lambda: metrics(ai_pop)["running_batch"] == 1, 30, "its model call running")
    finally:
        conn.close()

    wait_for(lambda: idle(ai_pop), 10, "the abandoned reactor's model call stopped")
    before = metrics(ai_pop)["tokens_total"]
    time.sleep(1.5)  # no next call either
    assert metrics(ai_pop)["tokens_total"] == before



def test_a_model_call_from_a_thread_ends_with_its_request(ai_pop: Running,
                                                          tmp_path: Path) -> None:
    """A thread that outlived its request (the reaper stops it) left its model call
    generating for 120 s, holding a batch slot."""
    d = tmp_path / "spawner"
    d.mkdir()
    (d / "main.py").write_text("""
import threading
import time
from edgefn import Response

STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse."}]


def handle(request, env):
    ai = env.ai()
    def later():
        ai.chat(STORY, model="smollm2-135m", max_tokens=3000, temperature=0)
    threading.Thread(target=later).start()
    time.sleep(float(request.query.get("hold", "0")))
    return Response("started")
""")
    (d / "edgefn.toml").write_text('name = "spawner"\nruntime = "python"\nentry = "main.py"\n'
                                   'routes = ["/spawner"]\n[bindings]\nai = true\n'
                                   '[pool]\nstandby = false\n')
    ai_pop.deploy(d)

    assert ai_pop.get("/spawner?hold=1", timeout=30)[2] == b"started"  # its call under way
    wait_for(lambda: idle(ai_pop), 10, "the thread's model call stopped")
    before = metrics(ai_pop)["tokens_total"]
    time.sleep(1.0)
    assert metrics(ai_pop)["tokens_total"] == before
