"""`Grammars`: each distinct set of ``response_format`` and tools turned into a
grammar (and parsed by llama.cpp) once, not once a request.

Building a grammar runs llama-cpp-python's converter on the worker's event loop
(0.01-0.4 s for schemas within `schema_limits`), and llama.cpp parses it again to
check it; an application sends the same schema with every request, so the
worker's loop (every stream's tokens, every ping) paid that each time. The cache
is keyed by a hash of the fields `constrain.grammar_for` reads, and keeps the
refusals (400s) too.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from edgefn_core.errors import EngineError

from ..protocol import Generate
from .constrain import grammar_for

SIZE = 64  # distinct schema sets kept (each grammar at most 256 KiB: `schema_limits`)

type _Refusal = tuple[str, int, str]  # an EngineError's code, status and message


class Grammars:
    """The grammars of the last `size` distinct schema sets; call on one thread."""

    def __init__(self, check: Callable[[str], None], size: int = SIZE) -> None:
        """`check(grammar)` raises `EngineError` where llama.cpp cannot parse it."""
        self.check = check
        self.size = size
        self._kept: OrderedDict[bytes, str | _Refusal | None] = OrderedDict()

    def for_request(self, req: Generate) -> str | None:
        """`req`'s grammar (None for free text), checked. Raises `EngineError` as
        `grammar_for` and `check` do (a 400 again, from the cache, for the same
        schemas)."""
        key = _key(req)
        if key is not None and key in self._kept:
            self._kept.move_to_end(key)
            kept = self._kept[key]
            if isinstance(kept, tuple):
                raise EngineError(*kept)
            return kept
        try:
            grammar = grammar_for(req)
            if grammar is not None:
                self.check(grammar)
        except EngineError as e:
            if key is not None and e.status < 500:
                self._keep(key, (e.code, e.status, str(e)))
            raise
        if key is not None:
            self._keep(key, grammar)
        return grammar

    def _keep(self, key: bytes, value: str | _Refusal | None) -> None:
        self._kept[key] = value
        if len(self._kept) > self.size:
            self._kept.popitem(last=False)


def _key(req: Generate) -> bytes | None:
    """A hash of what `grammar_for` reads of `req`; None where it cannot be encoded."""
    if req.response_format is None and not req.tools:
        return None  # free text: nothing to build
    try:
        raw = msgspec.json.encode([req.response_format, req.tools, req.tool_choice,
                                   req.parallel_tool_calls])
    except (TypeError, ValueError, OverflowError):
        return None
    return hashlib.blake2b(raw, digest_size=16).digest()
