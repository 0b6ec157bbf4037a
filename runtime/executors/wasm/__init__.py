"""WASM functions on wasmtime: engine and compile cache, reactor and WASI executors,
host imports, the C-API bindings and the native fast path (native_src/)."""
