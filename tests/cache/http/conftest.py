"""The HTTP cache stage's tests' harness, one a test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cache.http.helpers import Harness


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()
