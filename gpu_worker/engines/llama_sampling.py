"""Grammar-constrained sampling that costs little when the model already
follows the grammar (llama.cpp's own ``common_sampler_sample`` does the same).

Applying a grammar to all 49k candidates costs 20-80 ms a token here (a decode
step ~15 ms). So each step first samples without it, then asks the grammar
about that one token; only when the grammar refuses it are the candidates
filtered by the grammar and sampled again. Greedy decoding picks the same token
either way; sampled decoding draws from the grammar-filtered distribution
whenever the first draw was refused.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as ll
import numpy as np

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarSampler:
    """`chain` (every other sampler) and `grammar`, sampled as the module says.
    Owns both; `free` releases them."""

    def __init__(self, chain: Any, grammar: Any, n_vocab: int) -> None:
        self.chain, self.grammar, self.n_vocab = chain, grammar, n_vocab
        self.data = (ll.llama_token_data * n_vocab)()
        self.view = np.frombuffer(self.data, dtype=_TOKEN_DATA)
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.one = (ll.llama_token_data * 1)()

    def sample(self, ctx: Any, index: int) -> int:
        """The next token from output row `index` of `ctx`; accepted by both."""
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, index),
                                       shape=(self.n_vocab,))
        token = self._pick(logits, with_grammar=False)
        if not self._allows(token):
            token = self._pick(logits, with_grammar=True)
        ll.llama_sampler_accept(self.grammar, token)
        ll.llama_sampler_accept(self.chain, token)
        return token

    def _pick(self, logits: np.ndarray, with_grammar: bool) -> int:
        self.view["id"] = self.ids  # samplers sort the candidates in place
        self.view["logit"] = logits
        self.view["p"] = 0
        arr = ll.llama_token_data_array(self.data, self.n_vocab, -1, False)
        if with_grammar:
            ll.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        ll.llama_sampler_apply(self.chain, ctypes.byref(arr))
        return int(arr.data[arr.selected].id)

    def _allows(self, token: int) -> bool:
        self.one[0].id, self.one[0].logit, self.one[0].p = token, 1.0, 0.0  # type: ignore[assignment]
        arr = ll.llama_token_data_array(self.one, 1, -1, False)
        ll.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        return bool(np.isfinite(arr.data[0].logit))

    def free(self) -> None:
        ll.llama_sampler_free(self.chain)
        ll.llama_sampler_free(self.grammar)
