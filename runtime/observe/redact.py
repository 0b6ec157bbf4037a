"""Redaction of event fields (`[events] redact`) and a PII scrubber for the
prompts an operator chose to record (`[events] prompts`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from runtime.observe.event import Event

MASK = "[redacted]"
PROMPT_CHARS = 512  # a recorded prompt is cut to this many characters
# Order matters: a card number would also read as a phone number.
_PII = [
    ("[email]", re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")),
    ("[card]", re.compile(r"\b(?:\d[ -]?){12,18}\d\b")),
    ("[ip]", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b"
                        r"|\b[0-9a-fA-F]{1,4}:(?:[0-9a-fA-F]{0,4}:){1,6}[0-9a-fA-F]{1,4}\b")),
    ("[phone]", re.compile(r"(?<![\w])\+?\(?\d{1,4}\)?(?:[ .-]?\(?\d{2,4}\)?){2,5}(?![\w])")),
]


def scrub(text: str) -> str:
    """`text` with e-mail addresses, card numbers, IP addresses and phone numbers
    masked, cut to `PROMPT_CHARS`."""
    return scrub_pii(text[:PROMPT_CHARS])


def scrub_pii(text: str) -> str:
    """`text` whole, with e-mail addresses, card numbers, IP addresses and phone
    numbers masked (``[email]``, ``[card]``, ``[ip]``, ``[phone]``). Regular
    expressions: names, street addresses and other free-text identifiers stay."""
    for mask, pattern in _PII:
        text = pattern.sub(mask, text)
    return text


# where the stages' decisions repeat a field: (stage, key) by `Redactable` name (the
# HTTP cache's key is ``fn@version host/path?query``: a redacted query was in it)
IN_DECISIONS = {"query": [("http_cache", "key")], "path": [("http_cache", "key")],
                "host": [("http_cache", "key")],
                "tenant": [("auth", "tenant"), ("residency", "tenant"),
                           ("residency", "forwarded")],
                "key_id": [("auth", "key_id")]}


class Redactor:
    """Blanks the fields named in `[events] redact` (a name `Redactable` lists) where
    they hold something, and where the stages' decisions repeat them."""

    def __init__(self, fields: Iterable[str]) -> None:
        names = set(fields)
        self.prompt = "prompt" in names
        self.user = "user" in names  # an AI call's end user (`AIUsage.user`)
        self.changes: dict[str, Any] = {}
        for name in names - {"prompt", "user"}:
            self.changes[name] = {} if name == "decisions" else (
                None if name in ("tenant", "key_id", "subject", "agent") else MASK)
        self.in_decisions = sorted({spot for name in names if "decisions" not in names
                                    for spot in IN_DECISIONS.get(name, ())})

    def __call__(self, event: Event) -> Event:
        if self.changes:  # an empty query stays empty: "[redacted]" said there was one
            changes = {k: v for k, v in self.changes.items() if getattr(event, k)}
            if changes:
                event = msgspec.structs.replace(event, **changes)
        if self.in_decisions and event.decisions:
            event.decisions = _scrubbed(event.decisions, self.in_decisions)
        if self.prompt and event.ai is not None and event.ai.prompt is not None:
            event.ai = msgspec.structs.replace(event.ai, prompt=MASK)
        if self.user and event.ai is not None and event.ai.user is not None:
            event.ai = msgspec.structs.replace(event.ai, user=MASK)
        return event


def _scrubbed(decisions: dict[str, Any], spots: list[tuple[str, str]]) -> dict[str, Any]:
    """`decisions` with the values at `spots` masked: a copy where any is (the
    request's own record is not changed)."""
    out = decisions
    for stage, key in spots:
        record = out.get(stage)
        if isinstance(record, dict) and record.get(key) not in (None, ""):
            if out is decisions:
                out = dict(decisions)
            out[stage] = {**record, key: MASK}
    return out
