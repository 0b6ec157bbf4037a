"""The request's traceparent goes on: through the model worker's IPC into the
upstream engine's HTTP call. Two real PoPs, the second's worker forwarding to
the first's OpenAI API, both exporting to one real OTLP receiver: one trace,
client → PoP 2 → PoP 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpu_worker.protocol import Generate
from runtime.observe.traceparent import parse
from tests.gpu_worker.test_upstream_engine import FakeUpstream, RecordingSink, chat, engine_for
from tests.observe.tracing.receiver import otlp_receiver
from tests.support import pop_thread, python_function

CHAT = "smollm2-135m"
SERVER = 2


def test_the_upstream_engine_forwards_the_traceparent_it_is_given() -> None:
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["echo"])
            await engine.start()
            for rid, req in ((1, chat(1, "echo", "hi", traceparent=header)),
                             (2, chat(2, "echo", "hi"))):
                assert isinstance(req, Generate)
                sink = RecordingSink()
                engine.generate(req, sink)
                assert (await sink.result())[0] == "done", rid
            traced, plain = up.requests[-2][2], up.requests[-1][2]
            assert traced["traceparent"] == header and "traceparent" not in plain
            engine.close()

    asyncio.run(scenario())


ASKS_THE_MODEL = """
from edgefn import Response

def handle(request, env):
    out = env.ai("%s").chat([{"role": "user", "content": "Say hello"}], max_tokens=4,
                            temperature=0)
    return Response(out["text"])
"""


@pytest.mark.parametrize("through", ["openai", "binding"])
def test_one_trace_from_the_client_through_two_pops(tmp_path: Path, through: str) -> None:
    """The second PoP asks the first for the model: through its OpenAI API, or from a
    function's `ai` binding; either way the first PoP's span is the child of the
    second's request span."""
    trace_id, caller = "6bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    tracing = {"tracing.enabled": True, "ai_cache.enabled": False}
    with otlp_receiver() as receiver, pop_thread(
            tmp_path / "first", ai=True, name="first", **tracing,
            **{"tracing.endpoint": receiver.url}) as first:
        worker = tmp_path / "worker.toml"
        worker.write_text(f'[[models]]\nname = "first-pop"\nengine = "openai"\n'
                          f'url = "http://{first.host}:{first.port}/v1"\nmodels = ["{CHAT}"]\n')
        with pop_thread(tmp_path / "second", ai=True, ai_config=str(worker), name="second",
                        **tracing, **{"tracing.endpoint": receiver.url}) as second:
            body = {"model": CHAT, "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "Say hello"}]}
            path = "/v1/chat/completions"
            if through == "binding":
                second.deploy(python_function(tmp_path, "asks", ASKS_THE_MODEL % CHAT,
                                              limits="wall_ms = 30000",
                                              extra="[bindings]\nai = true"))
                path = "/asks"
            status, headers, out = second.request(
                "POST", path, json.dumps(body).encode(),
                {"content-type": "application/json",
                 "traceparent": f"00-{trace_id}-{caller}-01"}, timeout=60)
            assert status == 200, out
            back = parse(headers["traceparent"].encode())
            assert back is not None and back.trace_id == trace_id
            tracers = [p.pop.tracer for p in (first, second)]

            def flush() -> None:
                for t in tracers:
                    assert t is not None
                    t.flush()
            spans = receiver.wait(lambda s: len([x for x in s if x["trace_id"] == trace_id
                                                 and x["kind"] == SERVER]) == 2, flush)
    servers = {s["resource"]["service.name"]: s for s in spans
               if s["trace_id"] == trace_id and s["kind"] == SERVER}
    assert servers["second"]["parent_id"] == caller
    assert servers["second"]["span_id"] == back.span_id
    assert servers["first"]["parent_id"] == servers["second"]["span_id"]
