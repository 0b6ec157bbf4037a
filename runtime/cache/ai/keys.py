"""What identifies a model call to the AI caches: its exact key, its semantic
scope and its query text (`Call`).

- exact key: blake2b of the kind, tenant, model (a LoRA adapter is its own model
  id), every message (role kept, text through `text.exact`: the whitespace around
  it and canonically equivalent forms only, never a character that may change the
  answer) or the prompt,
  and every sampling parameter that changes the output, with the worker's
  defaults filled in (so leaving out ``top_k`` and sending 40 are one key).
  Embeddings hash their inputs as sent: their output depends on every byte.
- semantic scope: the same without the query (chat: the last user message;
  completion: the prompt), i.e. tenant x model x system prompt x the earlier
  turns of a conversation x sampling. A conversation is served a semantic hit
  only after the very same earlier turns; only its last user message may be a
  paraphrase. Its query is that message through `guards.normalize`, and its
  `formula` (`text.formula`) the numbers and operators a hit must share.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.cache.ai.guards import normalize
from runtime.cache.ai.text import exact, formula

# the worker's defaults (gpu_worker.protocol.Generate): a parameter left out means these
DEFAULTS: dict[str, Any] = {"max_tokens": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 40,
                            "stop": [], "seed": None}
SAMPLING = tuple(DEFAULTS)


@dataclass(frozen=True, slots=True)
class Call:
    kind: str  # "chat" | "completion" | "embedding"
    tenant: str  # "" for an anonymous caller
    model: str
    key: bytes  # the exact key
    scope: bytes | None  # the semantic scope; None: no semantic lookup (embeddings)
    query: str  # the normalized text that is embedded ("" without a scope)
    deterministic: bool  # temperature 0 or a fixed seed (embeddings always)
    bucket: bytes  # where its entry counts against max_entries_per_scope: its scope,
    # or (without one) its kind x tenant x model
    formula: str = ""  # the query's numbers and operators (`text.formula`)
    said: str = ""  # the query as the caller wrote it: the guards read names by their case
    # (on two normalized queries the entity guard found no names at all)



def sampling(params: dict[str, Any]) -> list[Any]:
    """The output-relevant sampling parameters of `params`, defaults filled in,
    in a fixed order. Raises `TypeError`/`ValueError` for values of the wrong kind."""
    out = []
    for name, default in DEFAULTS.items():
        value = params.get(name)
        if value is None:
            value = default
        if name == "stop":
            value = [value] if isinstance(value, str) else [str(s) for s in value]
        elif name in ("temperature", "top_p"):
            value = float(value)
        elif value is not None:
            value = int(value)
        out.append(value)
    return out


def _deterministic(sampled: list[Any]) -> bool:
    temperature, seed = sampled[SAMPLING.index("temperature")], sampled[SAMPLING.index("seed")]
    return temperature == 0 or seed is not None


# a chat whose messages take more JSON than this is keyed on its bytes as sent (an
# exact hit still serves it) and never read for meaning: the normalizing and the
# semantic key's formula are Python loops over every character (0.5 s a MiB, on the
# PoP's loop: one 15 MiB message froze every tenant's requests for 8-14 s)
MAX_READ_BYTES = 256 << 10
# a last message longer than this is not looked up by meaning: the embedding model
# reads its first 256 tokens only, and takes at most 32 KiB characters
MAX_SEMANTIC_CHARS = 16 << 10


def _hash(*parts: Any) -> bytes:
    return hashlib.blake2b(msgspec.json.encode(parts), digest_size=20).digest()


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts,
    joined as the llama.cpp engine reads them (`content_text`: with nothing between)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if _is_text(p))
    return "" if content is None else str(content)


def _exact_text(content: Any) -> Any:
    """What the exact key holds of a message's text: a string's, or each text part's
    apart (an upstream engine gets the parts as sent: ["cat", "fish"] is neither
    "cat\nfish" nor "catfish", which shared a key with it and got its answer)."""
    if isinstance(content, list):
        return [exact(str(p.get("text", ""))) for p in content if _is_text(p)]
    return exact(text_of(content))


def _is_text(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type", "text") == "text"


def _message(m: dict[str, Any]) -> list[Any]:
    """[role, text (`exact`), the other fields (name, tool calls...) as sent]. The
    parts of a content list that are not text (an image, audio, a file) are
    among the other fields, as sent: two prompts that differ only there differ."""
    rest = sorted((k, v) for k, v in m.items() if k not in ("role", "content"))
    content = m.get("content")
    if isinstance(content, list):
        parts = [p for p in content if not _is_text(p)]
        if parts:
            rest.append(("content parts", parts))
    return [str(m.get("role", "")), _exact_text(m.get("content")), rest]


def chat_call(tenant: str | None, model: str, messages: list[dict[str, Any]],
              params: dict[str, Any]) -> Call:
    """Raises `TypeError`/`ValueError`/`AttributeError` for malformed messages or
    parameters."""
    tenant = tenant or ""
    s = sampling(params)
    raw = msgspec.json.encode(messages)  # TypeError for what no JSON holds
    if len(raw) > MAX_READ_BYTES:  # keyed as sent, in C: no normalizing it on the loop
        return Call("chat", tenant, model, _hash("chat-raw", tenant, model,
                                                 hashlib.blake2b(raw).digest().hex(), s),
                    None, "", _deterministic(s), _hash("chat-bucket", tenant, model))
    msgs = [_message(m) for m in messages]
    key = _hash("chat", tenant, model, msgs, s)
    scope, query, shape = None, "", ""
    last = text_of(messages[-1].get("content")) if msgs and msgs[-1][0] == "user" else ""
    if len(last) <= MAX_SEMANTIC_CHARS and (query := normalize(last)):
        system = [m for m in msgs[:-1] if m[0] in ("system", "developer")]
        turns = [m for m in msgs[:-1] if m[0] not in ("system", "developer")]
        scope = _hash("chat-scope", tenant, model, system, turns, msgs[-1][2], s)
        shape = formula(last)
    return Call("chat", tenant, model, key, scope, query, _deterministic(s),
                scope or _hash("chat-bucket", tenant, model), shape, last if scope else "")


def completion_call(tenant: str | None, model: str, prompt: str, params: dict[str, Any]) -> Call:
    """A raw completion continues its prompt byte for byte: keyed on the prompt as
    sent (a trailing space, newline or "." changes what comes next), and never
    looked up by meaning (a paraphrase's continuation is the wrong text: "violets
    are" and "violets are blue," went on alike)."""
    tenant = tenant or ""
    s = sampling(params)
    return Call("completion", tenant, model, _hash("completion", tenant, model, prompt, s),
                None, "", _deterministic(s), _hash("completion-bucket", tenant, model))


def embedding_call(tenant: str | None, model: str, inputs: list[str]) -> Call:
    tenant = tenant or ""
    return Call("embedding", tenant, model, _hash("embedding", tenant, model, inputs), None, "",
                True, _hash("embedding-bucket", tenant, model))
