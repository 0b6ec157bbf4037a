"""Each guard of the semantic cache: a near-miss pair it must veto and a
paraphrase pair (the same feature, worded otherwise) it must let through.

None of these pairs is in bench/data/semantic_eval.jsonl.
"""

from __future__ import annotations

import pytest

from runtime.cache.ai.guards import GUARDS, normalize, veto

VETOED = [
    # (query, cached, the guard that must refuse)
    ("Why does my dishwasher drain?", "Why doesn't my dishwasher drain?", "negation"),
    ("Can I park here overnight?", "Can I never park here overnight?", "negation"),
    ("How do I turn on location services?", "How do I turn off location services?",
     "polarity"),
    ("Should I buy bitcoin now?", "Should I sell bitcoin now?", "polarity"),
    ("How do I lock the front door remotely?", "How do I unlock the front door remotely?",
     "polarity"),
    ("How do I turn left at a roundabout?", "How do I turn right at a roundabout?",
     "polarity"),  # a semantic hit at similarity 0.956 before
    ("Do I loosen the bolt clockwise?", "Do I loosen the bolt counterclockwise?", "polarity"),
    ("How long to bake 2 potatoes?", "How long to bake 5 potatoes?", "number"),
    ("Plan a dinner for a dozen guests", "Plan a dinner for twenty guests", "number"),
    ("Is it bad to water cacti twice a month?", "Is it bad to water cacti thrice a month?",
     "number"),
    ("Book a table for Friday evening", "Book a table for Saturday evening", "date"),
    ("What's the traffic like this morning?", "What's the traffic like tomorrow morning?",
     "date"),
    ("Are flights cheap in October?", "Are flights cheap in February?", "date"),
    ("How heavy is 3 kg of apples?", "How heavy is 3 lb of apples?", "unit"),
    ("Convert 40 °C to kelvin", "Convert 40 °F to kelvin", "unit"),
    ("Convert 10 euros to dollars", "Convert 10 dollars to euros", "unit"),
    ("How do I update Kubernetes on AWS?", "How do I update Kubernetes on Azure?", "entity"),
    ("Does the Pixel 8 support eSIM?", "Does the Galaxy 8 support eSIM?", "entity"),
    ("What does useMemo do?", "What does useCallback do?", "entity"),
    ("How do I read a file in C++?", "How do I read a file in C#?", "entity"),
    ("What does os.path.join return?", "What does os.path.split return?", "entity"),
    ("Who is Conan O'Brien married to?", "Who is Conan Doyle married to?", "entity"),
    ("What is the cheapest hotel in Oslo?", "What is the most expensive hotel in Oslo?",
     "comparative"),
    ("Should I eat before swimming?", "Should I eat after swimming?", "comparative"),
    ("Which rivers are longer than the Rhine?", "Which rivers are shorter than the Rhine?",
     "comparative"),
    ("List vegan soups without garlic", "List vegan soups", "constraint"),
    ("Find laptops with at least 16 GB RAM", "Find laptops with at most 16 GB RAM",
     "constraint"),
    ("Show flights with only direct routes", "Show flights including direct routes",
     "constraint"),
    ("How do I move files from Dropbox to Google Drive?",
     "How do I move files from Google Drive to Dropbox?", "direction"),
    # the same words and numbers, two of them swapped around a relation word
    ("Is 4 smaller than 9?", "Is 9 smaller than 4?", "number"),
    ("Is May 4 before May 14?", "Is May 14 before May 4?", "number"),
    ("Is Kotlin slower than Scala?", "Is Scala slower than Kotlin?", "order"),
    ("Did Spain beat Italy in the final?", "Did Italy beat Spain in the final?", "order"),
    ("Did the Yankees lose to the Red Sox?", "Did the Red Sox lose to the Yankees?", "order"),
    ("Pros of Vue vs Svelte", "Pros of Svelte vs Vue", "order"),
    ("How do I convert JSON to YAML?", "How do I convert YAML to JSON?", "order"),
    ("Convert a list into a dict in Python", "Convert a dict into a list in Python", "order"),
    ("Did Lincoln serve before Grant?", "Did Grant serve before Lincoln?", "order"),
    ("How do I descale a kettle?", "How do I descale a coffee machine?", "scope"),
    ("How often should I feed a goldfish?", "How often should I feed a turtle?", "scope"),
    # after the stopword and differ/difference folding, a swap is still a swap
    ("How do Python lists differ from sets?", "python list vs tuple difference", "scope"),
]

PASSED = [
    # (query, cached): paraphrases each guard must let through
    ("Why won't the dishwasher drain?", "why does the dishwasher not drain"),
    ("How do I switch on location services?", "how can I enable location services"),
    ("How long to bake 2 potatoes?", "baking time for two potatoes?"),
    ("Plan a dinner for a dozen guests", "plan a dinner for 12 guests please"),
    ("Book a table for Friday evening", "Could you book a table for Friday evening?"),
    ("How heavy is 3 kg of apples?", "what does 3 kilograms of apples weigh"),
    ("How do I update Kubernetes on AWS?", "how to update kubernetes on aws"),
    ("What is the cheapest hotel in Oslo?", "Which hotel in Oslo is the least expensive?"),
    ("Find laptops with at least 16 GB RAM", "find laptops with a minimum of 16 gigabytes RAM"),
    ("How do I move files from Dropbox to Google Drive?",
     "Moving files from Dropbox to Google Drive, how?"),
    ("How do I descale a kettle?", "How can I descale my kettle?"),
    ("How often should I feed a goldfish?", "how often should i feed a gold fish"),
    ("What's the recomended dose of vitamin D?", "What's the recommended dose of vitamin D?"),
    ("So what am I allowed to bring on board?", "what i'm allowed to bring on board"),
    ("Which documents I'd need for a passport renewal?", "documents needed for passport renewal"),
    # An inflected stopword ("lists", "gives") is a stopword: the stem is checked too
    ("How do I sort lists in Python?", "python code to sort a list"),
    ("What gives bread its crust?", "bread crust: give me the chemistry"),
    ("Which snacks are provided on the flight?", "snacks the airline will provide on a flight"),
    # differ, differs, difference, differences, different are one word
    ("How does a crocodile differ from an alligator?",
     "crocodile vs alligator: what's the difference"),
    ("How do Rust vectors differ from slices?", "rust vector vs slice differences"),
    # a relation whose sides are not swapped, or a question that names both ways round
    ("Is Kotlin slower than Scala?", "is kotlin much slower than scala"),
    ("Did Spain beat Italy in the final?", "In the final, did Spain beat Italy?"),
    ("What's the difference between TCP and UDP?", "What's the difference between UDP and TCP?"),
    ("Which is faster, Rust or Go?", "Which is faster, Go or Rust?"),
    ("Is Rust faster than Go, or Go faster than Rust?", "Is Go faster than Rust?"),
    ("How do I get to the airport from the hotel?", "how do i get from the hotel to the airport"),
    ("java: how to turn a string into an integer", "How do I convert a string to an integer in Java?"),
    ("Is Python 3.12 faster than Python 3.11?", "is python 3.12 quicker than python 3.11"),
]


@pytest.mark.parametrize(("query", "cached", "guard"), VETOED)
def test_guard_vetoes_a_near_miss(query: str, cached: str, guard: str) -> None:
    assert veto(query, cached) == guard
    assert veto(cached, query) is not None


@pytest.mark.parametrize(("query", "cached"), PASSED)
def test_guards_pass_a_paraphrase(query: str, cached: str) -> None:
    assert veto(query, cached) is None
    assert veto(cached, query) is None


def test_every_guard_has_a_near_miss_case() -> None:
    assert {name for name, _ in GUARDS} == {guard for _, _, guard in VETOED}


@pytest.mark.parametrize(("query", "cached", "guard"), VETOED)
def test_names_are_found_when_the_cached_prompt_is_normalized(query: str, cached: str,
                                                              guard: str) -> None:
    """The cache may store the normalized prompt: a vetoed pair stays vetoed."""
    assert veto(query, normalize(cached)) is not None


NAMES_SWAPPED = [
    # the same names in the other order, no relation word between them
    ("Did Google buy YouTube?", "Did YouTube buy Google?"),
    ("Does Microsoft own GitHub?", "Does GitHub own Microsoft?"),
    ("Is Pluto a moon of Neptune?", "Is Neptune a moon of Pluto?"),
    ("Can Alice read Bob's messages?", "Can Bob read Alice's messages?"),
    ("Why did Nokia sell its phones business to Microsoft?",
     "Why did Microsoft sell its phones business to Nokia?"),
]


@pytest.mark.parametrize(("query", "cached"), NAMES_SWAPPED)
def test_the_same_names_in_another_order_are_vetoed(query: str, cached: str) -> None:
    assert veto(query, cached) == "order"
    assert veto(cached, query) == "order"


@pytest.mark.parametrize(("query", "cached"), [
    ("Did Google buy YouTube?", "Has Google bought YouTube?"),  # same order
    ("Did Google buy YouTube? Google said yes", "Did Google buy YouTube?"),  # a name again
    ("Is Rust fast?", "Is Rust fast or not?"),  # one name: no order to swap
])
def test_names_in_the_same_order_pass_the_order_guard(query: str, cached: str) -> None:
    assert veto(query, cached) != "order"


@pytest.mark.parametrize(("query", "cached"),
                         [(q, c) for q, c, guard in VETOED if guard == "order"])
def test_a_swap_is_vetoed_between_two_normalized_prompts(query: str, cached: str) -> None:
    """The cache compares two normalized prompts: no case is left to find names by,
    so the order guard reads words, not names."""
    assert veto(normalize(query), normalize(cached)) == "order"
