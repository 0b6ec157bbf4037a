"""Worker config files: defaults, and clear errors for bad ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgefn_core.errors import WorkerConfigError
from gpu_worker import config


def test_defaults_serve_the_packaged_models() -> None:
    cfg = config.load(None)
    assert [(m.name, m.engine) for m in cfg.models] == [
        ("smollm2-135m", "llamacpp"), ("all-minilm-l6-v2", "onnx")]


def test_lora_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    f = tmp_path / "w.toml"
    f.write_text('[[loras]]\nname = "a"\npath = "adapters/a.gguf"\n')
    (tmp_path / "adapters").mkdir()
    (tmp_path / "adapters" / "a.gguf").write_bytes(b"")
    cfg = config.load(f)
    assert cfg.loras[0].path == str(tmp_path / "adapters" / "a.gguf")
    assert cfg.models == config.default_models()


@pytest.mark.parametrize(("text", "message"), [
    ("[[models]\n", "not valid TOML"),
    ('[[models]]\nname = "x"\n', "missing required field `engine`"),
    ('[[models]]\nname = "x"\nengine = "llamacpp"\nthreads = "two"\n', "field `models[0].threads`"),
    ('[[models]]\nname = "x"\nengine = "onnx"\ncolour = 1\n', "unknown field `colour`"),
    ('[[models]]\nname = "x"\nengine = "onnx"\n[[loras]]\nname = "x"\npath = "p"\n',
     "repeated: x"),
])
def test_bad_config_is_named(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "w.toml"
    f.write_text(text)
    with pytest.raises(WorkerConfigError) as e:
        config.load(f)
    assert str(e.value).startswith(str(f)) and message in str(e.value)


@pytest.mark.parametrize(("text", "field", "message"), [
    ('engine = "tensorflow"', "models[0].engine", "unknown engine 'tensorflow'"),
    ('engine = "llamacpp"\npath = "/nope.gguf"', "models[0].path",
     "model file /nope.gguf does not exist"),
    ('engine = "onnx"\npath = "/nope"', "models[0].path", "model file /nope does not exist"),
    ('engine = "llamacpp"\nweights = "q3"', "models[0].weights", "weights must be one of"),
    ('engine = "llamacpp"\nthreads = 0', "models[0].threads", "must be >= 1, got 0"),
    ('engine = "llamacpp"\nmax_queue_seconds = -1', "models[0].max_queue_seconds",
     "must be >= 0 (0: no bound), got -1"),
    ('engine = "llamacpp"\nmax_queue_seconds = nan', "models[0].max_queue_seconds",
     "must be >= 0"),
    ('engine = "llamacpp"\nprefill_chunk = 0', "models[0].prefill_chunk",
     "must be 1..512 (a decode call's tokens), got 0"),
    ('engine = "llamacpp"\nprefill_chunk = 513', "models[0].prefill_chunk",
     "must be 1..512 (a decode call's tokens), got 513"),
    ('engine = "openai"', "models[0].url", "needs the url"),
    ('engine = "onnx"\n[[loras]]\nname = "a"\npath = "a.gguf"', "loras[0].path",
     "a.gguf does not exist"),
])
def test_a_config_the_worker_cannot_start_on_is_refused_at_load(
        tmp_path: Path, text: str, field: str, message: str) -> None:
    """The PoP loads it before it starts the worker: a worker that exits on it at
    start is restarted forever."""
    f = tmp_path / "w.toml"
    f.write_text(f'[[models]]\nname = "x"\n{text}\n')
    with pytest.raises(WorkerConfigError) as e:
        config.load(f)
    assert (e.value.file, e.value.field) == (str(f), field) and message in e.value.reason


def test_prefill_chunk_reaches_the_model_and_has_a_default(tmp_path: Path) -> None:
    f = tmp_path / "w.toml"
    f.write_text('[[models]]\nname = "a"\nengine = "llamacpp"\nprefill_chunk = 512\n'
                 '[[models]]\nname = "b"\nengine = "llamacpp"\n')
    assert [m.prefill_chunk for m in config.load(f).models] == [512, 128]


def test_model_files_that_exist_load(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"")
    (tmp_path / "onnx").mkdir()
    f = tmp_path / "w.toml"
    f.write_text(f'[[models]]\nname = "a"\nengine = "llamacpp"\npath = "{tmp_path}/m.gguf"\n'
                 f'[[models]]\nname = "b"\nengine = "onnx"\npath = "{tmp_path}/onnx"\n')
    assert [m.path for m in config.load(f).models] == [f"{tmp_path}/m.gguf", f"{tmp_path}/onnx"]


def test_a_home_relative_path_is_what_the_engine_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`~/m.gguf` passed the check (expanded there) and the engine, which opened the
    path as written, found no such file: the worker was restarted forever."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(b"")
    (tmp_path / "a.gguf").write_bytes(b"")
    f = tmp_path / "w.toml"
    f.write_text('[[models]]\nname = "a"\nengine = "llamacpp"\npath = "~/m.gguf"\n'
                 '[[loras]]\nname = "l"\nbase = "a"\npath = "~/a.gguf"\n')
    cfg = config.load(f)
    assert (cfg.models[0].path, cfg.loras[0].path) == (f"{tmp_path}/m.gguf",
                                                       f"{tmp_path}/a.gguf")
    assert Path(cfg.models[0].path).is_file()


@pytest.mark.parametrize(("text", "message"), [
    ('[[models]]\nname = "x"\nengine = "tensorflow"\n', "unknown engine 'tensorflow'"),
    ('[[models]]\nname = "x"\nengine = "llamacpp"\npath = "/nope.gguf"\n',
     "/nope.gguf does not exist"),
    ('[[models]]\nname = "x"\nengine = "llamacpp"\nweights = "q3"\n', "weights must be one of"),
])
def test_worker_refuses_to_start_with_a_clear_message(tmp_path: Path, text: str,
                                                      message: str) -> None:
    f = tmp_path / "w.toml"
    f.write_text(text)
    out = subprocess.run([sys.executable, "-m", "gpu_worker", "--socket", str(tmp_path / "s"),
                          "--config", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr


def test_the_llama_engine_schedules_with_the_models_prefill_chunk() -> None:
    """The model's `prefill_chunk` reaches its scheduler (the real model, loaded in
    this process): the scheduler's own default would hide a value left out."""
    import asyncio

    from gpu_worker.engines.llamacpp import LlamaEngine
    from gpu_worker.metrics import Metrics

    engine = LlamaEngine(config.ModelSpec("smollm2-135m", "llamacpp", prefill_chunk=48,
                                          context=1024), Metrics())
    asyncio.run(engine.start())
    try:
        assert engine.driver is not None and engine.driver.sched.prefill_chunk == 48
    finally:
        engine.close()
