"""Prompt text folded for the AI caches: `exact` (what the exact cache hashes),
`normalize` (what the semantic cache embeds and its guards read, as `tokens`) and
`formula` (the numbers and operators a semantic hit must share)."""

from __future__ import annotations

import functools
import re
import unicodedata

# Punctuation that never changes a prompt's meaning goes; what can ("c++", "c#",
# "15%", "$5", "3.12", "°c", "don't", "usb-c", "os.path", "km/h") stays.
# One pass: what never carries meaning, and . ' / - not between two word characters
# (a dropped character becomes a space, so the look-arounds see what they would
# after dropping it).
_PUNCT = re.compile(r"[^\w\s'%$€£¥°+#./-]+|(?<!\w)[.'/-]+|[.'/-]+(?!\w)")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "`": "'",
                         "\u00b4": "'", "\u2010": "-", "\u2011": "-", "\u2012": "-",
                         "\u2013": "-", "\u2014": "-"})
_TOKEN = re.compile(r"\d+(?:\.\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?|[%$€£¥°+#]")
_CONTRACTED = frozenset({"s", "m", "re", "ve", "ll", "d"})
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _fold(text: str) -> str:
    if text.isascii():  # NFKC is the identity and casefold is lower
        text = text.lower().replace("`", "'")
    else:
        text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
        text = "".join(c for c in text if not unicodedata.combining(c))
        text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    return " ".join(_PUNCT.sub(" ", _THOUSANDS.sub("", text)).split())


def normalize(text: str) -> str:
    """`text` with unicode compatibility forms, case, diacritics, quotes and dashes,
    punctuation that carries no meaning, thousands separators ("1,000" → "1000")
    and runs of whitespace folded: what the exact and semantic caches hash and
    embed. Idempotent; never raises."""
    if text.isascii():
        return _fold(text)  # one pass settles ASCII: every . ' / - kept sits between
    for _ in range(4):      # two word characters, which no pass changes
        folded = _fold(text)  # case and unicode folds can feed each other: settle them
        if folded == text:
            break
        text = folded
    return text


def exact(text: str) -> str:
    """`text` as the exact cache's key reads it: canonically equivalent forms made
    one (NFC: a precomposed "é" and "e" + a combining accent are the same text) and
    the whitespace around it dropped; every other character kept, case, spaces
    and line breaks inside it, and its closing punctuation included. Folding more
    served wrong answers: NFKC made "3²" "32" and "H₂O" "H2O", runs of whitespace
    joined an indented Python snippet into one line, and dropping a closing "!"
    made "Compute 5!" "Compute 5". Variants that mean the same go to the semantic
    cache, past its guards (`formula` for those three). Never raises."""
    return unicodedata.normalize("NFC", text).strip()


_OPERATORS = frozenset("*=<>^&|~\\()[]{}\"+")


# superscripts, which NFKC folds into plain digits and signs ("3²" became "32")
_SUPERSCRIPT = re.compile("[\u00b2\u00b3\u00b9\u2070-\u207f]+")


@functools.lru_cache(maxsize=4096)
def formula(text: str) -> str:
    """What two prompts must share for the semantic cache to serve one's answer for
    the other, beyond their meaning: the numbers and operator symbols of `text`, in
    order ("7*3" for "What is 7 * 3?"), or "" when it has no operator ("7 * 3" and
    "7 - 3" embed alike and have the same numbers); then, for a text of several
    lines some of which are indented, the indentation of each line that is not
    blank ("|0,4": code, where indentation is meaning, and which `normalize`
    joins into one line).
    Operators: ``* = < > ^ & | ~ \\ ( ) [ ] { } " +``, ``!=``, ``!`` after a
    digit (a factorial: "5!" is not "5"), a superscript (an exponent: "3²" reads
    "3^2", not "32"), and ``-``, ``/`` and ``'`` unless between two letters
    ("e-mail", "km/h", "don't"). Never raises."""
    if not text.isascii():
        text = _SUPERSCRIPT.sub(lambda m: "^" + unicodedata.normalize("NFKC", m[0]), text)
    t = unicodedata.normalize("NFKC", text)
    parts: list[str] = []
    has_operator = False
    i, n = 0, len(t)
    while i < n:
        c = t[i]
        if c.isdigit():
            j = i + 1
            while j < n and (t[j].isdigit() or (t[j] in ".," and j + 1 < n and t[j + 1].isdigit())):
                j += 1
            parts.append(t[i:j])
            i = j
            continue
        if c in _OPERATORS or (c == "!" and (t[i + 1:i + 2] == "=" or t[i - 1:i].isdigit())) or (
                c in "-/'" and not (_letter(t, i - 1) and _letter(t, i + 1))):
            parts.append(c)
            has_operator = True
        i += 1
    shape = "".join(parts) if has_operator else ""
    if "\n" in text:
        indents = [len(line) - len(line.lstrip(" \t")) for line in text.splitlines()
                   if line.strip()]
        if any(indents):
            shape += "|" + ",".join(map(str, indents))
    return shape


def _letter(t: str, i: int) -> bool:
    return 0 <= i < len(t) and t[i].isalpha()


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
