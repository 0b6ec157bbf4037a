"""bench/_topology_origin.py: which origin calls of the topology bench were an
intent's first in its region, which repeated one answered before (a cache could
have served it) and which came while one was in flight (only coalescing could)."""

from __future__ import annotations

import sys
from typing import Any

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import _topology_origin as origin

REGION = {"eu-west": "emea", "ap-south": "emea", "us-east": "americas"}


def row(geo: str, intent: str, started: float, ended: float, reached: bool) -> dict[str, Any]:
    return {"geo": geo, "intent": intent, "started": started, "ended": ended,
            "origin": reached}


def test_origin_calls_are_first_repeat_or_concurrent() -> None:
    table = [row("eu-west", "p1", 0.0, 1.0, True),     # first of p1 in emea
             row("us-east", "p1", 0.1, 1.1, True),     # first in americas: regions share none
             row("ap-south", "p1", 0.5, 1.5, True),    # p1 still in flight in emea
             row("eu-west", "p1", 1.2, 1.3, False),    # served by a cache: no "why"
             row("ap-south", "p1", 2.0, 3.0, True)]    # p1 answered in emea before
    origin.classify(table, REGION)
    assert [r.get("why") for r in table] == ["first", "first", "concurrent", None, "repeat"]


def test_the_pool_wordings_have_their_paraphrase_group() -> None:
    groups = origin.intents()
    assert groups["What's the way to center a div with CSS?"] == \
        groups["centering a div using css"]
