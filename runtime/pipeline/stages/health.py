"""`health`: liveness and readiness on the public listener, answered before every
other stage (so probes make no event, no metric and no access-log line).

    GET /healthz   200 {"status": "ok"} while the PoP runs        ([health] live)
    GET /readyz    200 {"status": "ready"} once deployed functions are restored and
                   the model worker (if the PoP runs one) is connected; else 503
                   {"status": "not_ready", "waiting_for": ["functions", "model_worker"]}
    GET /health    the OpenAI API's (vLLM's): 200 {} when the worker is connected,
                   else 503 -- only where the OpenAI API is served
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime import config as c
from runtime.net.message import Request, Response, json_response
from runtime.pipeline.stage import Context, Next, Result

if TYPE_CHECKING:
    from runtime.pop import PoP

OPENAI_HEALTH = b"/health"
_LIVE = b'{"status":"ok"}\n'
_JSON = (b"content-type", b"application/json")


def paths(config: c.PopConfig) -> set[bytes]:
    """The paths this stage answers under `config` (reserved from function routes)."""
    found = {p.encode() for p in (config.health.live, config.health.ready) if p}
    if config.ai.enabled and any(isinstance(s, c.OpenAIStage) for s in config.pipeline):
        found.add(OPENAI_HEALTH)
    return found


class Health:
    name = "health"

    def __init__(self, live: str, ready: str, waiting_for: Callable[[], list[str]],
                 worker_ready: Callable[[], bool] | None = None) -> None:
        """`live`/`ready`: the paths ("" for none); `waiting_for()`: what is not ready
        yet (empty when ready); `worker_ready`: the OpenAI API's ``/health``, None
        where it is not served."""
        self.live = live.encode() or None
        self.ready = ready.encode() or None
        self.waiting_for = waiting_for
        self.worker_ready = worker_ready

    @classmethod
    def for_pop(cls, pop: PoP) -> Health:
        openai = OPENAI_HEALTH in paths(pop.config)
        ai = pop.ai
        worker = (lambda: ai.client.connected.is_set()) if openai and ai is not None else None
        return cls(pop.config.health.live, pop.config.health.ready, pop.waiting_for, worker)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        path = request.path
        if path == self.live:
            return Response(200, [_JSON], _LIVE)
        if path == self.ready:
            waiting = self.waiting_for()
            if waiting:
                return json_response({"status": "not_ready", "waiting_for": waiting}, 503)
            return json_response({"status": "ready"})
        if path == OPENAI_HEALTH and self.worker_ready is not None:
            if self.worker_ready():
                return json_response({})
            return json_response({"error": {"message": "the model worker is not ready",
                                            "type": "server_error", "param": None,
                                            "code": "worker_not_ready"}}, 503)
        return call_next(request, ctx)
