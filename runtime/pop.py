"""The PoP: everything one `PopConfig` describes, built in one place.

    config ─┬─ stores (KV, vectors)        bound to functions through bindings
            ├─ ai (model worker service)   when [ai] is enabled
            ├─ registry (deployed functions, router)
            └─ pipeline (the stages, in config order): the public listener's app

Nothing is patched in after construction; `runtime.app` starts and stops it.
"""

from __future__ import annotations

from runtime.ai.service import AIService
from runtime.bindings import Stores
from runtime.config import PopConfig
from runtime.executors.base import WasmEngine
from runtime.functions.registry import Registry
from runtime.pipeline import build


class PoP:
    def __init__(self, config: PopConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.ai: AIService | None = None
        if config.ai.enabled:
            self.ai = AIService(self.data_dir, config.ai.worker_config, config.ai.socket)
        self.stores = Stores(self.data_dir, self.ai, build.token_budgets(config))
        self.wasm = WasmEngine(self.data_dir / "cache")
        self.registry = Registry(self.data_dir, self.wasm, self.stores,
                                 build.reserved_paths(config), config.insecure_python)
        self.pipeline = build.build(self)

    def close(self) -> None:
        """Release functions and stores (the model worker is closed by `runtime.app`)."""
        self.registry.close()
        self.wasm.close()
        self.stores.close()
