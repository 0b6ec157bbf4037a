"""`Event`: the one structured record of a request (schema version `V`; README
"Events" documents it). Built by the ``events`` stage from the request, the
response and what the stages recorded in the `Context` (``ctx.decisions``,
timings, principal), then handed to every `Observer`.

Fields never hold a credential: an API key appears as its id, a JWT as its subject.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

V = 1  # bump when a field changes meaning or goes away (adding one does not)


class AIUsage(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    """A model call made for the request (the OpenAI API's; the ``ai`` binding's
    calls are counted per call by the metrics, not per request)."""

    operation: str  # "chat" | "text_completion" | "embeddings" | "rerank"
    model: str
    adapter: str | None = None  # a LoRA adapter's base model, when `model` is one
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # served from the AI cache
    ttft_ms: float | None = None  # time to first token (streams and completions)
    tokens_per_s: float | None = None
    finish_reason: str | None = None
    stream: bool = False
    temperature: float | None = None  # as asked (generation calls)
    max_tokens: int | None = None  # as asked, when the request set a limit
    prompt: str | None = None  # only with `[events] prompts = true`, PII-scrubbed, truncated
    user: str | None = None  # the request's `user` (or `safety_identifier`): blank with redact


# gc=False: a ring holds thousands of events; they never form reference cycles, so the
# collector need not track them (their `decisions` dicts are tracked on their own).
class Event(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    v: int = V
    ts: float  # when the request arrived, Unix seconds
    rid: str  # request id (x-request-id)
    pop: str
    tier: str
    geo: str = ""
    client: str  # the client's address (no port)
    bot: str | None = None
    agent: str | None = None
    tenant: str | None = None
    key_id: str | None = None
    subject: str | None = None
    method: str
    host: str
    path: str
    query: str = ""  # the query string, without "?"
    status: int
    target: str | None = None  # "hello@1a2b3c4d", "openai", None when nothing served it
    owner: str | None = None  # the tenant that owns the function that served it
    route: str | None = None
    decisions: dict[str, Any] = {}  # stage -> its record (`Context.decide`)
    stages_ms: dict[str, float] = {}  # stage -> ms, when the chain is timed
    bytes_in: int = 0
    bytes_out: int = 0
    duration_ms: float = 0.0
    error: str | None = None  # x-edgefn-error / the OpenAI error code
    ai: AIUsage | None = None
    sampled: bool = True  # False: metrics-only, the ring and the file skip it (`[events] sample`)


class Observer(Protocol):
    """Gets every event, on the PoP's event loop thread: must not block."""

    def observe(self, event: Event) -> None: ...
