"""A thin owner of llama.cpp's native objects (model, context, batch, LoRA
adapters, samplers) over llama-cpp-python's low-level bindings.

Everything here runs on the engine's scheduler thread; none of it is
thread-safe.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp as ll
import numpy as np

from edgefn_core.errors import EngineError

from ..protocol import TokenLogprob
from .llama_backends import load_backends
from .llama_sampling import GrammarSampler

if TYPE_CHECKING:
    from .batching import Shaping

_LOG_CB: Any = None


def quiet() -> None:
    """llama.cpp logs every load to stderr; keep only errors."""
    global _LOG_CB

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def cb(level: int, text: bytes, _: Any) -> None:
        if level == 4 and os.environ.get("EDGEFN_LLAMA_LOG") != "0":  # GGML_LOG_LEVEL_ERROR
            os.write(2, text)

    _LOG_CB = cb
    ll.llama_log_set(cb, None)


BIAS_CACHE = 8  # logit_bias dicts whose arrays `LlamaModel.logprob` remembers


class LlamaModel:
    """A loaded GGUF model and one context shared by up to `n_seq` sequences."""

    def __init__(self, path: Path, n_ctx: int, n_seq: int, threads: int, gpu_layers: int) -> None:
        """Raises `EngineError` if the file is missing or llama.cpp cannot load it."""
        if not path.is_file():
            raise EngineError("invalid_config", 500, f"model file {path} does not exist")
        quiet()
        load_backends()
        ll.llama_backend_init()
        self._biases: dict[int, tuple[dict[int, float], np.ndarray, np.ndarray]] = {}
        self.gpu = bool(ll.llama_supports_gpu_offload())
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = gpu_layers if self.gpu else 0
        self.model = ll.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise EngineError("invalid_config", 500, f"llama.cpp could not load {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        cp = ll.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = True  # one KV pool shared by whichever sequences run
        cp.no_perf = True
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise EngineError("invalid_config", 500, f"llama.cpp could not create a context for "
                              f"{path} (n_ctx={n_ctx}, n_seq={n_seq})")
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.mem = ll.llama_get_memory(self.ctx)
        self.batch = ll.llama_batch_init(512, 0, 1)
        self.template = ll.llama_model_chat_template(self.model, None)
        self.adapters: dict[str, Any] = {}
        self.current_adapter: str | None = None
        self.per_seq = _PER_SEQ is not None  # this build selects adapters per sequence
        self.stacked: dict[str, int] = {}  # adapter -> its index in the per-sequence stack
        self.piece = ctypes.create_string_buffer(256)

    # -- text -----------------------------------------------------------------------------
    def tokenize(self, text: str, special: bool = True, first: bool = True) -> list[int]:
        """`text`'s tokens; `special`: read special-token text ("<|im_end|>") as those
        tokens; `first`: the start of a prompt (the model's BOS, if it takes one)."""
        data = text.encode()
        cap = len(data) + 8
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, cap, first, special)
        if n < 0:
            buf = (ll.llama_token * -n)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, -n, first, special)
        return list(buf[:n])

    def tokenize_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """A chat's prompt tokens: the template's own text with its special tokens read
        as such, each message's content as plain text, so a user who types
        "<|im_end|>" sends those characters and cannot end their turn or forge
        another role's (the whole prompt read with special tokens let them; and
        llama.cpp's special-token pass over it took time quadratic in their
        number). Raises `EngineError` as `render_chat` does."""
        texts = [content_text(m.get("content")) for m in messages]
        marked = [{**m, "content": _MARK.format(i) if isinstance(t, str) else m.get("content")}
                  for i, (m, t) in enumerate(zip(messages, texts, strict=True))]
        parts = _MARKS.split(self.render_chat(marked))  # template, index, template, ...
        order = [int(x) for x in parts[1::2]]
        if order != [i for i, t in enumerate(texts) if isinstance(t, str)]:
            # a template that moved or changed a content: its text, read as it was
            return self.tokenize(self.render_chat(messages))
        out: list[int] = []
        for k, part in enumerate(parts):
            if k % 2:
                text = texts[int(part)]
                assert isinstance(text, str)
                out += self.tokenize(text, special=False, first=False)
            elif part or k == 0:
                out += self.tokenize(part, special=True, first=k == 0)
        return out

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The longest token's text, in bytes: a prompt longer than the context times
        this cannot fit, and is refused before it is tokenized."""
        return max(max(len(self.piece_bytes(t)) for t in range(self.n_vocab)), 1)

    def piece_bytes(self, token: int) -> bytes:
        n = ll.llama_token_to_piece(self.vocab, token, self.piece, 256, 0, False)
        return self.piece.raw[:n] if n > 0 else b""

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The prompt for a chat, by the model's own template. Raises `EngineError`
        for a message without a string role and content."""
        arr = (ll.llama_chat_message * len(messages))()
        keep = []
        for i, m in enumerate(messages):
            role, content = m.get("role"), content_text(m.get("content"))
            if isinstance(content, int):
                raise EngineError("invalid_request", 400, f"messages[{i}].content[{content}] is "
                                  "not a text part: this model reads text only")
            if not isinstance(role, str) or content is None:
                raise EngineError("invalid_request", 400, f"messages[{i}] needs a string 'role' "
                                  "and a string (or text parts) 'content'")
            keep += [role.encode(), content.encode()]
            arr[i].role, arr[i].content = keep[-2], keep[-1]
        size = 4096 + sum(len(k) for k in keep) * 2
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(self.template, arr, len(messages), True, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n + 1)
            n = ll.llama_chat_apply_template(self.template, arr, len(messages), True, buf, n + 1)
        if n < 0:
            raise EngineError("invalid_request", 400,
                              "the model's chat template rejected the messages")
        return buf.raw[:n].decode("utf-8", "replace")

    # -- LoRA -----------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        """Raises `EngineError` if the file is missing or does not fit the model."""
        if not Path(path).is_file():
            raise EngineError("invalid_request", 400, f"LoRA adapter file {path} does not exist")
        adapter = ll.llama_adapter_lora_init(self.model, path.encode())
        if not adapter:
            raise EngineError("invalid_request", 400,
                              f"{path} is not a LoRA adapter for this model "
                              "(llama.cpp refused it; see the worker log)")
        self.adapters[name] = adapter
        if self.per_seq:
            self._stack()

    def unload_adapter(self, name: str) -> None:
        """Stop carrying adapter `name` (no sequence uses it any more): restacked
        without it. Its weights stay with the model (llama.cpp frees adapters with
        it); a later load under the name is a new adapter."""
        if self.adapters.pop(name, None) is None:
            return
        if self.current_adapter == name:
            self.use_adapter(None, 1.0)
        if self.per_seq:
            self._stack()

    def _stack(self) -> None:
        """Stack every loaded adapter for per-sequence selection (a copy of their
        weights, made once per load). A stack llama.cpp refuses (an adapter of
        token embeddings, say) leaves one adapter per decode call."""
        assert _PER_SEQ is not None
        names = list(self.adapters)
        arr = (ll.llama_adapter_lora_p_ctypes * len(names))(*(self.adapters[n] for n in names))
        if _PER_SEQ[0](self.ctx, arr, len(names)) != 0:
            self.per_seq = False
            self.stacked = {}
            _PER_SEQ[0](self.ctx, None, 0)
            return
        self.stacked = {n: i for i, n in enumerate(names)}

    def use_adapters(self, seqs: list[tuple[int, str | None, float]]) -> None:
        """Per sequence slot, the adapter (None: the base model) and scale its tokens
        decode with, all in one decode call (``per_seq`` builds only)."""
        assert _PER_SEQ is not None
        if not self.stacked:  # no adapter loaded yet: every sequence is the base model's
            return
        for slot, name, scale in seqs:
            index = -1 if name is None else self.stacked[name]
            if _PER_SEQ[1](self.ctx, slot, index, scale) != 0:
                raise RuntimeError(f"llama_set_seq_adapter_lora failed for slot {slot}")

    def use_adapter(self, name: str | None, scale: float) -> None:
        """Apply adapter `name` (None: the base model) to the next decodes."""
        if name == self.current_adapter:
            return
        if name is None:
            rc = ll.llama_set_adapters_lora(self.ctx, None, 0, None)
        else:
            arr = (ll.llama_adapter_lora_p_ctypes * 1)(self.adapters[name])
            rc = ll.llama_set_adapters_lora(self.ctx, arr, 1, (ctypes.c_float * 1)(scale))
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora failed ({rc})")
        self.current_adapter = name

    # -- decoding -------------------------------------------------------------------------
    def decode(self, items: list[tuple[int, int, int, bool]]) -> int:
        """Decode one batch of (token, position, sequence, wants_logits); returns
        llama_decode's status (0 ok, 1 no KV slot, <0 error)."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits
        b.n_tokens = len(items)
        return int(ll.llama_decode(self.ctx, b))

    def forget(self, seq: int) -> None:
        """Drop sequence `seq`'s KV cache entries so its slot can be reused."""
        ll.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def sampler(self, temperature: float, top_p: float, top_k: int, seed: int,
                shaping: Shaping | None = None) -> Any:
        """A sampler: `shaping`'s logit bias and penalties (over the whole
        vocabulary, so they come first), then greedy or top-k/top-p/temperature
        sampling; with a grammar, a `GrammarSampler` around that chain. Raises
        `EngineError` for a grammar llama.cpp refuses."""
        grammar = None
        if shaping is not None and shaping.grammar is not None:
            grammar = self._grammar(shaping.grammar)
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if shaping is not None:
            self._shape(chain, shaping)
        _pick(chain, temperature, top_p, top_k, seed)
        return chain if grammar is None else GrammarSampler(chain, grammar, self.n_vocab)

    def _shape(self, chain: Any, shaping: Shaping) -> None:
        if shaping.logit_bias:
            bias = (ll.llama_logit_bias * len(shaping.logit_bias))()
            for i, (token, value) in enumerate(shaping.logit_bias.items()):
                bias[i].token, bias[i].bias = token, value  # type: ignore[assignment]
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_logit_bias(
                self.n_vocab, len(shaping.logit_bias), bias))
        if shaping.presence_penalty or shaping.frequency_penalty:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_penalties(
                self.n_vocab, shaping.penalty_window, 1.0, shaping.frequency_penalty,
                shaping.presence_penalty))

    def _grammar(self, grammar: str) -> Any:
        """Raises `EngineError` (400) if llama.cpp cannot parse `grammar`."""
        sampler = ll.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not sampler:
            raise EngineError("invalid_request", 400, "llama.cpp refused the grammar built "
                              "for this request's response_format or tools")
        return sampler

    def check_grammar(self, grammar: str) -> None:
        """Raises `EngineError` (400) if llama.cpp cannot parse `grammar`. Reads only
        the vocabulary, so it may run beside the scheduler thread."""
        ll.llama_sampler_free(self._grammar(grammar))

    def logprob(self, index: int, token: int, top: int, bias: dict[int, float]
                ) -> TokenLogprob:
        """`token`'s log-probability at output row `index` and the `top` most likely
        tokens there: a log-softmax over the whole vocabulary after `bias` (costs
        ~0.3 ms a token, so only when asked)."""
        ptr = ll.llama_get_logits_ith(self.ctx, index)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        if bias:
            tokens, values = self._bias_arrays(bias)
            logits[tokens] += values  # the ids are a dict's keys: no repeats
        logits -= logits.max()
        logits -= np.log(np.exp(logits).sum())
        best = np.argpartition(-logits, top)[:top] if top else np.empty(0, dtype=np.int64)
        best = best[np.argsort(-logits[best], kind="stable")]
        return TokenLogprob(self.piece_bytes(token), float(logits[token]),
                            [(self.piece_bytes(int(t)), float(logits[t])) for t in best])

    def _bias_arrays(self, bias: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
        """`bias` as (token ids, values), remembered for the last BIAS_CACHE dicts
        (the one scheduler thread calls this): a whole-vocabulary bias added in a
        Python loop cost 20 ms a token a sequence, on the thread every request waits
        on; the arrays 0.2 ms."""
        hit = self._biases.get(id(bias))
        if hit is not None and hit[0] is bias:
            return hit[1], hit[2]
        if len(self._biases) >= BIAS_CACHE:
            del self._biases[next(iter(self._biases))]
        tokens = np.fromiter(bias.keys(), dtype=np.intp, count=len(bias))
        values = np.fromiter(bias.values(), dtype=np.float64, count=len(bias))
        self._biases[id(bias)] = (bias, tokens, values)  # holds `bias`: its id stays its own
        return tokens, values

    def sample(self, sampler: Any, index: int) -> int:
        if isinstance(sampler, GrammarSampler):
            return sampler.sample(self.ctx, index)
        return int(ll.llama_sampler_sample(sampler, self.ctx, index))

    @staticmethod
    def free_sampler(sampler: Any) -> None:
        if isinstance(sampler, GrammarSampler):
            sampler.free()
        else:
            ll.llama_sampler_free(sampler)

    def close(self) -> None:
        if self.ctx:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
        for adapter in self.adapters.values():
            ll.llama_adapter_lora_free(adapter)
        self.adapters.clear()
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None


def _per_seq_api() -> tuple[Any, Any] | None:
    """llama_set_adapters_lora_per_seq and llama_set_seq_adapter_lora, where this
    llama.cpp has them (the build .ci/llama-wheel patches; a stock one has not)."""
    lib = ll.llama_cpp._lib
    try:
        stack, select = lib.llama_set_adapters_lora_per_seq, lib.llama_set_seq_adapter_lora
    except AttributeError:
        return None
    stack.argtypes = [ll.llama_context_p_ctypes,
                      ctypes.POINTER(ll.llama_adapter_lora_p_ctypes), ctypes.c_size_t]
    stack.restype = ctypes.c_int32
    select.argtypes = [ll.llama_context_p_ctypes, ll.llama_seq_id, ctypes.c_int32,
                       ctypes.c_float]
    select.restype = ctypes.c_int32
    return stack, select


_PER_SEQ = _per_seq_api()


def _pick(chain: Any, temperature: float, top_p: float, top_k: int, seed: int) -> None:
    """End `chain` with greedy or top-k/top-p/temperature sampling."""
    if temperature <= 0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
        return
    if top_k > 0:  # before the softmax: sampling over 49k logits costs ~0.5 ms
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(top_k))
    if top_p < 1.0:
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(top_p, 1))
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(temperature))
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(dist_seed(seed)))


RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp draws a random seed for it


def dist_seed(seed: int) -> int:
    """The 32-bit seed llama.cpp's sampler gets for a request's `seed`: its low 32
    bits, except that the one value llama.cpp reads as "random" (-1, 2**32 - 1, and
    every seed that ends in those bits) is mapped to a fixed one, so that the
    same seed still gives the same output."""
    low = seed & 0xFFFFFFFF
    return 0x7F4A7C15 if low == RANDOM_SEED else low


_MARK = "\ue000{}\ue001"  # private-use characters: where a content goes in the template
_MARKS = re.compile("\ue000([0-9]+)\ue001")


def content_text(content: Any) -> str | int | None:
    """OpenAI message content: a string, or a list of text parts, as one text; the
    index of the first part that is not text (an image, audio, a file: never
    dropped unread); None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                return j
        parts = [p.get("text") for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None
