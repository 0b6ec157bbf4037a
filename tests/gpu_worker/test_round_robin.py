"""RoundRobin: jobs (generators) take turns a step at a time on one thread; no model."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from edgefn_core.errors import EngineError
from gpu_worker.engines.round_robin import RoundRobin, Steps, run_to_end

WAIT = 10.0  # seconds: a bound for work that takes microseconds


@pytest.fixture
def runner() -> Iterator[RoundRobin]:
    rr = RoundRobin("test-rr")
    yield rr
    rr.close()


def job(name: str, steps: int, log: list[str], gate: threading.Event | None = None,
        entered: threading.Event | None = None) -> Steps[str]:
    """`steps` steps that append ``name`` to `log`; the first sets `entered`, then
    waits for `gate`."""
    for n in range(steps):
        if n:
            yield
        if n == 0 and entered is not None:
            entered.set()
        if n == 0 and gate is not None:
            assert gate.wait(WAIT)
        log.append(name)
    return name


def test_a_job_arriving_waits_one_step_of_each_job_not_all_of_them(runner: RoundRobin
                                                                    ) -> None:
    log: list[str] = []
    gate = threading.Event()
    long_a = runner.submit(job("a", 10, log, gate), threading.Event())
    long_b = runner.submit(job("b", 10, log), threading.Event())
    short = runner.submit(job("s", 1, log), threading.Event())
    gate.set()
    assert short.result(WAIT) == "s"
    assert (long_a.result(WAIT), long_b.result(WAIT)) == ("a", "b")
    assert log[:5] == ["a", "b", "s", "a", "b"]
    assert log.count("a") == log.count("b") == 10


def test_turns_go_round_clients_then_their_jobs(runner: RoundRobin) -> None:
    """Client a's four long jobs get one turn in two beside b's one, not four in
    five; b's short job waits for one step of a, not one of each of a's jobs."""
    log: list[str] = []
    gate, entered = threading.Event(), threading.Event()
    first = runner.submit(job("a", 10, log, gate, entered), threading.Event(), "a")
    assert entered.wait(WAIT)
    more = [runner.submit(job("a", 10, log), threading.Event(), "a") for _ in range(3)]
    long_b = runner.submit(job("b", 10, log), threading.Event(), "b")
    short = runner.submit(job("s", 1, log), threading.Event(), "b")
    gate.set()
    assert short.result(WAIT) == "s"
    assert all(f.result(WAIT) == "a" for f in [first, *more]) and long_b.result(WAIT) == "b"
    # a's first step was under way when b came; then a, b, a, b: b's jobs in their turn
    assert log[:8] == ["a", "a", "b", "a", "s", "a", "b", "a"]
    assert log.count("a") == 40 and log.count("b") == 10


def test_a_client_new_to_the_turns_goes_after_those_waiting_now(runner: RoundRobin) -> None:
    log: list[str] = []
    gate, entered = threading.Event(), threading.Event()
    runner.submit(job("a", 3, log, gate, entered), threading.Event(), "a")
    assert entered.wait(WAIT)
    runner.submit(job("b", 3, log), threading.Event(), "b")
    last = runner.submit(job("c", 3, log), threading.Event(), "c")
    anonymous = runner.submit(job("n", 1, log), threading.Event())  # None: a client too
    gate.set()
    assert last.result(WAIT) == "c" and anonymous.result(WAIT) == "n"
    assert log[:6] == ["a", "b", "c", "n", "a", "b"]


def test_a_stopped_job_ends_cancelled_at_its_next_turn(runner: RoundRobin) -> None:
    log: list[str] = []
    gate, stop, entered = threading.Event(), threading.Event(), threading.Event()
    doomed = runner.submit(job("a", 1000, log, gate, entered), stop)
    assert entered.wait(WAIT)
    stop.set()
    gate.set()
    with pytest.raises(EngineError) as e:
        doomed.result(WAIT)
    assert (e.value.code, e.value.status) == ("cancelled", 499)
    assert log == ["a"]  # the step it was in, no more
    assert runner.submit(job("b", 1, log), threading.Event()).result(WAIT) == "b"


def test_a_failing_step_fails_its_job_only(runner: RoundRobin) -> None:
    def broken() -> Steps[None]:
        yield
        raise ValueError("bad batch")

    failed = runner.submit(broken(), threading.Event())
    with pytest.raises(ValueError, match="bad batch"):
        failed.result(WAIT)
    assert runner.submit(job("ok", 2, []), threading.Event()).result(WAIT) == "ok"


def test_a_future_cancelled_while_waiting_never_runs(runner: RoundRobin) -> None:
    log: list[str] = []
    gate = threading.Event()
    first = runner.submit(job("a", 1, log, gate), threading.Event())
    waiting = runner.submit(job("b", 1, log), threading.Event())
    assert waiting.cancel()
    gate.set()
    assert first.result(WAIT) == "a"
    assert runner.submit(job("c", 1, log), threading.Event()).result(WAIT) == "c"
    assert log == ["a", "c"]


def test_close_fails_waiting_jobs_and_refuses_new_ones() -> None:
    runner = RoundRobin("test-rr")
    gate = threading.Event()
    running = runner.submit(job("a", 5, [], gate), threading.Event())
    waiting = runner.submit(job("b", 5, []), threading.Event())
    runner.close()
    gate.set()
    for future in (running, waiting):
        with pytest.raises(EngineError) as e:
            future.result(WAIT)
        assert (e.value.code, e.value.status) == ("internal", 503)
    with pytest.raises(EngineError, match="closed"):
        runner.submit(job("c", 1, []), threading.Event())


def test_run_to_end_runs_every_step_here() -> None:
    log: list[str] = []
    assert run_to_end(job("a", 3, log)) == "a"
    assert log == ["a", "a", "a"]
