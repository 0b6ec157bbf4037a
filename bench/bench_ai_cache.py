"""The AI caches through a real PoP with the packaged models (smollm2-135m chat,
all-MiniLM-L6-v2 embeddings in the real model worker).

    python bench/bench_ai_cache.py [--n 400] [--workload 300] [--tokens 16] [--seed 12]

Figures, each with its ratio to the model call measured in the same run
(a miss: the chat request answered by the model, through the PoP):
  exact hit            the same request again (one keep-alive loopback
                       connection, http.client): p50 / p99
  semantic hit         a paraphrase of a stored question, through the PoP
                       (embedding + search + render): p50 / p99
  semantic lookup      `AICache.lookup` alone on the PoP's loop (embedding by
                       the worker over its socket + usearch search + guards)
  replayed workload    hit rates and origin-load reduction (model calls
                       avoided / requests)

The workload: INTENTS (12 support/search-style questions), each with 4 ways of
asking: the canonical text, a case/whitespace/punctuation variant (an exact
hit after normalisation) and two paraphrases (semantic candidates). A request
picks an intent by Zipf-like frequency (weight 1/rank^1.1) and a phrasing
uniformly; 20 % of requests are one-off long-tail questions that never repeat
(a template x a subject, each pair used once). A hit served from an entry
stored for another intent (or for a one-off) is counted as a wrong answer
(entries are told apart by ``x-edgefn-cache-entry``). random.Random(--seed)
makes it the same every run. Every request is deterministic (temperature 0),
as the cache serves by default, and has a system prompt of its own: its own
scope, which none of the latency runs' entries can serve.
Targets: exact hit p50 <= 1 ms, semantic lookup p50 <= 15 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgefn_core.process import load_system_libstdcxx

load_system_libstdcxx()  # before usearch: onnxruntime and usearch share this process

from runtime.cache.ai.keys import chat_call  # noqa: E402
from tests.support import Running, pop_thread  # noqa: E402

CHAT = "smollm2-135m"
INTENTS = [
    ("How do I reset my password?", "how do I reset my PASSWORD", "How can I reset my password?",
     "What's the way to reset my password?"),
    ("What is the capital of Italy?", "what is the capital of italy", "Tell me the capital of "
     "Italy.", "What's the capital of Italy?"),
    ("How do I cancel my subscription?", "How do I cancel my  subscription",
     "How can I cancel my subscription?", "What is the way to cancel my subscription?"),
    ("What are your opening hours?", "what are your opening hours", "When are you open?",
     "What are your hours of opening?"),
    ("How do I change my email address?", "How do I change my EMAIL address?",
     "How can I change my email address?", "How to change my email address?"),
    ("Where is my order?", "where is my order", "Where's my order?", "Where is my order now?"),
    ("How do I get a refund?", "How do I get a REFUND?", "How can I get a refund?",
     "How to get a refund?"),
    ("What payment methods do you accept?", "what payment methods do you accept",
     "Which payment methods do you accept?", "What payment methods are accepted?"),
    ("How do I contact support?", "how do i contact support", "How can I contact support?",
     "How to contact support?"),
    ("What is an edge function?", "What is an Edge Function?", "What's an edge function?",
     "Explain what an edge function is."),
    ("How long does shipping take?", "how long does shipping take", "How long does "
     "shipping usually take?", "How long will shipping take?"),
    ("Can I change my delivery address?", "can I change my delivery address",
     "Can I update my delivery address?", "Is it possible to change my delivery address?"),
]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Client:
    """One keep-alive loopback connection to the PoP."""

    def __init__(self, pop: Running, tokens: int, system: str | None = None) -> None:
        self.conn = http.client.HTTPConnection(pop.host, pop.port, timeout=120)
        self.tokens = tokens
        self.system = [{"role": "system", "content": system}] if system else []

    def chat(self, question: str) -> tuple[float, str]:
        """(milliseconds, x-edgefn-cache)."""
        ms, outcome, _ = self.ask(question)
        return ms, outcome

    def ask(self, question: str) -> tuple[float, str, str]:
        """(milliseconds, x-edgefn-cache, x-edgefn-cache-entry)."""
        body = json.dumps({"model": CHAT, "messages": [*self.system, {"role": "user",
                                                                      "content": question}],
                           "max_tokens": self.tokens, "temperature": 0}).encode()
        started = time.perf_counter()
        self.conn.request("POST", "/v1/chat/completions", body,
                          {"content-type": "application/json"})
        resp = resp_ = self.conn.getresponse()
        resp_.read()
        ms = (time.perf_counter() - started) * 1000
        if resp.status != 200:
            raise SystemExit(f"HTTP {resp.status} for {question!r}")
        return ms, resp.getheader("x-edgefn-cache") or "", resp.getheader(
            "x-edgefn-cache-entry") or ""


def line(name: str, p50: float, p99: float, base: float, note: str = "") -> None:
    print(f"  {name:<34} p50 {p50:9.3f} ms  p99 {p99:9.3f} ms  {p50 / base:9.5f}x the model "
          f"call ({base / p50:7.1f}x faster){note}")


def latencies(c: Client, n: int) -> dict[str, list[float]]:
    c.chat("Warm up: say hi.")  # the first model call loads what the next ones reuse
    misses = [c.chat(f"Write one sentence about the number {i}.") for i in range(max(8, n // 20))]
    assert all(o == "miss" for _, o in misses), {o for _, o in misses}
    c.chat("What is the capital of Italy?")
    exact = [c.chat("What is the capital of Italy?") for _ in range(n)]
    semantic = [c.chat("Tell me the capital of Italy.") for _ in range(n)]
    for name, runs, want in (("exact", exact, "hit-exact"), ("semantic", semantic,
                                                             "hit-semantic")):
        if any(o != want for _, o in runs):
            raise SystemExit(f"{name}: expected {want}, got {sorted({o for _, o in runs})}")
    return {"miss": [ms for ms, _ in misses], "exact": [ms for ms, _ in exact],
            "semantic": [ms for ms, _ in semantic]}


def lookup_in_process(pop: Running, n: int) -> list[float]:
    """`AICache.lookup` of a paraphrase on the PoP's loop (a semantic hit each time)."""
    cache = pop.pop.stores.ai_cache
    assert cache is not None and pop.loop is not None
    call = chat_call("", CHAT, [{"role": "user", "content": "What's the way to reset my "
                                 "password?"}], {"temperature": 0, "max_tokens": 16})

    async def timed() -> list[float]:
        out = []
        for _ in range(n):
            started = time.perf_counter()
            found = await cache.lookup(call, cache.policy())
            out.append((time.perf_counter() - started) * 1000)
            assert found.outcome in ("hit-semantic", "miss"), found.outcome
            cache.abandon(found)
        return out

    return asyncio.run_coroutine_threadsafe(timed(), pop.loop).result(300)


TEMPLATES = ["Who invented {}?", "Write a haiku about {}.", "Give me a fun fact about {}.",
             "Is {} expensive?", "How heavy is {}?", "Translate '{}' into French.",
             "What colour is {}?", "Why do people like {}?"]
SUBJECTS = ["the bicycle", "a violin", "the telescope", "a glacier", "chess", "a volcano",
            "the printing press", "a penguin", "jazz", "a lighthouse", "origami", "a comet",
            "the compass", "a cactus", "tea", "a submarine", "the piano", "a hummingbird",
            "basalt", "a windmill", "the abacus", "a coral reef", "sourdough", "a tornado",
            "the zipper", "an octopus", "silk", "a canyon", "the barometer", "a firefly"]


def workload(seed: int, n: int) -> list[tuple[int, str]]:
    """(intent index, or -1 for a one-off; the question)."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(INTENTS))]
    oneoffs = [t.format(s) for t in TEMPLATES for s in SUBJECTS]
    rng.shuffle(oneoffs)
    out = []
    for _ in range(n):
        if rng.random() < 0.2 and oneoffs:
            out.append((-1, oneoffs.pop()))
        else:
            intent = rng.choices(range(len(INTENTS)), weights)[0]
            out.append((intent, rng.choice(INTENTS[intent])))
    return out


def replay(c: Client, requests: list[tuple[int, str]]) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    stored: dict[str, tuple[int, str]] = {}  # entry id -> (intent, question)
    wrong: list[tuple[str, str]] = []
    started = time.perf_counter()
    for intent, q in requests:
        _, o, entry = c.ask(q)
        outcomes[o] = outcomes.get(o, 0) + 1
        if o == "miss" and entry:
            stored[entry] = (intent, q)
        elif o.startswith("hit") and (intent == -1 or stored[entry][0] != intent):
            wrong.append((q, stored[entry][1]))
    return {"outcomes": outcomes, "wrong": wrong, "seconds": time.perf_counter() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=400, help="timed hits of each kind")
    ap.add_argument("--workload", type=int, default=300, help="requests replayed")
    ap.add_argument("--tokens", type=int, default=16, help="max_tokens of each chat")
    ap.add_argument("--seed", type=int, default=12)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, pop_thread(Path(tmp) / "data", ai=True) as pop:
        c = Client(pop, args.tokens)
        lat = latencies(c, args.n)
        inproc = lookup_in_process(pop, args.n)
        base = pct(lat["miss"], 0.5)
        print(f"AI cache through a real PoP ({CHAT}, max_tokens={args.tokens}, temperature 0)")
        line("model call (miss, the baseline)", base, pct(lat["miss"], 0.99), base)
        line("exact hit", pct(lat["exact"], 0.5), pct(lat["exact"], 0.99), base,
             f"  target p50 <= 1 ms: {'ok' if pct(lat['exact'], 0.5) <= 1 else 'MISSED'}")
        line("semantic hit (through the PoP)", pct(lat["semantic"], 0.5),
             pct(lat["semantic"], 0.99), base)
        line("semantic lookup (in process)", pct(inproc, 0.5), pct(inproc, 0.99), base,
             f"  target p50 <= 15 ms: {'ok' if pct(inproc, 0.5) <= 15 else 'MISSED'}")
        reqs = workload(args.seed, args.workload)
        # its own scope (a system prompt): none of the entries above can serve it
        out = replay(Client(pop, args.tokens, "You are a support agent."), reqs)
        o, total = out["outcomes"], len(reqs)
        model_calls = o.get("miss", 0) + o.get("bypass", 0)
        print(f"replayed workload: {total} requests, {len(INTENTS)} intents x 4 phrasings, "
              f"Zipf 1.1, 20% one-off, seed {args.seed} ({out['seconds']:.1f} s)")
        for name in ("hit-exact", "hit-semantic", "miss", "bypass"):
            print(f"  {name:<13} {o.get(name, 0):5d}  {o.get(name, 0) / total:6.1%}")
        served = total - model_calls
        print(f"  hit rate {served / total:.1%}; origin-load reduction (model calls "
              f"avoided / requests) {served / total:.1%}: {model_calls} model "
              f"calls for {total} requests (ratio {model_calls / total:.3f})")
        wrong = out["wrong"]
        print(f"  wrong answers (served from another intent's entry): {len(wrong)} of {served} "
              f"hits ({len(wrong) / max(served, 1):.1%})")
        for q, cached in wrong[:5]:
            print(f"    {q!r} <- {cached!r}")


if __name__ == "__main__":
    main()
