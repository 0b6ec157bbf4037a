"""What the OpenAI API's field policy and value checks cost per request, in
process (no sockets, no model): a chat body as LangChain's ChatOpenAI sends it
(a system prompt, three turns, five sampling fields) decoded

  baseline   as before them: one typed decode (`msgspec.json.decode(..., ChatBody)`)
  checked    as now: `check_fields` (a decode of the top-level keys, each field's
             policy) + the typed decode + `check_messages` + `check_sampling`

    python bench/bench_openai_fields.py [--n 20000] [--rounds 5]

Rounds alternate; each figure is the median of the rounds' per-request means,
with the ratio of checked to baseline. A model call is milliseconds: target
checked - baseline <= 20 us.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import msgspec

from runtime.ai.openai_api import ChatBody
from runtime.ai.openai_checks import check_messages, check_sampling
from runtime.ai.openai_fields import check_fields

BODY = json.dumps({
    "model": "smollm2-135m", "temperature": 0.7, "top_p": 0.9, "max_completion_tokens": 64,
    "stream": False, "n": 1, "user": "u-42",
    "messages": [{"role": "system", "content": "You are a terse assistant."},
                 {"role": "user", "content": "What is an edge PoP?"},
                 {"role": "assistant", "content": "A point of presence near users."},
                 {"role": "user", "content": "And why run models there?"}]}).encode()


def baseline() -> None:
    msgspec.json.decode(BODY, type=ChatBody)


def checked() -> None:
    check_fields(BODY, ChatBody)
    b = msgspec.json.decode(BODY, type=ChatBody)
    check_messages(b.messages)
    check_sampling(b.n, b.temperature, b.top_p, b.max_completion_tokens,
                   "max_completion_tokens", 0)


def per_call_us(fn: object, n: int) -> float:
    assert callable(fn)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    base: list[float] = []
    full: list[float] = []
    for _ in range(args.rounds):
        base.append(per_call_us(baseline, args.n))
        full.append(per_call_us(checked, args.n))
    b, c = statistics.median(base), statistics.median(full)
    print(f"baseline (typed decode)          {b:7.2f} us")
    print(f"checked (policy + decode + checks) {c:5.2f} us  ratio {c / b:.2f}x  "
          f"added {c - b:.2f} us")


if __name__ == "__main__":
    main()
