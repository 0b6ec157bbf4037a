"""The IPC protocol between the PoP (or any client) and the model worker.

Frames are a 4-byte big-endian length followed by one msgpack-encoded message.
Messages are tagged msgspec structs (``array_like`` so a frame carries no field
names). Every request carries an ``id`` chosen by the client; every reply names
the ``id`` it answers.

Client -> worker: Generate, Embed, Rerank, CountTokens, Cancel, Credit, Models, AddLora, RemoveLora,
GetMetrics, Ping. Worker -> client: Chunk (streamed text), Done (end of a
generation, with usage), Result (any other answer), Error.

Fairness: `Generate`, `Embed`, `Rerank` and `CountTokens` carry ``client``, an
opaque name of who asked (an API key's id, a function's owner; never a secret;
None: anonymous). The engines share the model between clients before requests:
one client's many requests do not make another's wait behind all of them. A call
the upstream engine forwards to another PoP (a generation, an embedding, a rerank or
a token count) takes its client along, signed (``signed_client``), so the PoP there
shares its model by the same clients.

Flow control: a streamed generation may run at most ``window`` chunks ahead of
what the client has consumed; the client returns ``Credit`` as it reads, and a
sequence without credit is left out of decode steps until credit arrives.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from edgefn_core.frames import Framing

MAX_FRAME = 64 * 1024 * 1024
WINDOW = 64  # chunks a stream may run ahead of its reader
DEFAULT_MAX_TOKENS = 256  # a generation's cap when its caller names none (`Generate`)
# How a generation's text carries tool calls (every engine writes them so; the API turns
# them into OpenAI's `tool_calls`): OPEN {"name": "<name>", "arguments": <JSON>} CLOSE,
# several separated by a newline.
TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"
# the same length-prefixed frames as the isolate wire (edgefn_core.frames), big-endian
FRAMING = Framing(">", MAX_FRAME)


class _Msg(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class Generate(_Msg, tag="gen"):
    id: int
    model: str
    prompt: str | None = None  # a completion
    messages: list[dict[str, Any]] | None = None  # a chat (rendered with the model's template)
    # None (the caller asked for no cap): DEFAULT_MAX_TOKENS, or what the model's context
    # leaves after the prompt when that is less (a prompt that fits is never refused for
    # a cap nobody asked for; OpenAI's default is the rest of the context)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 40  # 0: off. llama.cpp's server default; it makes sampling ~4x cheaper
    stop: list[str] = []
    seed: int | None = None
    stream: bool = True
    window: int = WINDOW
    # W3C traceparent of the request that asked (tracing on): the upstream engine forwards it
    traceparent: str | None = None
    # OpenAI's shapes, checked by the API (runtime.ai.structured); the engine constrains
    # decoding to them (llamacpp: a grammar) or passes them on (upstream)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool = True
    logprobs: int | None = None  # top alternatives per token (0: only the chosen one)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = {}
    # the asking request's x-request-id: the upstream engine forwards it, so one id
    # names the request on every tier it crosses
    request_id: str | None = None
    # the signed x-edgefn-tenant of a pinned tenant's request (runtime.security.residency):
    # the upstream engine forwards it, so the next tier enforces the pin too
    tenant: str | None = None
    # a pinned tenant's call its PoP de-sensitised to let it leave the region (the
    # tenant's keyed hash): forwarded as x-edgefn-desensitised, the mark
    desensitised: str | None = None
    # the signed query embedding of the PoP's AI cache (runtime.cache.ai.forward): the
    # upstream engine forwards it as x-edgefn-embedding, so the next tier need not embed
    embedding: str | None = None
    client: str | None = None  # who asked (see the module's docstring): fair shares
    # `client` signed for the next tier (runtime.security.residency.sign_client): the
    # upstream engine forwards it as x-edgefn-client, and a PoP there shares its model
    # by this caller, not by the PoP that forwarded the call
    signed_client: str | None = None


class Embed(_Msg, tag="embed"):
    id: int
    model: str
    inputs: list[str]
    client: str | None = None
    # as `Generate`'s: the upstream engine forwards them (x-request-id, x-edgefn-client)
    request_id: str | None = None
    signed_client: str | None = None


class Rerank(_Msg, tag="rerank"):
    id: int
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None
    client: str | None = None
    # as `Embed`'s: the upstream engine forwards them (x-request-id, x-edgefn-client)
    request_id: str | None = None
    signed_client: str | None = None


class CountTokens(_Msg, tag="count"):
    """How many tokens the model reads for an input: a completion's `prompt`, a
    chat's `messages` (rendered with the chat template, as `Generate` does) or
    texts to embed (`inputs`). Answered with a Result whose data is an int."""

    id: int
    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    inputs: list[str] | None = None
    client: str | None = None
    # as `Embed`'s: the upstream engine forwards them (x-request-id, x-edgefn-client)
    request_id: str | None = None
    signed_client: str | None = None


class Cancel(_Msg, tag="cancel"):
    id: int


class Credit(_Msg, tag="credit"):
    id: int
    n: int


class Models(_Msg, tag="models"):
    id: int


class AddLora(_Msg, tag="lora"):
    id: int
    name: str
    path: str
    base: str | None = None
    scale: float = 1.0


class RemoveLora(_Msg, tag="lora_rm"):
    """Stop serving an adapter; requests already running on it finish."""

    id: int
    name: str


class GetMetrics(_Msg, tag="metrics"):
    id: int


class Ping(_Msg, tag="ping"):
    id: int
    payload: bytes = b""


class TokenLogprob(msgspec.Struct, array_like=True, gc=False):
    """One generated token's log-probability and the `top` most likely tokens at
    its step (as (bytes, logprob), most likely first)."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]] = []


class Chunk(_Msg, tag="chunk"):
    id: int
    text: str
    tokens: int = 1
    logprobs: list[TokenLogprob] | None = None  # the tokens behind `text` (when asked)


class Done(_Msg, tag="done"):
    id: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    text: str = ""  # the whole output when the request did not stream
    logprobs: list[TokenLogprob] | None = None  # the whole output's, when it did not stream


class Result(_Msg, tag="result"):
    id: int
    data: Any = None


class Error(_Msg, tag="error"):
    """``code``: model_not_found, invalid_request, overloaded, timeout, worker_dead,
    internal. ``status`` is the HTTP status an OpenAI-style API should answer with."""

    id: int
    code: str
    message: str
    status: int = 500


Request = (Generate | Embed | Rerank | CountTokens | Cancel | Credit | Models | AddLora | RemoveLora
           | GetMetrics | Ping)
Reply = Chunk | Done | Result | Error

_encoder = msgspec.msgpack.Encoder()
request_decoder = msgspec.msgpack.Decoder(Request)
reply_decoder = msgspec.msgpack.Decoder(Reply)


def frame(msg: msgspec.Struct) -> bytes:
    """`msg` as one frame. Raises `ProtocolError` past `MAX_FRAME`."""
    return FRAMING.pack(_encoder.encode(msg))


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's body. Raises `asyncio.IncompleteReadError` at EOF and
    `ProtocolError` for an oversized length."""
    return await FRAMING.read(reader)
