"""The PoP's caches: `http` (an RFC 9111 cache of function responses, the
``http_cache`` stage) and `ai` (the exact and semantic caches of model calls,
used by the OpenAI API and the ``ai`` binding). `stats` counts what both decide,
for ``edgefn cache stats``."""
