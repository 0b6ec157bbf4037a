"""Properties of `normalize` and `veto` (hypothesis)."""

from __future__ import annotations

import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cache.ai import lexicon as lx
from runtime.cache.ai.guards import GUARDS, normalize, veto

# Words that wake every guard, and plain ones, so random prompts reach the guards.
_GUARD_WORDS = sorted({"not", "never", "don't", "without", "no", "only", "except",
                       "at least", "at most", "more", "less", "cheaper", "best", "worst",
                       "before", "after", "turn on", "turn off", "from", "to", "a dozen",
                       "twice", "2", "3.12", "15%", "$5", "5 km", "miles", "°C", "°F",
                       "next week", "tomorrow", "July", "may", "Python", "iPhone",
                       "useEffect", "os.path", "gluten-free", "a day", "daily"}
                      | set(list(lx.POLARITY)[:40]) | set(list(lx.UNITS)[:30]))
_PLAIN = ["how", "do", "i", "reset", "my", "password", "cake", "bake", "the", "egg",
          "recipe", "flight", "Paris", "hotel", "rice", "cook", "price", "cost"]
prompts = st.lists(st.sampled_from(_GUARD_WORDS + _PLAIN), min_size=1, max_size=10).map(
    " ".join)


@settings(max_examples=300)
@given(st.text())
def test_normalize_is_idempotent_and_nfkc(text: str) -> None:
    once = normalize(text)
    assert normalize(once) == once
    assert unicodedata.normalize("NFKC", once) == once


@settings(max_examples=300)
@given(st.text(st.characters(codec="latin-1")))
def test_normalize_ignores_case(text: str) -> None:
    assert normalize(text.upper()) == normalize(text.lower()) == normalize(text)


@given(st.lists(st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1),
                min_size=1, max_size=6),
       st.lists(st.sampled_from([" ", "  ", "\t", "\n", " \u00a0", "\u3000"]),
                min_size=7, max_size=7))
def test_normalize_ignores_extra_whitespace(words: list[str], gaps: list[str]) -> None:
    spaced = gaps[0] + "".join(w + g for w, g in zip(words, gaps[1:], strict=False))
    assert normalize(spaced) == normalize(" ".join(words)) == " ".join(words).lower()


@settings(max_examples=300)
@given(st.text(st.characters(codec="ascii", exclude_characters=" ")))
def test_normalize_ignores_compatibility_forms(text: str) -> None:
    """Full-width ASCII (NFKC) and decomposed accents (NFKD) fold to the same text."""
    fullwidth = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)
    assert normalize(fullwidth) == normalize(text)
    accented = unicodedata.normalize("NFKD", "Café déjà " + text)
    assert normalize(accented) == normalize("cafe deja " + text)


@settings(max_examples=300)
@given(st.one_of(prompts, st.text()))
def test_a_prompt_never_vetoes_itself(text: str) -> None:
    assert veto(text, text) is None
    assert veto(text, normalize(text)) is None


@settings(max_examples=500)
@given(prompts, prompts)
def test_veto_is_symmetric(a: str, b: str) -> None:
    assert (veto(a, b) is None) == (veto(b, a) is None)


_NUMBERISH = st.lists(st.one_of(st.text("0123456789.,%$k", min_size=1, max_size=40),
                                st.integers(1, 500).map(lambda n: "9" * n),
                                st.sampled_from(["thousand", "dozen", "a", "twenty", "five",
                                                 "second", "per", "km", "°", "am", "from",
                                                 "to", "I'd", "C++", "os.path", "()"])),
                      max_size=12).map(" ".join)


@settings(max_examples=300)
@given(st.one_of(_NUMBERISH, st.text()), st.one_of(_NUMBERISH, st.text()))
def test_veto_never_raises(a: str, b: str) -> None:
    """Huge numbers ("9" * 400 + " thousand" once overflowed), odd symbols, any text."""
    assert veto(a, b) in {None} | {name for name, _ in GUARDS}
