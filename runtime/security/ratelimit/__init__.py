"""Rate limits on requests and token budgets for AI.

- `addresses`: a client address aggregated to its /24 (/64) network;
- `headers`: the IETF ``RateLimit-Policy`` / ``RateLimit`` header fields;
- `limiter`: request rates on the `limits` library, in memory or on Redis;
- `budget`: tokens per minute reserved at admission and settled with the real
  usage, plus concurrent-stream caps, in memory or on Redis (`redis_budget`);
- `admission`: what an AI call reserves, for whom (a key, a tenant).

The stage that applies request rates is `runtime.pipeline.stages.ratelimit`; the
OpenAI API and the ``ai`` binding apply token budgets themselves (they know the
prompt and the usage), with one `TokenBudgets` per PoP (`Stores.budgets`).
"""
