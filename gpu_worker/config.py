"""Worker configuration: which engines serve which models, read from a TOML file.

    socket = "/path/worker.sock"        # default: DATA/gpu_worker.sock

    [[models]]
    name = "smollm2-135m"               # the id requests use as ``model``
    engine = "llamacpp"                 # llamacpp | onnx | openai
    path = "auto"                       # auto: the model shipped in a PyPI package
    threads = 2
    max_batch = 16                      # sequences decoded together
    context = 8192                      # KV cache tokens shared by the batch
    max_queue_seconds = 60              # a request that waits longer for a batch slot gets
                                        # 503 "overloaded" (retry later); 0: wait to the timeout
    prefill_chunk = 128                 # prompt tokens a decode call feeds while other
                                        # sequences wait on it for a token (alone: 512)
    gpu_layers = -1                     # layers offloaded when a GPU is present
    weights = "f16"                     # as-is | f16 | q8_0 | q4_0 | f32: converted once, cached;
                                        # f16 batches far better on CPU than 4-bit Q4_1

    [[models]]
    name = "all-minilm-l6-v2"
    engine = "onnx"                     # embeddings; rerank by cosine similarity

    [[models]]
    name = "upstream"
    engine = "openai"
    url = "http://127.0.0.1:8000/v1"    # any OpenAI-compatible server
    models = ["served-model"]           # ids forwarded there (default: ask /v1/models)
    api_key_env = "UPSTREAM_API_KEY"

    [[loras]]
    name = "pirate"                     # served as model "pirate"
    path = "adapters/pirate.gguf"       # relative to the config file
    base = "smollm2-135m"
    scale = 1.0
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from edgefn_core import tomlconf
from edgefn_core.errors import WorkerConfigError

from .engines.batching import STEP_TOKENS
from .models import WEIGHTS

DEFAULT_CHAT = "smollm2-135m"
DEFAULT_EMBED = "all-minilm-l6-v2"
ENGINES = ("llamacpp", "onnx", "openai")


class ModelSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    engine: str
    path: str = "auto"
    threads: int = 2
    max_batch: int = 16
    context: int = 8192
    max_queue_seconds: float = 60.0  # llamacpp: longest wait for a batch slot (0: no bound)
    prefill_chunk: int = 128  # llamacpp: prompt tokens a call feeds beside a sampled token
    gpu_layers: int = -1
    weights: str = "f16"  # llamacpp: as-is | f16 | q8_0 | q4_0 | f32 (converted once, cached)
    url: str = ""
    models: list[str] = []
    api_key_env: str = ""
    timeout: float = 60.0


class LoraSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    name: str
    path: str
    base: str = DEFAULT_CHAT
    scale: float = 1.0


class WorkerConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    socket: str = ""
    models: list[ModelSpec] = msgspec.field(default_factory=lambda: default_models())
    loras: list[LoraSpec] = []


def default_models() -> list[ModelSpec]:
    return [ModelSpec(DEFAULT_CHAT, "llamacpp"), ModelSpec(DEFAULT_EMBED, "onnx")]


def load(path: str | Path | None) -> WorkerConfig:
    """The config in `path`, or the defaults when `path` is None.

    Paths starting with ``~`` are expanded; relative LoRA paths are resolved against
    the file's folder. Raises `WorkerConfigError`
    naming the field, also for a model or adapter file that does not exist (see `check`).
    """
    if path is None:
        return WorkerConfig()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise WorkerConfigError(str(p), f"cannot read: {e.strerror}") from None
    cfg = tomlconf.decode(raw, WorkerConfig, str(p), WorkerConfigError)
    names = [m.name for m in cfg.models] + [lo.name for lo in cfg.loras]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise WorkerConfigError(str(p), f"model names must be unique; repeated: "
                                f"{', '.join(dupes)}", "models")
    for m in cfg.models:  # `~` as the engines will open it (it passed the check,
        if m.path != "auto":  # and the engine found no such file: restarted forever)
            m.path = str(Path(m.path).expanduser())
    for lo in cfg.loras:
        lo.path = str(Path(lo.path).expanduser())
        if not Path(lo.path).is_absolute():
            lo.path = str((p.parent / lo.path).resolve())
    check(cfg, str(p))
    return cfg


def check(cfg: WorkerConfig, label: str) -> None:
    """What the schema cannot say: engines, weights, threads, and that the files named
    (other than ``path = "auto"``) exist. Checked before the worker starts: a worker
    whose start fails on them is restarted forever. Raises `WorkerConfigError`."""
    for i, m in enumerate(cfg.models):
        problem = _problem(m)
        if problem is not None:
            raise WorkerConfigError(label, problem[1], f"models[{i}].{problem[0]}")
    for i, lo in enumerate(cfg.loras):
        if not Path(lo.path).is_file():
            raise WorkerConfigError(label, f"LoRA adapter file {lo.path} does not exist",
                                    f"loras[{i}].path")


def _problem(m: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) for a model entry that cannot start, or None."""
    if m.engine not in ENGINES:
        return "engine", (f"unknown engine {m.engine!r} for model {m.name!r} (expected "
                          "llamacpp, onnx or openai)")
    if m.engine == "openai":
        return None if m.url else ("url", f"engine \"openai\" of model {m.name!r} needs the "
                                   "url of an OpenAI-compatible server")
    if m.threads < 1:
        return "threads", f"must be >= 1, got {m.threads}"
    if not 1 <= m.prefill_chunk <= STEP_TOKENS:
        return "prefill_chunk", (f"must be 1..{STEP_TOKENS} (a decode call's tokens), "
                                 f"got {m.prefill_chunk}")
    if not m.max_queue_seconds >= 0:  # NaN too
        return "max_queue_seconds", f"must be >= 0 (0: no bound), got {m.max_queue_seconds}"
    if m.engine == "llamacpp" and m.weights not in WEIGHTS:
        return "weights", f"weights must be one of {', '.join(WEIGHTS)}, got {m.weights!r}"
    found = Path(m.path)  # onnx: a model.onnx or the folder holding it
    if m.path != "auto" and not (found.is_file() or (m.engine == "onnx" and found.is_dir())):
        return "path", f"model file {m.path} does not exist"
    return None
