"""The events as the admin API serves them: a JSON list (`listing`) and a live
SSE stream (`follow`): ``data: <event json>`` per event, an ``event: dropped``
notice when the follower lagged and events were dropped for it, and a comment
line as heartbeat when nothing happened for `heartbeat` seconds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qsl

import msgspec

from edgefn_core.errors import InvalidConfig
from runtime.observe.ring import Query, Ring

HEARTBEAT = 15.0
_encode = msgspec.json.Encoder().encode


def parse(query: bytes) -> Query:
    """The `Query` a request's query string asks for. Raises `InvalidConfig`
    naming the bad parameter."""
    try:
        params = dict(parse_qsl(query.decode("utf-8"), keep_blank_values=True,
                                errors="strict"))
    except UnicodeDecodeError:
        raise InvalidConfig("query", "the query string is not UTF-8") from None
    return Query.parse(params)


def listing(ring: Ring, query: Query) -> bytes:
    """``{"events": [...]}``, oldest first."""
    return b'{"events":' + _encode(ring.query(query)) + b"}\n"


async def follow(ring: Ring, query: Query, queue: int,
                 heartbeat: float = HEARTBEAT) -> AsyncIterator[bytes]:
    """SSE of the events matching `query` from now on, until the reader goes away.
    Run on the loop that serves the reader (the admin API's)."""
    sub = ring.subscribe(query, queue)
    try:
        yield b": following events\n\n"
        while True:
            events, dropped = await sub.get(heartbeat)
            if dropped:
                yield b'event: dropped\ndata: {"dropped":%d}\n\n' % dropped
            if events:
                yield b"".join([b"data: " + _encode(e) + b"\n\n" for e in events])
            elif not dropped:
                yield b": heartbeat\n\n"
    finally:
        ring.unsubscribe(sub)
