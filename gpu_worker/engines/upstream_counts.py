"""The upstream engine's rerank and token-count calls: what it sends and how it reads
the answers.

- Rerank: ``POST /rerank`` in the Jina/Cohere shape vLLM and an edgefn PoP serve
  (``{"model", "query", "documents", "top_n"}`` -> ``{"results": [{"index",
  "relevance_score"}], "usage": {"total_tokens"}}``), every document asked for, so
  the worker orders and cuts them as it does a local model's.
- Token counts: vLLM's ``POST /tokenize`` (``{"model", "prompt"}`` or ``{"model",
  "messages"}`` -> ``{"count", ...}``), which an edgefn PoP serves as
  ``/v1/tokenize`` and also takes texts to embed (``{"model", "input"}``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from edgefn_core.errors import EngineError

from ..protocol import CountTokens

# answers that say an upstream has no such endpoint (FastAPI's 404 {"detail": "Not
# Found"}, an edgefn PoP's 404 unknown_url, a 405), as opposed to a model it lacks
UNSERVED = frozenset({404, 405, 501})


class _Ranked(msgspec.Struct):
    index: int
    relevance_score: float


class _Total(msgspec.Struct):
    total_tokens: int = 0


class _Reranked(msgspec.Struct):
    results: list[_Ranked]
    usage: _Total | None = None


class _Counted(msgspec.Struct):
    count: int


def rerank_body(model: str, query: str, documents: list[str]) -> bytes:
    return msgspec.json.encode({"model": model, "query": query, "documents": documents,
                                "top_n": len(documents), "return_documents": False})


def scores(answer: bytes, documents: int) -> tuple[list[float], int]:
    """One score per document, in the documents' order, and the tokens the upstream
    read. Raises `EngineError` (upstream_error, 502) for an answer of another shape,
    or one that does not score each document once."""
    try:
        ranked = msgspec.json.decode(answer, type=_Reranked)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise EngineError("upstream_error", 502, f"upstream rerank answer: {e}") from None
    by_index = {r.index: r.relevance_score for r in ranked.results}
    if len(ranked.results) != documents or sorted(by_index) != list(range(documents)):
        raise EngineError("upstream_error", 502, f"upstream ranked {len(ranked.results)} "
                          f"results for {documents} documents")
    return [by_index[i] for i in range(documents)], \
        ranked.usage.total_tokens if ranked.usage else 0


def tokenize_body(req: CountTokens) -> bytes:
    """The ``/tokenize`` body for `req`'s one input. Raises `EngineError`
    (invalid_request, 400) unless exactly one of prompt, messages and inputs is set."""
    given: dict[str, Any] = {name: value for name, value in (
        ("prompt", req.prompt), ("messages", req.messages), ("input", req.inputs))
        if value is not None}
    if len(given) != 1:
        raise EngineError("invalid_request", 400, "a token count takes exactly one of "
                          "'prompt', 'messages' and 'inputs'")
    return msgspec.json.encode({"model": req.model, **given})


def count(answer: bytes) -> int:
    """The ``count`` of a ``/tokenize`` answer. Raises `EngineError` (upstream_error)."""
    try:
        return msgspec.json.decode(answer, type=_Counted).count
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise EngineError("upstream_error", 502, f"upstream tokenize answer: {e}") from None


def unserved(status: int, body: bytes) -> bool:
    """Whether an error answer says the upstream serves no such endpoint, rather
    than no such model (a 404 whose body names ``model_not_found``)."""
    if status not in UNSERVED:
        return False
    try:
        err = msgspec.json.decode(body).get("error")
    except (msgspec.DecodeError, AttributeError):
        return True
    return not (isinstance(err, dict) and err.get("code") == "model_not_found")
