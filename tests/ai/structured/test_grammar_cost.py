"""What an enum's grammar costs llama.cpp (`literal_trie`): the texts it allows,
and the time to match the packaged model's whole vocabulary against it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import llama_cpp as ll
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_worker.engines.constrain import grammar_for
from gpu_worker.engines.literal_trie import gbnf_literal, trie_rule
from gpu_worker.engines.llama_model import LlamaModel
from gpu_worker.engines.llama_sampling import GrammarSampler
from gpu_worker.models import packaged_model
from gpu_worker.protocol import Generate

TEXTS = st.lists(st.text(alphabet="ab\"\\", min_size=1, max_size=6), min_size=1, max_size=12)


@given(TEXTS, st.text(alphabet="ab\"\\", max_size=7))
def test_a_trie_allows_exactly_its_texts(texts: list[str], other: str) -> None:
    # the rule's groups, `|` and `?` read the same as a regex's; literals as regexes
    allowed = re.compile(trie_rule(texts, lambda s: f"(?:{re.escape(s)})"), re.VERBOSE)
    assert all(allowed.fullmatch(t) for t in texts)
    assert bool(allowed.fullmatch(other)) == (other in texts)


def read_literal(literal: str) -> str:
    """What a GBNF literal matches (llama.cpp's escapes)."""
    assert literal[0] == literal[-1] == '"'
    body, out, i = literal[1:-1], [], 0
    while i < len(body):
        c = body[i]
        assert c != '"', literal  # an unescaped quote ends the literal early
        if c != "\\":
            out.append(c)
            i += 1
            continue
        kind = body[i + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(kind)
        if width:
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append({"n": "\n", "r": "\r", "t": "\t"}.get(kind, kind))
            i += 2
    return "".join(out)


@given(st.text() | st.lists(st.text(max_size=3), max_size=3))
def test_a_literal_matches_json_that_reads_back_as_the_value(value: object) -> None:
    matched = read_literal(gbnf_literal(json.dumps(value)))
    assert json.loads(matched) == value


@pytest.fixture(scope="module")
def lm() -> Iterator[LlamaModel]:
    model = LlamaModel(packaged_model(), 256, 1, 1, 0)
    yield model
    model.close()


def _vocab_match_seconds(lm: LlamaModel, schema: dict[str, object]) -> float:
    """The least of 3 times to match every vocabulary token against `schema`'s grammar
    at its start (what a step costs when the model's pick is refused)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    grammar = grammar_for(Generate(1, "m", response_format=fmt))
    assert grammar is not None
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
    sampler = GrammarSampler(chain, ll.llama_sampler_init_grammar(
        lm.vocab, grammar.encode(), b"root"), lm.n_vocab)
    logits = np.random.default_rng(0).standard_normal(lm.n_vocab).astype(np.float32)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        sampler._pick(logits, with_grammar=True)
        times.append(time.perf_counter() - start)
    sampler.free()
    return min(times)


def test_an_enum_of_500_values_costs_about_what_two_do(lm: LlamaModel) -> None:
    """One alternative a value cost ~40x two values' (every value a parse stack)."""
    two = _vocab_match_seconds(lm, {"enum": ["value-0", "value-1"]})
    many = _vocab_match_seconds(lm, {"enum": [f"value-{i}" for i in range(500)]})
    assert many < 8 * two, (many, two)


@pytest.mark.parametrize("schema", [
    {"enum": ["東京", "大阪"]}, {"enum": ["ä", "ö"]}, {"enum": ["a\nb", "a\tb"]},
    {"enum": ["x\"1", "x\\2"]}, {"enum": ["😀", "😁"]}, {"enum": ["\\", "\\u0041"]},
    {"const": "say \"hi\"\\"}, {"type": "object", "properties": {"a\"b\\": {"type": "string"}}},
])
def test_values_with_escapes_make_a_grammar_llama_cpp_reads(
        lm: LlamaModel, schema: dict[str, object]) -> None:
    """The trie parts texts at whole JSON escapes (``\\u6771``, ``\\n``): parted
    inside one, a literal ended on a lone backslash or a ``\\u`` without its digits;
    and a quote or backslash in a value (or a property name) needs its backslash
    escaped in the literal."""
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    grammar = grammar_for(Generate(1, "m", response_format=fmt))
    assert grammar is not None
    lm.check_grammar(grammar)  # raises EngineError where llama.cpp cannot parse it
