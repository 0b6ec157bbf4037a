"""`openai`: the OpenAI-compatible API, taken before function routes on its paths
(/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank, /v1/models)."""

from __future__ import annotations

from runtime.ai.openai_api import OpenAIApi, OpenAITarget
from runtime.net.message import Request
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.targets import Targets


class OpenAI:
    name = "openai"

    def __init__(self, api: OpenAIApi, targets: Targets) -> None:
        self.api = api
        self.targets = targets

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        if not isinstance(self.targets.resolve(request, ctx), OpenAITarget):
            return call_next(request, ctx)
        return self.api(request, ctx)
