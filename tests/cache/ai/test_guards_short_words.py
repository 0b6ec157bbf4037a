"""The scope guard forgives a one-letter typo only between words of five letters
or more: among short words one edit apart are other things ("cat" / "rat",
"car" / "cat"), and a word of five letters is not a typo of a four-letter one
("plane" / "lane").

Serving "How do I feed my rat?" the answer cached for "How do I feed my cat?"
would answer another question, so such pairs must be vetoed in either order,
while a real typo of a long word ("recieve") still passes.
"""

from __future__ import annotations

import pytest

from runtime.cache.ai.guards import veto

SHORT_SWAPS = [
    # (query, cached): short content words one edit apart, another thing each
    ("How do I feed my cat?", "How do I feed my rat?"),
    ("How do I wash a car?", "How do I wash a cat?"),
    ("How do I wash a dog?", "How do I wash a dgo?"),
    # one side long enough to be a typo, the other not
    ("How do I fix a plane?", "How do I fix a lane?"),
    ("How do I paint a chair?", "How do I paint a hair?"),
]

LONG_TYPOS = [
    # (query, cached): one letter off, or two swapped, in a word of 5+ letters
    ("How do I recieve a parcel?", "How do I receive a parcel?"),
    ("What's the recomended dose of vitamin D?", "What's the recommended dose of vitamin D?"),
]


@pytest.mark.parametrize(("query", "cached"), SHORT_SWAPS)
def test_short_words_one_edit_apart_are_a_swap(query: str, cached: str) -> None:
    assert veto(query, cached) == "scope"
    assert veto(cached, query) == "scope"


@pytest.mark.parametrize(("query", "cached"), LONG_TYPOS)
def test_a_typo_of_a_long_word_passes(query: str, cached: str) -> None:
    assert veto(query, cached) is None
    assert veto(cached, query) is None
