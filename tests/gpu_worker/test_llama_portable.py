"""The installed llama.cpp runs on this CPU whatever machine compiled it: it picks its
CPU code at run time (`.ci/llama-wheel`), and decodes with the packaged
Q4_1 weights, F16 and the repacked Q8_0 and Q4_0. Each decode runs in a child process, so an illegal
instruction (SIGILL) fails the test instead of killing pytest."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpu_worker.engines.llama_backends import lib_dir

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 6

DECODE = textwrap.dedent("""
    import json, sys
    from gpu_worker.engines.llama_backends import loaded_cpu_variant
    from gpu_worker.engines.llama_model import LlamaModel
    from gpu_worker.models import converted, packaged_model

    weights, n = sys.argv[1], int(sys.argv[2])
    m = LlamaModel(converted(packaged_model(), weights), n_ctx=256, n_seq=1, threads=2,
                   gpu_layers=0)
    prompt = m.tokenize(m.render_chat([{"role": "user", "content": "Name three colours."}]))
    assert m.decode([(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)]) == 0
    greedy, out = m.sampler(0.0, 1.0, 0, 0), []
    for pos in range(len(prompt), len(prompt) + n):
        out.append(m.sample(greedy, -1))
        assert m.decode([(out[-1], pos, 0, True)]) == 0
    text = b"".join(m.piece_bytes(t) for t in out).decode("utf-8", "replace")
    print(json.dumps({"tokens": out, "text": text, "variant": loaded_cpu_variant()}))
""")


def run_child(*args: str, cwd: Path, pythonpath: str = str(ROOT)) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-c", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def decode(weights: str, cwd: Path) -> dict[str, object]:
    """Greedy-decodes `TOKENS` tokens in a child process; fails the test, naming the
    signal, if the child dies."""
    proc = run_child(DECODE, weights, str(TOKENS), cwd=cwd)
    if proc.returncode < 0:
        pytest.fail(f"decoding {weights} weights killed the process with "
                    f"{signal.Signals(-proc.returncode).name}: {proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("weights", ["as-is", "f16", "q8_0", "q4_0"])
def test_decodes_with_packaged_and_converted_weights(weights: str, tmp_path: Path) -> None:
    got = decode(weights, tmp_path)
    tokens = got["tokens"]
    assert isinstance(tokens, list) and len(tokens) == TOKENS
    assert str(got["text"]).strip(), got


def test_cpu_code_is_chosen_at_run_time(tmp_path: Path) -> None:
    """The CPU backend is one of the variants in llama_cpp/lib, loaded for this CPU,
    not code compiled in for the build machine's."""
    variants = sorted(p.name for p in lib_dir().glob("libggml-cpu-*.so"))
    assert len(variants) >= 2, (f"llama-cpp-python in {lib_dir()} was compiled for one CPU "
                                "(no libggml-cpu-<variant>.so): run `make venv`")
    got = decode("as-is", tmp_path)
    assert f"libggml-cpu-{got['variant']}.so" in variants, got


def test_missing_cpu_variants_are_a_clear_error(tmp_path: Path) -> None:
    """A llama_cpp package whose CPU variants are gone: loading the backends says
    which folder lacks them instead of llama.cpp failing the model load later."""
    copy = tmp_path / "pkgs" / "llama_cpp"
    # without the CUDA module too (make venv-cuda's): a GPU box would load it
    shutil.copytree(lib_dir().parent, copy,
                    ignore=shutil.ignore_patterns("libggml-cpu-*", "libggml-cuda*"))
    probe = textwrap.dedent("""
        import json, llama_cpp
        from edgefn_core.errors import EngineError
        from gpu_worker.engines.llama_backends import load_backends
        try:
            load_backends()
            error = None
        except EngineError as e:
            error = str(e)
        print(json.dumps({"package": llama_cpp.__file__, "error": error}))
    """)
    proc = run_child(probe, cwd=tmp_path, pythonpath=f"{copy.parent}{os.pathsep}{ROOT}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["package"].startswith(str(copy))
    assert got["error"] is not None, "load_backends() accepted a llama_cpp without CPU variants"
    assert f"no llama.cpp backend in {copy / 'lib'} runs on this CPU" in got["error"]


def test_a_cuda_module_without_its_driver_is_skipped(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`make venv-cuda` puts libggml-cuda.so beside the CPU variants; on a box without
    the NVIDIA driver (no libcuda.so.1) ggml cannot load it, and the model decodes on
    the CPU variant as before. The stand-in module needs a libcuda.so.1 that is there
    at link time only, as the real one does."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    copy = tmp_path / "pkgs" / "llama_cpp"
    shutil.copytree(lib_dir().parent, copy, ignore=shutil.ignore_patterns("libggml-cuda*"))
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "cuda.c").write_text("int cuInit(unsigned int flags) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    str(stub / "libcuda.so"), str(stub / "cuda.c")], check=True)
    (stub / "module.c").write_text("int cuInit(unsigned int flags);\n"
                                   "int ggml_backend_score(void) { return cuInit(0) + 1; }\n")
    module = copy / "lib" / "libggml-cuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(module), str(stub / "module.c"),
                    f"-L{stub}", "-lcuda"], check=True)
    assert "libcuda.so.1" in subprocess.run(["ldd", str(module)], capture_output=True,
                                            text=True).stdout
    monkeypatch.setenv("LD_DEBUG", "files")  # the loader's log: ggml did try the module
    proc = run_child(DECODE, "as-is", str(TOKENS), cwd=tmp_path,
                     pythonpath=f"{copy.parent}{os.pathsep}{ROOT}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"file=libcuda.so.1 [0];  needed by {module}" in proc.stderr, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert len(got["tokens"]) == TOKENS and got["variant"], got
    assert f"libggml-cpu-{got['variant']}.so" in os.listdir(copy / "lib")
