"""Keys and scopes of the AI caches (`runtime.cache.ai.keys`): what changes the
output changes the key; what normalisation folds does not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from runtime.cache.ai.guards import normalize
from runtime.cache.ai.keys import (
    DEFAULTS,
    MAX_READ_BYTES,
    chat_call,
    completion_call,
    embedding_call,
)
from runtime.cache.ai.text import exact

BASE: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "top_k": 40, "seed": None,
                        "max_tokens": 64, "stop": []}
MSGS = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"}]

# a different value for each output-relevant parameter
CHANGED: dict[str, list[Any]] = {"temperature": [0.5, 1e-6], "top_p": [0.9, 0.5],
                                 "top_k": [1, 0], "seed": [0, 7], "max_tokens": [65, 1],
                                 "stop": [["\n"], ["x", "y"]]}
words = st.text(st.characters(codec="utf-8", categories=("L", "N")), min_size=1, max_size=12)


@given(name=st.sampled_from(sorted(CHANGED)), pick=st.integers(0, 1))
def test_every_sampling_parameter_changes_the_key_and_the_scope(name: str, pick: int) -> None:
    a = chat_call("t", "m", MSGS, BASE)
    b = chat_call("t", "m", MSGS, {**BASE, name: CHANGED[name][pick]})
    assert a.key != b.key and a.scope != b.scope


@given(tenant=words, model=words)
def test_tenant_and_model_change_key_and_scope(tenant: str, model: str) -> None:
    a = chat_call("t", "m", MSGS, BASE)
    for b in (chat_call(tenant, "m", MSGS, BASE), chat_call("t", model, MSGS, BASE)):
        same = (b.tenant, b.model) == ("t", "m")
        assert (a.key == b.key) is same and (a.scope == b.scope) is same


@given(word=words)
@example(word="Paris")
@example(word="\u02bc")  # a letter (Lm) that folds to an apostrophe, dropped at the end
def test_a_different_message_changes_the_key(word: str) -> None:
    """Different unless the exact text folds the difference away (NFKC: a trailing
    U+02BC MODIFIER LETTER APOSTROPHE stays an apostrophe, and changes the key)."""
    text = MSGS[1]["content"] + " " + word
    other = [MSGS[0], {"role": "user", "content": text}]
    a, b = chat_call("t", "m", MSGS, BASE), chat_call("t", "m", other, BASE)
    assert (a.key != b.key) is (exact(text) != exact(MSGS[1]["content"]))
    assert a.scope == b.scope  # only the last user message differs: one scope


@given(space=st.sampled_from([" ", "  ", "\t", "\n", " \u3000"]), upper=st.booleans())
def test_whitespace_around_the_message_keeps_the_key_and_case_changes_it(
        space: str, upper: bool) -> None:
    text = "What is the capital of France?"
    varied = [MSGS[0], {"role": "user", "content": f"{space}{text.upper() if upper else text}"
                                                     f"{space}"}]
    a, b = chat_call("t", "m", MSGS, BASE), chat_call("t", "m", varied, BASE)
    assert (a.key == b.key) is not upper  # case can change an answer (code): kept
    assert a.query == b.query == normalize(text) == "what is the capital of france"


@given(space=st.sampled_from(["  ", "\t", "\n", " \u3000"]),
       end=st.sampled_from(["", " ?", "?!", "...", "\uff1f"]))
def test_inner_whitespace_and_closing_punctuation_change_the_key_not_the_query(
        space: str, end: str) -> None:
    """The exact cache keys the text as written (a closing "!" or a line's spaces
    can be its meaning: "Compute 5!", code); the semantic cache's query folds
    them, and serves such variants past its guards."""
    varied = [MSGS[0], {"role": "user",
                        "content": "What is the capital of France".replace(" ", space) + end}]
    a, b = chat_call("t", "m", MSGS, BASE), chat_call("t", "m", varied, BASE)
    assert a.key != b.key and a.scope == b.scope and a.formula == b.formula == ""
    assert a.query == b.query == "what is the capital of france"


def test_canonically_equivalent_text_is_one_key() -> None:
    composed = [{"role": "user", "content": "Caf\u00e9 hours?"}]
    decomposed = [{"role": "user", "content": "Cafe\u0301 hours?"}]
    assert chat_call("t", "m", composed, BASE).key == chat_call("t", "m", decomposed, BASE).key


@pytest.mark.parametrize(("a", "b"), [
    # each pair shared an exact key, and one got the other's answer (NFKC, joined
    # whitespace, a dropped closing "!"); the formula now keeps the semantic cache
    # from serving one for the other too
    ("What is 3\u00b2", "What is 32"), ("Compute 5!", "Compute 5"),
    ("Is this valid Python?\nif x:\n    y()", "Is this valid Python? if x: y()"),
    ("Is this valid Python?\nif x:\n    y()\n    z()", "Is this valid Python?\nif x:\n    y()\nz()"),
    ("x\u207b\u00b9", "x-1"),
])
def test_text_the_exact_key_once_folded_changes_the_key_and_the_formula(a: str, b: str) -> None:
    ca, cb = (chat_call("t", "m", [{"role": "user", "content": x}], BASE) for x in (a, b))
    assert ca.key != cb.key and ca.formula != cb.formula
    assert ca.scope == cb.scope


def test_compatibility_forms_change_the_key_not_the_meaning() -> None:
    """"H₂O" and "H2O" are one substance: two exact keys, one query and formula."""
    a, b = (chat_call("t", "m", [{"role": "user", "content": x}], BASE)
            for x in ("Is H\u2082O or H2O heavier?", "Is H2O or H2O heavier?"))
    assert a.key != b.key and a.query == b.query and a.formula == b.formula


@pytest.mark.parametrize(("a", "b"), [
    ("What is 7 * 3?", "What is 7 - 3?"), ("What is 7 / 3?", "What is 7 + 3?"),
    ("Is 5 < 3?", "Is 5 > 3?"), ('print("a")', "print(a)"), ("a != b", "a = b"),
    ("What is x^2?", "What is x2?"), ("Is -5 less than 3?", "Is 5 less than 3?"),
])
def test_operators_change_the_key_and_the_formula(a: str, b: str) -> None:
    ca, cb = (chat_call("t", "m", [{"role": "user", "content": x}], BASE) for x in (a, b))
    assert ca.key != cb.key and ca.formula != cb.formula
    assert ca.scope == cb.scope  # both may be looked up semantically: the formula decides


def test_plain_prose_has_no_formula() -> None:
    for text in ("How do I use e-mail and/or km/h? I don't know.", "Hi! What's up?",
                 "What is the capital of France?", "Book 2 tickets for 3 May"):
        assert chat_call("t", "m", [{"role": "user", "content": text}], BASE).formula == ""


def test_defaults_are_filled_in_so_leaving_a_parameter_out_is_the_same_call() -> None:
    given_ = {**DEFAULTS, "temperature": 0.0}
    assert chat_call("t", "m", MSGS, {"temperature": 0}).key == chat_call(
        "t", "m", MSGS, given_).key
    assert chat_call("t", "m", MSGS, {"stop": "x"}).key == chat_call(
        "t", "m", MSGS, {"stop": ["x"]}).key


def test_roles_system_prompt_and_earlier_turns_matter() -> None:
    a = chat_call("t", "m", MSGS, BASE)
    as_assistant = [MSGS[0], {**MSGS[1], "role": "assistant"}]
    other_system = [{"role": "system", "content": "You are verbose."}, MSGS[1]]
    longer = [MSGS[0], {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}, MSGS[1]]
    for msgs in (as_assistant, other_system, longer):
        b = chat_call("t", "m", msgs, BASE)
        assert b.key != a.key and b.scope != a.scope
    assert chat_call("t", "m", as_assistant, BASE).scope is None  # no user question: no scope


def test_deterministic_means_temperature_zero_or_a_fixed_seed() -> None:
    assert chat_call("t", "m", MSGS, {"temperature": 0}).deterministic
    assert chat_call("t", "m", MSGS, {"temperature": 0.7, "seed": 3}).deterministic
    assert not chat_call("t", "m", MSGS, {"temperature": 0.7}).deterministic
    assert not chat_call("t", "m", MSGS, {}).deterministic  # the worker's default is 1.0


def test_completions_and_embeddings() -> None:
    a = completion_call("t", "m", "Once upon a time", BASE)
    # a raw prompt is continued as sent: a trailing space, "." or doubled space changes
    # what comes next (they shared a key, and one got the other's continuation)
    for other in ("Once upon a time ", "Once upon a time.", "Once  upon a time",
                  "once upon a TIME"):
        assert completion_call("t", "m", other, BASE).key != a.key, other
    assert completion_call("t", "m", "Once upon a time", BASE).key == a.key
    assert a.scope is None and a.query == ""  # never looked up by meaning
    assert a.key != chat_call("t", "m", [{"role": "user", "content": "Once upon a time"}],
                              BASE).key
    e = embedding_call("t", "m", ["Hello"])
    # embeddings hash the inputs as sent: "hello" embeds differently
    assert e.key != embedding_call("t", "m", ["hello"]).key and e.scope is None
    assert e.key != embedding_call("u", "m", ["Hello"]).key and e.deterministic
    assert e.bucket != embedding_call("u", "m", ["Hello"]).bucket


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_content_parts_that_are_not_text_change_the_key_and_the_scope() -> None:
    def ask(*parts: dict[str, Any]) -> Any:
        return chat_call("t", "m", [MSGS[0], {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"}, *parts]}], BASE)

    cat, dog = ask(image("https://x.test/cat.png")), ask(image("https://x.test/dog.png"))
    assert cat.key != dog.key and cat.scope != dog.scope  # same words, another picture
    again = ask(image("https://x.test/cat.png"))
    assert (again.key, again.scope) == (cat.key, cat.scope)


@given(texts=st.lists(words, min_size=2, max_size=4))
def test_text_parts_are_keyed_apart_and_read_as_the_model_reads_them(texts: list[str]) -> None:
    """The exact key holds each text part apart: ["cat", "fish"] shared a key with
    "cat\nfish" (the parts were joined by a line break for the key), whose answer it
    got, though the llama.cpp engine reads "catfish" and an upstream gets the parts.
    The semantic query is the parts as the engine reads them, with nothing between."""
    parts = [{"type": "text", "text": t} for t in texts]
    listed = chat_call("t", "m", [{"role": "user", "content": parts}], BASE)
    for joined in ("\n".join(texts), "".join(texts)):
        assert listed.key != chat_call("t", "m", [{"role": "user", "content": joined}],
                                       BASE).key, joined
    glued = chat_call("t", "m", [{"role": "user", "content": "".join(texts)}], BASE)
    assert (listed.scope, listed.query) == (glued.scope, glued.query)
    assert chat_call("t", "m", [{"role": "user", "content": parts}], BASE).key == listed.key
    other = chat_call("t", "m", [{"role": "user", "content": [*parts, {"type": "text",
                                                                       "text": "more"}]}], BASE)
    assert other.key != listed.key


def test_a_chat_past_max_read_bytes_is_keyed_as_sent_and_never_read_for_meaning() -> None:
    """Normalizing a 15 MiB message held the PoP's loop 8-14 s: a chat that large
    gets an exact key over its bytes (the same chat hits it) and no semantic key."""
    big = "Tell me  about it. " * (MAX_READ_BYTES // 16)
    call = chat_call("t", "m", [{"role": "user", "content": big}], {})
    assert call.scope is None and call.query == "" and call.said == ""
    assert call.key == chat_call("t", "m", [{"role": "user", "content": big}], {}).key
    # as sent: a change normalizing would erase (case, spacing) is another key
    assert call.key != chat_call("t", "m", [{"role": "user", "content": big.lower()}], {}).key
    assert call.key != chat_call("u", "m", [{"role": "user", "content": big}], {}).key
    small = chat_call("t", "m", [{"role": "user", "content": "Tell me about it."}], {})
    assert small.scope is not None and small.query


def test_a_last_message_past_max_semantic_chars_has_an_exact_key_only() -> None:
    """The embedding model takes at most 32 Ki characters (and reads 256 tokens):
    a longer question is never sent to it by the semantic cache."""
    from runtime.cache.ai.keys import MAX_SEMANTIC_CHARS

    long = chat_call("t", "m", [{"role": "user", "content": "x" * (MAX_SEMANTIC_CHARS + 1)}], {})
    assert long.scope is None and long.query == "" and long.key
    at = chat_call("t", "m", [{"role": "user", "content": "x" * MAX_SEMANTIC_CHARS}], {})
    assert at.scope is not None and at.query
