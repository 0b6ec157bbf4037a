"""pop.toml ``[events]`` (the ``events`` stage, its ring and JSONL file) and
``[health]`` (the public liveness/readiness paths). Bad values are
`InvalidConfig` naming the field (raised by `runtime.config.load`)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

MAX_EVENT_BYTES = 4096  # `[events] max_event_bytes` by default: an event, roughly

# Event fields an operator may blank out (`[events] redact`): who called and what they asked.
Redactable = Literal["query", "client", "host", "path", "tenant", "key_id", "subject", "agent",
                     "decisions", "prompt", "user"]
Path = Annotated[str, Meta(pattern=r"^(/[!-~]*)?$", max_length=256)]  # "" : off


class EventsSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """pop.toml ``[events]``.

    `sample`: the share of events the ring and the file keep (0..1); an event with
    status >= 500 is always kept. Observers added by other parts (metrics) see
    every event, sampled or not. `redact`: fields blanked before any observer
    sees them. Request bodies are never recorded; a prompt only with `prompts`,
    and then with e-mails, phone and card numbers and IP addresses masked."""

    ring_size: Annotated[int, Meta(ge=1, le=1_000_000)] = 10_000
    max_event_bytes: Annotated[int, Meta(ge=512, le=1 << 20)] = MAX_EVENT_BYTES
    # a JSONL file under DATA (e.g. "events.jsonl"), or outside it in a folder that
    # exists (runtime.config checks); None: none
    file: str | None = None
    max_bytes: Annotated[int, Meta(ge=4096, le=1 << 40)] = 64 << 20  # then rotate
    backups: Annotated[int, Meta(ge=0, le=100)] = 3  # events.jsonl.1 .. .N
    sample: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    redact: list[Redactable] = []
    prompts: bool = False  # record the prompt of an AI call (PII-scrubbed, truncated)
    # time each stage into `Event.stages_ms`: about 0.3 µs per stage and request (5 µs for
    # the default pipeline, ~6% of hello's req/s), so off unless asked for
    stage_timings: bool = False
    subscriber_queue: Annotated[int, Meta(ge=1, le=100_000)] = 1000  # per `tail` follower


class HealthSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """pop.toml ``[health]``: `live` answers 200 while the PoP runs, `ready` 200
    once functions are restored and the model worker (if any) is connected, else
    503. ``""`` turns a path off."""

    live: Path = "/healthz"
    ready: Path = "/readyz"
