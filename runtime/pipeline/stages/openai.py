"""`openai`: the OpenAI-compatible API, taken before function routes on its paths
(/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank, /v1/models)."""

from __future__ import annotations

from runtime.ai.openai_api import OpenAIApi, OpenAITarget
from runtime.net.message import Request
from runtime.pipeline.stage import Context, Next, Result

TARGET = OpenAITarget()


class OpenAI:
    name = "openai"

    def __init__(self, api: OpenAIApi) -> None:
        self.api = api
        self.paths = api.paths

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        if request.path not in self.paths:
            return call_next(request, ctx)
        ctx.target = TARGET
        return self.api(request)
