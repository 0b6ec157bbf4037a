"""Write GGUF LoRA adapters for a base model: random ones for tests and
benchmarks, in the layout llama.cpp's ``convert_lora_to_gguf.py`` produces.

    python -m gpu_worker.adapters OUT.gguf [--base MODEL.gguf] [--rank 8] [--seed 1]

For each targeted weight ``W`` (ggml shape [n_in, n_out]) the file holds
``W.lora_a`` [n_in, rank] and ``W.lora_b`` [rank, n_out]; llama.cpp adds
``scale * alpha / rank * B @ A`` to ``W``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")


def write_random_lora(base: Path, out: Path, rank: int = 8, seed: int = 0,
                      std: float = 0.05, targets: tuple[str, ...] = TARGETS) -> int:
    """Write a random adapter for `base` to `out`; returns the number of weights
    it adapts. Raises ValueError if no tensor of `base` matches `targets`."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    count = 0
    for t in reader.tensors:
        if not t.name.endswith(".weight") or not any(f".{k}." in t.name for k in targets):
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])
        stem = t.name.removesuffix(".weight")
        a = (rng.standard_normal((rank, n_in)) * std).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * std).astype(np.float32)
        writer.add_tensor(f"{stem}.weight.lora_a", a)
        writer.add_tensor(f"{stem}.weight.lora_b", b)
        count += 1
    if count == 0:
        raise ValueError(f"no weight of {base} matches {targets}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count


def main(argv: list[str] | None = None) -> int:
    from .models import packaged_model

    ap = argparse.ArgumentParser(prog="python -m gpu_worker.adapters",
                                 description="write a random LoRA adapter (for tests)")
    ap.add_argument("out")
    ap.add_argument("--base", help="base GGUF (default: the packaged SmolLM2)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.05)
    args = ap.parse_args(argv)
    base = Path(args.base) if args.base else packaged_model()
    n = write_random_lora(base, Path(args.out), args.rank, args.seed, args.std)
    print(f"wrote {args.out}: {n} adapted weights, rank {args.rank}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
