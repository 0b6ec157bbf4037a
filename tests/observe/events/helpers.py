"""Shared by the events tests: a chain with the events stage in front of a test's
stages, the events it produced, and plain requests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runtime import config
from runtime.net.message import Request, Response
from runtime.observe.event import Event
from runtime.observe.observers import Observers
from runtime.observe.ring import Ring
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context, Next, Result, Stage
from runtime.pipeline.stages.events import Events
from runtime.pipeline.stages.request_id import RequestId


class Collect:
    """An observer keeping what it got."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def observe(self, event: Event) -> None:
        self.events.append(event)


class Answer:
    name = "answer"

    def __init__(self, status: int = 200, body: bytes = b"ok") -> None:
        self.status, self.body = status, body

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        return Response(self.status, [], self.body)


class Decide:
    """Records a decision as a stage would (for what only a decision carries)."""

    name = "decide"

    def __init__(self, stage: str, record: Any) -> None:
        self.stage, self.record = stage, record

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ctx.decide(self.stage, self.record)
        return call_next(request, ctx)


def events_chain(*stages: Stage, clock: Callable[[], float] = lambda: 1000.0,
                 rand: Callable[[], float] = lambda: 0.0, timed: bool = True,
                 **settings: Any) -> tuple[Chain, Collect, Ring]:
    cfg = config.load(None, name="pop-a", tier="regional", geo="fra",
                      **{f"events.{k}": v for k, v in settings.items()})
    observers, seen = Observers(), Collect()
    ring = Ring(cfg.events.ring_size, cfg.events.max_event_bytes, clock=clock)
    observers.add(ring)
    observers.add(seen)
    events = Events(cfg, observers, clock=clock, rand=rand)
    return Chain([RequestId(config.RequestIdStage()), events, *stages], timed), seen, ring


def request(path: bytes = b"/hello", query: bytes = b"", method: bytes = b"GET",
            body: bytes = b"", client: str = "192.0.2.7:50000") -> Request:
    r = Request(method, path, query, [(b"host", b"example.com")], b"example.com", "1.1", True,
                client)
    r.body = body
    return r


def run(result: Result) -> Response:
    if isinstance(result, Response):
        return result
    async def wait() -> Response:
        return await result  # type: ignore[misc]
    return asyncio.run(wait())
