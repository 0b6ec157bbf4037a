"""Prompt text folded for the AI caches: `normalize` (what both caches hash and
embed) and `tokens` (the words the semantic cache's guards read)."""

from __future__ import annotations

import re
import unicodedata

# Punctuation that never changes a prompt's meaning goes; what can ("c++", "c#",
# "15%", "$5", "3.12", "°c", "don't", "usb-c", "os.path", "km/h") stays.
_DROP = re.compile(r"[^\w\s'%$€£¥°+#./_-]")
_EDGE = re.compile(r"(?<!\w)[.'/_-]+|[.'/_-]+(?!\w)")
_QUOTES = str.maketrans({"‘": "'", "’": "'", "ʼ": "'", "`": "'", "´": "'",
                         "‐": "-", "‑": "-", "‒": "-", "–": "-", "—": "-"})
_TOKEN = re.compile(r"\d+(?:\.\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?|[%$€£¥°+#]")
_CONTRACTED = frozenset({"s", "m", "re", "ve", "ll", "d"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    text = _EDGE.sub(" ", _DROP.sub(" ", _THOUSANDS.sub("", text)))
    return " ".join(text.split())


def normalize(text: str) -> str:
    """`text` with unicode compatibility forms, case, diacritics, quotes and dashes,
    punctuation that carries no meaning, thousands separators ("1,000" → "1000")
    and runs of whitespace folded: what the
    exact and semantic caches hash and embed. Idempotent; never raises."""
    for _ in range(4):  # case and unicode folds can feed each other; settle them
        folded = _fold(text)
        if folded == text:
            break
        text = folded
    return text


def tokens(normalized: str) -> list[str]:
    """The words, numbers and symbols of a `normalize`d text. Digits split from
    letters ("5km" → 5, km; "v15" → v, 15); a contraction splits off "n't" and
    drops "'s", "'re", ...."""
    out: list[str] = []
    for t in _TOKEN.findall(normalized):
        if "'" in t:
            base, _, tail = t.partition("'")
            if tail == "t" and base.endswith("n"):
                out += [base[:-1] or base, "n't"]
                continue
            if tail in _CONTRACTED:
                out.append(base)
                continue
        out.append(t)
    return out
