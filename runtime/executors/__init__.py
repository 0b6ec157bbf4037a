"""Executors run a deployed function's code for one request: `wasm/` on wasmtime,
`python/` in pre-warmed subinterpreters; `base` holds their one interface.

Kept free of imports: the isolate-host processes import `runtime.executors.python`
and must not load the PoP's dependencies.
"""
