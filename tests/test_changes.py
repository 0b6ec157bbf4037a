"""`Changes`: what a stopping PoP stops of the registry's changes in flight."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from edgefn_core.errors import DeployError
from runtime.functions.changes import Changes


class Starting:
    """An executor whose pre-warm blocks until it is closed (a host killed)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_abort_stops_what_starts_cancels_the_changes_and_refuses_later_starts() -> None:
    changes = Changes()
    executor = Starting()
    undone: list[str] = []

    ended = threading.Event()

    def prewarm() -> None:
        try:
            with changes.start(executor):  # type: ignore[arg-type]
                assert executor.closed.wait(10), "abort did not close the executor starting"
                raise DeployError("its host was killed")
        finally:
            ended.set()

    async def deploy() -> None:
        async with changes:
            try:
                await asyncio.to_thread(prewarm)
            except BaseException:
                undone.append("undone")  # the registry's undo runs here, stores still open
                raise

    async def main() -> Any:
        task = asyncio.create_task(deploy())
        while not changes.starting:
            await asyncio.sleep(0.01)
        await changes.abort()
        assert await asyncio.to_thread(ended.wait, 10)  # its pre-warm ended as well
        return task

    task = asyncio.run(main())
    # cancelled, or failed first: its pre-warm may raise before the cancel lands
    assert task.cancelled() or isinstance(task.exception(), DeployError)
    assert undone == ["undone"] and not changes.tasks
    # a load still compiling when abort ran starts nothing afterwards (its hosts leaked)
    with pytest.raises(DeployError, match="stopping"), changes.start(Starting()):  # type: ignore[arg-type]
        pass
