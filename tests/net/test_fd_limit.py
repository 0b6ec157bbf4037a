"""`raise_fd_limit`: the PoP takes the whole open-file allowance it is given, and says
when `http.max_connections` cannot fit under it."""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterator

import pytest

from runtime.net.server import FD_RESERVE, raise_fd_limit
from tests.support import own_records


@pytest.fixture
def lowered_soft_limit() -> Iterator[int]:
    """The soft RLIMIT_NOFILE lowered to 512 for the test (restored after); the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 512:
        pytest.skip(f"the hard open-file limit is only {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_soft_open_file_limit_is_raised_to_the_hard_one(lowered_soft_limit: int,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    hard = lowered_soft_limit
    fits = hard - FD_RESERVE
    with caplog.at_level(logging.WARNING, "edgefn.http"):
        assert raise_fd_limit(fits) == hard
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    assert own_records(caplog, "edgefn.http") == []


def test_max_connections_that_do_not_fit_under_the_limit_are_warned_about(
        lowered_soft_limit: int, caplog: pytest.LogCaptureFixture) -> None:
    hard = lowered_soft_limit
    with caplog.at_level(logging.WARNING, "edgefn.http"):
        raise_fd_limit(hard - FD_RESERVE + 1)
    assert [r.getMessage() for r in own_records(caplog, "edgefn.http")] == [
        f"http.max_connections = {hard - FD_RESERVE + 1} does not fit under the open-file "
        f"limit {hard} ({FD_RESERVE} kept for the PoP itself): past it connections are "
        "refused by the kernel, not answered 503"]
