"""AI fields of events and readiness with a real model worker (the packaged
chat model): what a completion and a stream did, and /readyz and /health
flipping to 503 while the worker is down."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.observe.event import Event
from tests.support import Running, pop_thread, wait_for

CHAT = "smollm2-135m"


@pytest.fixture
def ai_pop(tmp_path: Path) -> Iterator[Running]:
    with pop_thread(tmp_path / "data", ai=True, **{"ai_cache.enabled": False}) as running:
        yield running


def event_of(pop: Running, rid: str) -> Event:
    found: list[Event] = []

    def seen() -> bool:
        found[:] = [e for e in pop.pop.ring.events.copy() if e.rid == rid]
        return bool(found)
    wait_for(seen, 10, f"the event of {rid}")
    assert len(found) == 1
    return found[0]


def chat(pop: Running, stream: bool) -> tuple[str, bytes]:
    rid = f"ai-{uuid.uuid4().hex[:12]}"
    body = {"model": CHAT, "max_tokens": 8, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Say hello to ann@example.com"}]}
    status, _, data = pop.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                                  {"content-type": "application/json", "x-request-id": rid},
                                  timeout=60)
    assert status == 200
    return rid, data


def test_a_completion_and_a_stream_record_model_tokens_ttft_and_finish(ai_pop: Running
                                                                       ) -> None:
    rid, data = chat(ai_pop, stream=False)
    usage = json.loads(data)["usage"]
    ai = event_of(ai_pop, rid).ai
    assert ai is not None and (ai.operation, ai.model, ai.stream) == ("chat", CHAT, False)
    assert (ai.prompt_tokens, ai.completion_tokens) == (usage["prompt_tokens"],
                                                        usage["completion_tokens"])
    assert ai.finish_reason in ("stop", "length") and ai.prompt is None
    e = event_of(ai_pop, rid)
    assert ai.ttft_ms is not None and 0 < ai.ttft_ms <= e.duration_ms
    assert ai.tokens_per_s is None  # the reply came whole: no inter-token rate (was ~175k/s)

    rid, data = chat(ai_pop, stream=True)
    assert data.endswith(b"data: [DONE]\n\n")
    e = event_of(ai_pop, rid)
    assert e.ai is not None and e.ai.stream and e.ai.finish_reason in ("stop", "length")
    assert 1 <= e.ai.completion_tokens <= 8 and e.bytes_out == len(data)
    assert e.ai.ttft_ms is not None and 0 < e.ai.ttft_ms <= e.duration_ms
    # a 135M model on a CPU: tens to a few hundred tokens a second
    assert e.ai.completion_tokens <= 1 or 1 < (e.ai.tokens_per_s or 0) < 2000


def test_readyz_and_health_are_503_while_the_worker_is_down(ai_pop: Running) -> None:
    assert ai_pop.get("/readyz")[0] == 200 and ai_pop.get("/health")[0] == 200
    assert ai_pop.pop.ai is not None
    pid = ai_pop.pop.ai.client.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: ai_pop.get("/readyz")[0] == 503, 10, "/readyz says not ready")
    status, _, body = ai_pop.get("/readyz")
    assert status == 503 and json.loads(body)["waiting_for"] == ["model_worker"]
    assert ai_pop.get("/health")[0] == 503  # the worker takes seconds to load its models
    wait_for(lambda: ai_pop.get("/readyz")[0] == 200, 120, "ready again after the restart")
    assert ai_pop.get("/health")[0] == 200


def test_a_client_that_leaves_before_the_answer_still_makes_an_event(ai_pop: Running) -> None:
    """A non-streamed chat whose client hangs up mid-generation: status 499, the
    generation cancelled (it left no event and no access-log line before)."""
    import socket
    import time

    rid = f"gone-{uuid.uuid4().hex[:12]}"
    body = json.dumps({"model": CHAT, "max_tokens": 200, "temperature": 0, "messages": [
        {"role": "user", "content": "Write a long story about a dragon."}]}).encode()
    with socket.create_connection((ai_pop.host, ai_pop.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                  b"application/json\r\nx-request-id: " + rid.encode() +
                  b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.3)
    e = event_of(ai_pop, rid)
    assert (e.status, e.bytes_out) == (499, 0)
    assert e.ai is not None and e.ai.finish_reason == "cancelled"
    assert e.ai.completion_tokens < 200
