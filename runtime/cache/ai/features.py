"""What the semantic cache's guards compare: the features of one prompt.

`features(text)` reads a prompt once (cached per text) into a `Features`: its
negation count, the axes its polarity and comparative words take, its numbers
(in order), dates, units, named entities, constraint words, a from/to direction,
the words on either side of its relation words ("than", "beat", "vs", "to") and
its content words. The word lists are in `runtime.cache.ai.lexicon`.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache
from typing import NamedTuple

from . import lexicon as lx
from .text import normalize, tokens

type Axes = frozenset[tuple[str, int]]
type Relation = tuple[str, frozenset[str], frozenset[str]]  # (relation, before, after)


class Features(NamedTuple):
    """One prompt as the guards see it (all fields are compared between two)."""

    words: frozenset[str]            # every token, for the entity check
    negations: int                   # not, never, n't, ... (compared by parity)
    polarity: Axes                   # (axis, sign): enable/disable, buy/sell, ...
    comparative: Axes                # (axis, sign): cheaper/cheapest, before/after, ...
    numbers: tuple[str, ...]         # canonical numbers in order: "2" for 2, two, twice
    dates: frozenset[str]            # months, weekdays, "next-week", seasons, am/pm
    units: tuple[frozenset[str], frozenset[str]]  # (after a number, elsewhere)
    entities: tuple[tuple[str, ...], ...]  # capitalised/CamelCase/code names, folded
    name_pairs: frozenset[tuple[tuple[str, ...], tuple[str, ...]]]  # (x, y): x named first
    constraints: frozenset[str]      # only, except, include, at_least, without, ...
    direction: tuple[str, str] | None  # "from X ... to Y" content words
    relations: frozenset[Relation]   # ("than", {rust}, {go}) for "Rust faster than Go"
    content: frozenset[str]          # the rest: stemmed, synonyms folded


CACHED_CHARS = 2048  # longer prompts are read each time: the cache holds 4096 at most


def features(text: str) -> Features:
    """The features of prompt `text` (raw or already normalized), remembered for
    the last 4096 prompts of up to `CACHED_CHARS`. Never raises."""
    return _cached(text) if len(text) <= CACHED_CHARS else _read(text)


def clear_cache() -> None:
    """Forget the remembered features (for measurements)."""
    _cached.cache_clear()


def _read(text: str) -> Features:
    norm = normalize(text)
    toks = tokens(norm)
    phrased = _phrases(toks)
    numbers, number_at = _numbers(toks)
    names = _names(text, frozenset(toks))
    return Features(
        words=frozenset(toks),
        negations=sum(t in lx.NEGATIONS for t in toks),
        polarity=_axes(phrased, lx.POLARITY, degree=False),
        comparative=_axes(phrased, lx.COMPARATIVE, degree=True),
        numbers=tuple(numbers),  # in order: "5 bigger than 3" is not "3 bigger than 5"
        dates=_dates(toks),
        units=_units(toks, number_at),
        entities=tuple(n for n, _, _ in names),
        name_pairs=_name_pairs(text, names),
        constraints=_constraints(phrased, norm),
        direction=_direction(toks),
        relations=_relations(toks),
        content=_content(phrased),
    )


_cached = lru_cache(maxsize=4096)(_read)


# Phrases of two words that the tables name ("turn on", "at least", "went up").
_PHRASES = frozenset(w for table in (lx.POLARITY, lx.COMPARATIVE, lx.CONSTRAINTS)
                     for w in table if " " in w)
_PHRASE_STARTS = frozenset(p.split()[0] for p in _PHRASES)


def _phrases(toks: list[str]) -> list[str]:
    """`toks` with the tables' two- and three-word phrases joined into one item."""
    out: list[str] = []
    i = 0
    while i < len(toks):
        for n in (3, 2) if toks[i] in _PHRASE_STARTS else ():
            p = " ".join(toks[i:i + n])
            if len(toks) - i >= n and p in _PHRASES:
                out.append(p)
                i += n
                break
        else:
            out.append(toks[i])
            i += 1
    return out


def _axes(items: list[str], table: dict[str, tuple[tuple[str, int], ...]],
          degree: bool) -> Axes:
    """The (axis, sign) pairs of `items`; with `degree`, "more/less X" takes X's
    axis (sign flipped by less/least) instead of counting "more" on its own."""
    out: set[tuple[str, int]] = set()
    skip = False
    for i, w in enumerate(items):
        if skip:
            skip = False
            continue
        nxt = items[i + 1] if i + 1 < len(items) else ""
        if degree and w in lx.DEGREE and nxt in table and nxt not in lx.DEGREE:
            out |= {(axis, sign * lx.DEGREE[w]) for axis, sign in table[nxt]}
            skip = True
        elif w in table:
            out |= set(table[w])
    return frozenset(out)


_DIGITS = re.compile(r"\d+(?:\.\d+)*")
_WORD_VALUES = lx.UNITS_WORDS | lx.ORDINALS


def _numbers(toks: list[str]) -> tuple[list[str], set[int]]:
    """The canonical numbers in `toks` ("12" for 12, twelve, a dozen) and the
    index of the last token of each."""
    out: list[str] = []
    at: set[int] = set()
    i = 0
    while i < len(toks):
        value, j = _number_at(toks, i)
        if value is None:
            i += 1
            continue
        out.append(value)
        at.add(j - 1)
        i = j
    return out, at


def _number_at(toks: list[str], i: int) -> tuple[str | None, int]:
    """``(canonical number, index after it)`` for a number starting at `i`, or
    ``(None, i)``."""
    t = toks[i]
    nxt = toks[i + 1] if i + 1 < len(toks) else ""
    if _DIGITS.fullmatch(t):
        if nxt not in lx.MULTIPLIERS:
            return t.lstrip("0") or "0", i + 1
        value, j = float(t) if t.count(".") < 2 else 0.0, i + 1
    elif t in lx.UNITS_WORDS or (t in lx.ORDINALS and _ordinal(toks, i)):
        value, j = float(_WORD_VALUES[t]), i + 1
        while j < len(toks) and toks[j] in lx.UNITS_WORDS and lx.UNITS_WORDS[toks[j]] < 10 \
                and value >= 20 and value % 10 == 0:
            value += lx.UNITS_WORDS[toks[j]]  # twenty five
            j += 1
    elif t in ("a", "an", "one") and nxt in lx.MULTIPLIERS and nxt != "k":
        value, j = 1.0, i + 1
    else:
        return None, i
    while j < len(toks) and toks[j] in lx.MULTIPLIERS and (toks[j] != "k" or j == i + 1):
        value *= lx.MULTIPLIERS[toks[j]]
        j += 1
    return (str(int(value)) if value.is_integer() else str(value)), j


def _ordinal(toks: list[str], i: int) -> bool:
    """Whether an ordinal word at `i` is one: "second" after a/per/each or a number
    is the unit."""
    prev = toks[i - 1] if i else ""
    return toks[i] != "second" or (prev not in lx.RATE_MARKERS
                                   and not _DIGITS.fullmatch(prev))


_DATE_KEYS = (set(lx.MONTHS) | set(lx.WEEKDAYS) | set(lx.DATE_WORDS) | set(lx.AMBIGUOUS_MONTHS)
              | lx.RELATIVE | {"fall", "am", "pm", "new"})


def _dates(toks: list[str]) -> frozenset[str]:
    """Months, weekdays, relative days ("next-week"), seasons, holidays, parts of
    the day and am/pm, each by its canonical name."""
    out: set[str] = set()
    for i, t in enumerate(toks):
        if t not in _DATE_KEYS:
            continue
        prev = toks[i - 1] if i else ""
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        name = lx.MONTHS.get(t) or lx.WEEKDAYS.get(t) or lx.DATE_WORDS.get(t)
        if t in lx.AMBIGUOUS_MONTHS and (prev in {"in", "of", "early", "late", "mid", "since",
                                                  "until", "by", "during"}
                                         or _DIGITS.fullmatch(prev) or _DIGITS.fullmatch(nxt)):
            name = t
        elif t == "fall" and prev in lx.RELATIVE | {"in", "the"}:
            name = "autumn"
        elif t in ("am", "pm") and _DIGITS.fullmatch(prev):
            name = t
        elif t == "new" and nxt in ("year", "years"):
            name = "new-year"
        if t in lx.RELATIVE and nxt in lx.RELATIVE_UNITS:
            rel = {"past": "last", "previous": "last", "coming": "next"}.get(t, t)
            out.add(f"{rel}-{lx.WEEKDAYS.get(nxt, nxt)}")
        if name:
            out.add(name)
    return frozenset(out)


_UNIT_KEYS = set(lx.RATES) | set(lx.UNITS) | set(lx.AMBIGUOUS_UNITS)
_FILLERS = lx.UNIT_FILLERS | {"°"}


def _units(toks: list[str], number_at: set[int]) -> tuple[frozenset[str], frozenset[str]]:
    """``(units right after or before a number, other units)``: "5 km in miles" →
    ({km}, {mile}); "a day" and "daily" → per-day among the others."""
    attached: set[str] = set()
    free: set[str] = set()
    for i, t in enumerate(toks):
        if t not in _UNIT_KEYS:
            continue
        prev = i - 1
        while prev >= 0 and toks[prev] in _FILLERS:
            prev -= 1
        after_number = prev in number_at
        if t in lx.RATES:
            free.add("per-" + lx.RATES[t])
        elif t in lx.UNITS or (t in lx.AMBIGUOUS_UNITS and after_number):
            unit = lx.UNITS.get(t) or lx.AMBIGUOUS_UNITS[t]
            before_number = i + 1 in number_at or (i + 1 < len(toks)
                                                   and _DIGITS.fullmatch(toks[i + 1]))
            (attached if after_number or before_number else free).add(unit)
        elif t in lx.AMBIGUOUS_UNITS and prev >= 0 and toks[prev] in lx.RATE_MARKERS:
            free.add("per-" + lx.AMBIGUOUS_UNITS[t])
    return frozenset(attached), frozenset(free)


_RAW = re.compile(r"[^\W_][\w'\u2019.+#-]*")
_SENTENCE_ENDS = frozenset(".?!:;\n")


def _names(text: str, words: frozenset[str]) -> list[tuple[tuple[str, ...], int, int]]:
    """The names in the raw `text` with where each starts and ends, each as its
    folded tokens less the numbers, units, dates and other words another guard
    compares: capitalised words not starting a sentence, CamelCase and acronyms
    anywhere, code identifiers (``snake_case``, ``os.path``, ``f()``). Only parts
    among the prompt's own `words` count (the raw text splits a few characters
    otherwise)."""
    out: list[tuple[tuple[str, ...], int, int]] = []
    if text.islower() and "_" not in text and "." not in text and "(" not in text:
        return out  # no capital and nothing code-like: a normalized prompt, say
    for m in _RAW.finditer(text):
        tok = m.group().rstrip(".'\u2019-")
        if not tok or tok.islower() or tok.isdigit():
            if tok and _is_code(text, m.end(), tok):
                out.append((tuple(t for t in _fold_name(tok) if t in words), m.start(),
                            m.end()))
            continue
        j = m.start() - 1
        while j >= 0 and text[j].isspace():
            j -= 1
        if _is_name(tok, initial=j < 0 or text[j] in _SENTENCE_ENDS) \
                or _is_code(text, m.end(), tok):
            parts = tuple(t for t in _fold_name(tok)
                          if t in words and not _DIGITS.fullmatch(t) and t not in _GUARDED)
            if parts:
                out.append((parts, m.start(), m.end()))
    return out


def _name_pairs(text: str, names: list[tuple[tuple[str, ...], int, int]]
                ) -> frozenset[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(x, y) for each name x followed by another name y with more than a list's
    joints between them: "Google buy YouTube" gives (google, youtube); "TCP and
    UDP", "Rust, Go or Zig" give nothing (a list names things in no order)."""
    pairs = set()
    for (x, _, end), (y, start, _) in itertools.pairwise(names):
        if x != y and not _LIST_JOINT.fullmatch(text[end:start]):
            pairs.add((x, y))
    return frozenset(pairs)


# what may stand between two names of one list: "A and B", "A, B or C", "A & the B"
_LIST_JOINT = re.compile(r"(?:[\s,/&'\u2019s]|\b(?:and|or|nor|the|a|an)\b)*", re.IGNORECASE)


def _fold_name(tok: str) -> list[str]:
    """The tokens of one raw word (only those also in the prompt's tokens count,
    so ASCII can skip `normalize`: its punctuation never makes a token)."""
    return tokens(tok.lower() if tok.isascii() else normalize(tok))


def _is_name(tok: str, initial: bool) -> bool:
    """CamelCase and acronyms anywhere (iPhone, useEffect, TCP, USB-C), a
    capitalised word (not "I", "I'm") anywhere but at the start of a sentence."""
    if len(tok) < 2 or tok.partition("'")[0] == "I" or not tok[0].isalpha():
        return False
    return (not tok[1:].islower() and any(c.isupper() for c in tok[1:])) \
        or (tok[0].isupper() and not initial)


def _is_code(text: str, end: int, tok: str) -> bool:
    """snake_case, dotted names, calls, and names with + or # (C++, C#, F#)."""
    return "_" in tok or "+" in tok or "#" in tok or ("." in tok and bool(_DOTTED.search(tok))) \
        or text[end:end + 2] == "()"


_DOTTED = re.compile(r"[a-zA-Z]\.[a-zA-Z]")


def _constraints(items: list[str], norm: str) -> frozenset[str]:
    """only, except, include, at_least, at_most, exactly, without ("no", "with no",
    and "-free" compounds such as gluten-free)."""
    out = {lx.CONSTRAINTS[w] for w in items if w in lx.CONSTRAINTS}
    if re.search(r"\w-free\b", norm):
        out.add("without")
    return frozenset(out)


def _direction(toks: list[str]) -> tuple[str, str] | None:
    """The first content words after "from" and after a later "to", if both."""
    if "from" not in toks:
        return None
    i = toks.index("from")
    if "to" not in toks[i + 1:]:
        return None
    j = toks.index("to", i + 1)
    src = _next_content(toks, i + 1)
    dst = _next_content(toks, j + 1)
    return (src, dst) if src and dst else None


def _relations(toks: list[str]) -> frozenset[Relation]:
    """Each relation word (`lx.RELATIONS`) with the words it relates: the run of
    words right before it and the run right after it, past articles, auxiliaries,
    negations and comparatives, stemmed ("is Rust much faster than Go" →
    ("than", {rust}, {go})). A word on both sides ("Python 3.12 faster than Python
    3.11": python) says nothing of the order and is left out; only relations with
    words left on both sides count."""
    out = set()
    for i, t in enumerate(toks):
        if t in lx.RELATIONS:
            before, after = _run(toks, i - 1, -1), _run(toks, i + 1, 1)
            if before - after and after - before:
                out.add((lx.RELATIONS[t], before - after, after - before))
    return frozenset(out)


_RELATION_SKIPS = lx.RELATION_FILLERS | lx.NEGATIONS | set(lx.COMPARATIVE) | set(lx.DEGREE)


def _run(toks: list[str], i: int, step: int) -> frozenset[str]:
    """The stems of the words from `i` on (`step` -1: backwards) up to the next
    function word (`lx.RELATION_BOUNDS`) or relation word, `_RELATION_SKIPS`
    passed over ("Messi has more goals than": {goal, messi})."""
    out = set()
    while 0 <= i < len(toks) and toks[i] not in lx.RELATIONS \
            and toks[i] not in lx.RELATION_BOUNDS:
        if toks[i] not in _RELATION_SKIPS:
            out.add(_stem(toks[i]))
        i += step
    return frozenset(out)


def _next_content(toks: list[str], i: int) -> str | None:
    for t in toks[i:]:
        if t not in lx.STOPWORDS:
            return _stem(t)
    return None


_GUARDED = (lx.NEGATIONS | set(lx.POLARITY) | set(lx.COMPARATIVE) | set(lx.DEGREE)
            | set(lx.UNITS_WORDS) | set(lx.MULTIPLIERS) | set(lx.ORDINALS)
            | set(lx.MONTHS) | set(lx.WEEKDAYS) | set(lx.DATE_WORDS) | set(lx.RATES)
            | set(lx.UNITS) | set(lx.CONSTRAINTS) | lx.RELATIVE)
_NOT_CONTENT = _GUARDED | lx.STOPWORDS


def _content(items: list[str]) -> frozenset[str]:
    """The words no other guard reads, stemmed with synonyms folded. An inflected
    stopword ("lists", "gives", "provided") is a stopword too: one prompt says
    "list", the other "lists", and only one of them would count otherwise."""
    out = set()
    for w in items:
        if w in _NOT_CONTENT or len(w) < 2 or not w.isalpha():
            continue
        w = lx.SYNONYMS.get(w, w)
        base = _uninflect(w)
        if base in lx.STOPWORDS or (base != w and base + "e" in lx.STOPWORDS
                                    and w.endswith(("ing", "ed"))):
            continue
        stem = _drop_e(base)
        out.add(lx.SYNONYMS.get(stem, stem))
    return frozenset(out)


def _stem(w: str) -> str:
    """A light suffix stripper: both prompts go through it, so it need only be
    consistent ("stretching"/"stretch", "bonds"/"bond", "baking"/"bake" → "bak")."""
    return _drop_e(_uninflect(w))


def _uninflect(w: str) -> str:
    """`w` less one inflection (-ies, -ing, -ed, -es, -s): "lists" → "list",
    "running" → "run", "provided" → "provid", "gives" → "give"."""
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            if suffix == "s" and w.endswith(("ss", "us", "is")):
                return w
            if suffix == "es" and not w.endswith(("sses", "xes", "ches", "shes", "oes")):
                continue
            w = w[: len(w) - len(suffix)] + keep
            if suffix in ("ing", "ed") and len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]  # running → run
            break
    return w


def _drop_e(w: str) -> str:
    return w[:-1] if w.endswith("e") and len(w) > 3 else w  # move, moving → mov
