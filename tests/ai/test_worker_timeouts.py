"""504 `timeout` from the OpenAI API when the model worker hangs: the PoP is
pointed (`ai.socket`) at a real Unix socket server that accepts, reads the
worker protocol and never answers (or answers a stream's first chunk, then goes
silent). The client's timeouts are made small in this process only."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import gpu_worker.client
from gpu_worker import protocol as p
from tests.support import Running, pop_thread

CHAT = "smollm2-135m"
HELLO = [{"role": "user", "content": "Say hello."}]
TIMEOUT = 0.5  # IDLE_TIMEOUT and CALL_TIMEOUT for these tests


class HungWorker:
    """Accepts connections and decodes every request frame into `received`;
    answers nothing, except (with `first_chunk`) one chunk of a stream."""

    def __init__(self, path: Path, first_chunk: bool = False) -> None:
        self.first_chunk = first_chunk
        self.received: list[Any] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn.makefile("rb") as f:
            while head := f.read(4):
                msg = p.request_decoder.decode(f.read(struct.unpack(">I", head)[0]))
                self.received.append(msg)
                if self.first_chunk and isinstance(msg, p.Generate) and msg.stream:
                    conn.sendall(p.frame(p.Chunk(msg.id, "Hel")))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close does not)
        self.listener.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        for t in self.threads:
            t.join(5)

    def cancelled(self) -> set[int]:
        return {m.id for m in self.received if isinstance(m, p.Cancel)}

    def generations(self) -> list[p.Generate]:
        return [m for m in self.received if isinstance(m, p.Generate)]


@contextlib.contextmanager
def pop_on_hung_worker(tmp_path: Path, first_chunk: bool = False
                       ) -> Iterator[tuple[Running, HungWorker]]:
    hung = HungWorker(tmp_path / "hung.sock", first_chunk)
    try:
        with pop_thread(tmp_path / "data", ai=True,
                        **{"ai.socket": str(tmp_path / "hung.sock")}) as pop:
            yield pop, hung
    finally:
        hung.close()


@pytest.fixture(autouse=True)
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_worker.client, "IDLE_TIMEOUT", TIMEOUT)
    monkeypatch.setattr(gpu_worker.client, "CALL_TIMEOUT", TIMEOUT)


def was_cancelled(hung: HungWorker, rid: int, within: float = 10.0) -> bool:
    """Whether the worker got a Cancel for `rid` within `within` seconds: the
    client sends it after failing the request, so it may arrive a moment later."""
    deadline = time.monotonic() + within
    while rid not in hung.cancelled() and time.monotonic() < deadline:
        time.sleep(0.01)
    return rid in hung.cancelled()


def timed_post(pop: Running, path: str, body: dict[str, Any]) -> tuple[int, Any, float]:
    began = time.monotonic()
    status, _, data = pop.request("POST", path, json.dumps(body).encode(),
                                  {"content-type": "application/json"}, timeout=30)
    return status, json.loads(data), time.monotonic() - began


def assert_timeout(status: int, body: Any, waited: float) -> None:
    assert status == 504, body
    err = body["error"]
    assert (err["type"], err["code"], err["param"]) == ("server_error", "timeout", None)
    assert waited >= TIMEOUT * 0.9  # the timeout fired, not something quicker


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_the_worker_never_answers_is_504_and_cancelled(tmp_path: Path,
                                                                    stream: bool) -> None:
    with pop_on_hung_worker(tmp_path) as (pop, hung):
        status, body, waited = timed_post(pop, "/v1/chat/completions", {
            "model": CHAT, "messages": HELLO, "max_tokens": 4, "stream": stream})
        assert_timeout(status, body, waited)  # a stream too: before its status line
        assert "no output from the model" in body["error"]["message"]
        [gen] = hung.generations()
        assert was_cancelled(hung, gen.id)  # the worker is told to stop it


def test_a_call_the_worker_never_answers_is_504(tmp_path: Path) -> None:
    with pop_on_hung_worker(tmp_path) as (pop, _hung):
        began = time.monotonic()
        status, _, data = pop.request("GET", "/v1/models", timeout=30)
        assert_timeout(status, json.loads(data), time.monotonic() - began)
        status, body, waited = timed_post(pop, "/v1/embeddings",
                                          {"model": "all-minilm-l6-v2", "input": "x"})
        assert_timeout(status, body, waited)
        assert "did not answer" in body["error"]["message"]


def test_a_stream_that_goes_silent_ends_with_a_timeout_error_event(tmp_path: Path) -> None:
    with pop_on_hung_worker(tmp_path, first_chunk=True) as (pop, hung):
        api = pop.openai(timeout=30)
        try:
            stream = api.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                                 max_tokens=4, stream=True)
            text = []
            with pytest.raises(openai.APIError) as e:
                for chunk in stream:
                    text.append(chunk.choices[0].delta.content or "")
        finally:
            api.close()
        assert "".join(text) == "Hel"  # what came before the silence
        assert not isinstance(e.value, openai.APIConnectionError)  # an event, not a cut
        assert (e.value.code, e.value.type) == ("timeout", "server_error")
        [gen] = hung.generations()
        assert was_cancelled(hung, gen.id)


def test_a_pop_pointed_at_a_socket_nothing_serves_listens_at_once_and_waits_in_readyz(
        tmp_path: Path) -> None:
    """``[ai] socket`` with nothing listening yet: the PoP serves its functions
    after a short wait (it held its start for START_TIMEOUT, 120 s), /readyz says
    it waits for the model worker, and once a worker listens there it connects."""
    import runtime.app

    path = tmp_path / "later.sock"
    began = time.monotonic()
    with pop_thread(tmp_path / "data", ai=True, **{"ai.socket": str(path)}) as pop:
        started = time.monotonic() - began
        assert started < runtime.app.EXTERNAL_WAIT + 10, started
        status, _, body = pop.request("GET", "/readyz")
        assert (status, json.loads(body)["waiting_for"]) == (503, ["model_worker"])
        hung = HungWorker(path)
        try:
            deadline = time.monotonic() + 10
            while pop.request("GET", "/readyz")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pop.request("GET", "/readyz")[0] == 200
        finally:
            hung.close()
