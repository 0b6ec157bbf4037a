"""The registry fixtures of tests/test_registry.py (a `Registry` on real wasmtime and a
fresh data dir), shared here rather than written twice."""

from tests.test_registry import registry, wasm  # noqa: F401
