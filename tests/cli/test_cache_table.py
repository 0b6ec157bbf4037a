"""`edgefn cache stats`'s table: a cell as long as its column does not run into the next."""

from __future__ import annotations

import pytest

from runtime.cli.cache import _table


def test_a_long_model_name_keeps_its_own_column(capsys: pytest.CaptureFixture[str]) -> None:
    row = {"cache": "ai", "function": "", "model": "all-minilm-l6-v2", "tenant": "acme",
           "requests": 3, "hits": 1, "hit_rate": 1 / 3, "bytes_served": 10, "saved_ms": 5.0}
    _table([row, {**row, "model": "m", "function": "a-function-with-a-long-name"}])
    header, first, second = capsys.readouterr().out.splitlines()
    assert header.split() == ["CACHE", "FUNCTION", "MODEL", "TENANT", "REQUESTS", "HITS", "HIT",
                              "RATE", "BYTES", "SERVED", "SAVED", "MS"]
    assert first.split() == ["ai", "-", "all-minilm-l6-v2", "acme", "3", "1", "33.3%", "10", "5.0"]
    assert second.split()[1:3] == ["a-function-with-a-long-name", "m"]
    assert header.index("MODEL") == first.index("all-minilm-l6-v2") == second.index("m ")
