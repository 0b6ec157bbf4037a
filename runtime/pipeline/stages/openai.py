"""`openai`: the OpenAI-compatible API, taken before function routes on its paths
(/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/rerank, /v1/models,
/v1/models/{id}), and the OpenAI-shaped answer for any other ``/v1/`` path no
function serves: a 404, or, on a PoP without a model worker, a 404 saying the
API is off."""

from __future__ import annotations

from runtime.ai.openai_api import OpenAIApi, OpenAITarget
from runtime.ai.openai_errors import api_off
from runtime.net.message import Request
from runtime.pipeline.stage import Context, Next, Result, Target
from runtime.pipeline.targets import Targets


class OpenAI:
    name = "openai"

    def __init__(self, api: OpenAIApi | None, targets: Targets) -> None:
        """`api` None: the PoP runs no model worker."""
        self.api = api
        self.targets = targets

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        not the OpenAI API's."""
        return not isinstance(target, OpenAITarget)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        """Raises `ApiError` (404 ``api_disabled``) without an `api`."""
        if not isinstance(self.targets.resolve(request, ctx), OpenAITarget):
            return call_next(request, ctx)
        if self.api is None:
            raise api_off(request.method.decode(), request.path.decode("latin-1"))
        return self.api(request, ctx)
