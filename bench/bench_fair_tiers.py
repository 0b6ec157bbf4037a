"""One tenant's short chat at a regional PoP's model while another tenant floods
that model through the same edge: two PoPs on loopback sharing a topology secret,
the edge's model worker forwarding chat (an ``openai`` engine) to the regional's
real llama.cpp worker (the packaged smollm2-135m, MAX_BATCH slots, a CONTEXT-token
KV cache). Each round, tenant acme starts HOGS streams of HOG_TOKENS tokens (end
tokens banned) through the edge, more than the slots; a moment later tenant
globex's short chat is timed, through the same edge, from request to answer. Also
timed alone. The regional shares its model by the client each call names; where
the edge forwards no client, both tenants' calls are one anonymous client there
and the chat queues behind the flood.

    python bench/bench_fair_tiers.py [--rounds N] [--port P]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.security.keys import KeyStore
from tests.support import Running, pop_thread

CHAT = "smollm2-135m"
CONTEXT, MAX_BATCH = 1024, 2
HOGS, HOG_TOKENS = 6, 160
SETTLE_S = 1.0  # the flood reaches the regional's queue before the chat is sent
SECRET = "0123456789abcdef0123"


def chat(pop: Running, key: str, max_tokens: int, text: str) -> float:
    """Seconds from sending a chat through `pop` to its whole answer."""
    body = {"model": CHAT, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}
    if max_tokens > 16:
        body["logit_bias"] = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>
    started = time.perf_counter()
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {
            "content-type": "application/json", "authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        out = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {out[:200]!r}")
    finally:
        conn.close()
    return time.perf_counter() - started


def flooded(edge: Running, keys: dict[str, str], i: int) -> float:
    hogs = [threading.Thread(target=chat, args=(edge, keys["acme"], HOG_TOKENS,
                                                f"Tell a long story, part {i}-{h}."))
            for h in range(HOGS)]
    for t in hogs:
        t.start()
    time.sleep(SETTLE_S)
    took = chat(edge, keys["globex"], 8, f"Name three colours ({i}).")
    for t in hogs:
        t.join()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=27220)  # and the next one
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "reg.toml").write_text(
            f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\nthreads = 1\n'
            f"max_batch = {MAX_BATCH}\ncontext = {CONTEXT}\n")
        with pop_thread(root / "reg", args.port, ai=True, ai_config=str(root / "reg.toml"),
                        name="reg", tier="regional", residency={"secret": SECRET},
                        **{"ai_cache.enabled": False}) as reg:
            (root / "edge.toml").write_text(
                f'[[models]]\nname = "reg"\nengine = "openai"\n'
                f'url = "http://{reg.host}:{reg.port}/v1"\nmodels = ["{CHAT}"]\n')
            with pop_thread(root / "edge", args.port + 1, ai=True,
                            ai_config=str(root / "edge.toml"), name="edge",
                            residency={"secret": SECRET},
                            **{"ai_cache.enabled": False}) as edge:
                store = KeyStore(edge.data)
                keys = {t: store.create(t, ("*",))[0] for t in ("acme", "globex")}
                edge.admin.request("POST", "/v1/keys/reload")
                chat(edge, keys["globex"], 8, "warm up")
                alone = [chat(edge, keys["globex"], 8, f"Name three colours ({i}).")
                         for i in range(args.rounds)]
                beside = [flooded(edge, keys, i) for i in range(args.rounds)]
    a, b = statistics.median(alone), statistics.median(beside)
    print(f"globex's chat alone: median {a * 1000:.0f} ms "
          f"({', '.join(f'{x * 1000:.0f}' for x in alone)})")
    print(f"beside acme's {HOGS} streams of {HOG_TOKENS} tokens ({MAX_BATCH} slots): median "
          f"{b * 1000:.0f} ms ({', '.join(f'{x * 1000:.0f}' for x in beside)}), "
          f"{b / a:.1f}x alone")


if __name__ == "__main__":
    main()
