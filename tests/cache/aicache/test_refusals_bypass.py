"""A request the OpenAI API refuses is never answered from the AI cache, even
when the call it would be keyed as (model, messages, sampling) is stored: the
caller gets the API's own 400, marked ``x-edgefn-cache: bypass``.

A field the PoP does not implement (``functions``, OpenAI's deprecated tool
calling) or does not know at all is not part of the cache key, so without the refusal check such a request would be an
exact hit; and an embeddings request naming ``dimensions`` asks for a size the
stored vectors may not have (the API checks it against the model's), so it is
never a hit either.

After the stage stands `API`: the test's `Model` stand-in behind the API's real
field check (`check_fields`) and its error rendering (`OpenAITarget`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from edgefn_core.errors import ApiError
from runtime.ai.openai_api import ChatBody, EmbeddingsBody, OpenAITarget
from runtime.ai.openai_fields import check_fields
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from tests.cache.aicache.test_stage import Model, chat_body, headers, request, serve, stage

EMBED = "all-minilm-l6-v2"
SIZE = 2  # the stand-in's embeddings are [0.5, 0.25]
FUNCTIONS = [{"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}]


class API(Model):
    """`Model`, refusing what the OpenAI API refuses: a field it does not implement
    or know (400 naming it), and embeddings of another size than the model's."""

    def __call__(self, request: Request, ctx: Context) -> Any:
        embeddings = request.path == b"/v1/embeddings"
        try:
            check_fields(request.body, EmbeddingsBody if embeddings else ChatBody)
            dimensions = json.loads(request.body).get("dimensions")
            if embeddings and dimensions is not None and dimensions != SIZE:
                raise ApiError("invalid_request", 400, f"makes embeddings of {SIZE} dimensions "
                               "and cannot shorten them", "dimensions")
        except ApiError as e:
            self.bodies.append(json.loads(request.body))
            return OpenAITarget().error_response(e)
        return super().__call__(request, ctx)


def error(body: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(body)["error"]
    return out


def test_a_refused_field_is_the_apis_400_not_a_hit() -> None:
    s, api = stage(), API()

    async def main() -> list[tuple[Response, bytes, Context]]:
        return [await serve(s, request(b), api) for b in (
            chat_body(), chat_body(), chat_body(functions=FUNCTIONS), chat_body(colour="blue"))]

    (miss, _, _), (hit, _, _), (refused, rbody, rctx), (unknown, ubody, uctx) = \
        asyncio.run(main())
    assert headers(miss)[b"x-edgefn-cache"] == b"miss"
    assert headers(hit)[b"x-edgefn-cache"] == b"hit-exact"  # the call is stored
    assert (refused.status, headers(refused)[b"x-edgefn-cache"]) == (400, b"bypass")
    assert error(rbody)["param"] == "functions"
    assert (unknown.status, headers(unknown)[b"x-edgefn-cache"]) == (400, b"bypass")
    assert error(ubody)["param"] == "colour"
    for ctx in (rctx, uctx):
        assert ctx.decisions == {"ai_cache": {"outcome": "bypass", "reason": "uncacheable"}}
    assert len(api.bodies) == 3  # both refusals reached the API


def test_an_inert_value_of_such_a_field_is_still_a_hit() -> None:
    """The counterpart: ``"functions": []`` asks for nothing; the API takes it."""
    s, api = stage(), API()

    async def main() -> list[tuple[Response, bytes, Context]]:
        return [await serve(s, request(b), api) for b in (chat_body(), chat_body(functions=[]))]

    _, (hit, _, _) = asyncio.run(main())
    assert hit.status == 200 and headers(hit)[b"x-edgefn-cache"] == b"hit-exact"


def test_embeddings_asking_for_dimensions_are_not_served_from_the_cache() -> None:
    s, api = stage(), API()
    plain = json.dumps({"model": EMBED, "input": "hi"}).encode()
    sized = json.dumps({"model": EMBED, "input": "hi", "dimensions": 8}).encode()

    async def main() -> list[tuple[Response, bytes, Context]]:
        return [await serve(s, request(b, b"/v1/embeddings"), api)
                for b in (plain, plain, sized)]

    (miss, _, _), (hit, _, _), (r, body, ctx) = asyncio.run(main())
    assert headers(miss)[b"x-edgefn-cache"] == b"miss"
    assert headers(hit)[b"x-edgefn-cache"] == b"hit-exact"
    assert (r.status, headers(r)[b"x-edgefn-cache"]) == (400, b"bypass")
    assert error(body)["param"] == "dimensions"
    assert ctx.decisions == {"ai_cache": {"outcome": "bypass", "reason": "uncacheable"}}
    assert len(api.bodies) == 2
