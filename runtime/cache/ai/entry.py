"""What the AI caches keep: the RESULT of a model call (`Generated`, `Embedded`),
rendered anew for each request it serves, and the `Entry` around it."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.cache.ai.keys import Call


@dataclass(frozen=True, slots=True)
class Generated:
    """A chat or completion answer, with the chunks it streamed in (a streamed
    hit replays them as they came; a plain miss stores one chunk)."""

    chunks: tuple[str, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    fingerprint: str | None = None  # the system_fingerprint of the build that answered

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(len(c.encode()) for c in self.chunks)


@dataclass(frozen=True, slots=True)
class Embedded:
    embeddings: list[list[float]]
    tokens: int

    @property
    def nbytes(self) -> int:
        return 4 * sum(len(v) for v in self.embeddings)


type Result = Generated | Embedded


@dataclass(slots=True)
class Entry:
    id: str  # shown in ``x-edgefn-cache-entry``
    call: Call  # what it answered (its `query` is what a semantic hit compared)
    result: Result
    created: float  # wall-clock time it was stored
    expires: float  # on the cache's clock
    origin_ms: float  # what the model call took: the time a hit saves
    label: int | None = None  # its vector's key in its scope's index
