"""Quiet warm-up requests: the whole request path, HTTP front included, run once per
function at boot and after each switch, with nothing of it seen.

A deploy's own warm-up (`runtime.functions.warmup`) runs a new version's executor
before the switch. What it cannot run is the PoP's side: the HTTP parser and
writer, every stage, and what stages prepare per deployment (a function's merged
WAF and bot policies, its compiled rate limits). Those ran for the first time on
the first client request after boot or a deploy (README "Cold starts").

A quiet request is parsed by an `HttpProtocol` on an in-memory transport (so the
public server counts no connection) and runs the chain with ``ctx.quiet`` set:
`events` hands no event to any observer (so no access-log line, metric, trace,
ring, file or dashboard entry), `request_id` takes no number from its counter,
`ratelimit` and `bots` count nothing, `auth` lets it through without a
principal, and both caches neither look up nor store. The flag lives on the
`Context`, which only this module sets; a client's ``x-edgefn-warmup`` header is
refused by the HTTP front (400).

What reaches the function: the route its warm-up already runs (a declared
``warmup`` route, or a pure reactor's first route); any other function gets a
dry request, which every stage runs and `dispatch` answers itself (204) without
calling the function, since its handler may have side effects.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from runtime.functions.registry import Deployment
from runtime.functions.warmup import HEADER, request_for, sample_path
from runtime.net.message import Request
from runtime.net.protocol import HttpProtocol
from runtime.net.server import ServerConfig, ServerState
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context

log = logging.getLogger("edgefn.pop")
# the stages' view of the client: an address each of them parses (the handler sees
# the request's own, ``warmup:0``, as in the executor's warm-up)
QUIET_CLIENT = "127.0.0.1:0"
TIMEOUT = 30.0  # seconds a warm-up request may take before it is given up (logged)


async def quiet(chain: Chain, fns: list[Deployment], pinned: frozenset[str] = frozenset()
                ) -> None:
    """One quiet request per function in `fns`, in turn; a failure is logged, never
    raised: the versions are live already. `pinned`: labels of versions the router
    does not send their path to (a canary), whose request is routed to them."""
    for fn in fns:
        try:
            status = await quiet_request(chain, fn, fn.label in pinned)
        except Exception as e:  # a warm-up never fails a switch: it is logged
            log.info("%s: quiet warm-up request failed: %r", fn.label, e)
            continue
        if status >= 500:
            log.info("%s: quiet warm-up request answered %d", fn.label, status)


async def quiet_request(chain: Chain, fn: Deployment, pin: bool = False) -> int:
    """`fn`'s quiet request (see the module docstring) through the HTTP front and
    `chain`; its status. Routed as any request (the route lookup runs too), unless
    `pin`: then straight to `fn`. Raises `DeployError` when no route of `fn` serves
    its path, TimeoutError past `TIMEOUT`."""
    path, dry = _path_of(fn)
    request, route, params = request_for(fn.manifest, path)
    raw = b"GET %s HTTP/1.1\r\nhost: %s\r\naccept: */*\r\nconnection: close\r\n\r\n" % (
        path.encode(), request.host)

    def app(parsed: Request) -> Any:
        parsed.headers.append(HEADER)  # after parsing: the front refuses it from clients
        return chain.run(parsed, _context(fn, route, params, dry, pin))

    return await asyncio.wait_for(_exchange(app, raw), TIMEOUT)


def _path_of(fn: Deployment) -> tuple[str, bool]:
    """The path to request and whether the request is dry (the function not called):
    it is called where its own warm-up calls it, unless it is a WASM function that
    answers on another thread (its instantiation would be counted there, out of
    `unmetered`'s reach: `dispatch` undoes a synchronous call's only)."""
    declared, executor = fn.manifest.warmup, fn.executor
    path = declared or sample_path(fn.manifest.route_list()[0])
    if fn.manifest.runtime == "python":
        return path, declared is None
    synchronous = executor.abi == "reactor" and not getattr(executor, "threaded", True)
    return path, not (synchronous and (declared is not None or getattr(executor, "pure", False)))


def _context(fn: Deployment, route: str, params: dict[str, str], dry: bool,
             pin: bool) -> Context:
    """A quiet context; with `pin`, already resolved to `fn` (a canary beside the
    live version of the same routes)."""
    ctx = Context(QUIET_CLIENT)
    ctx.quiet, ctx.dry = True, dry
    if pin:
        ctx.resolved, ctx.target, ctx.route = True, fn, route
        if params:
            ctx.params = params
    return ctx


async def _exchange(app: Any, raw: bytes) -> int:
    """`raw` fed to an `HttpProtocol` serving `app` on an in-memory transport; the
    status of the response it wrote once it closed the connection."""
    loop = asyncio.get_running_loop()
    transport = MemoryTransport(loop)
    protocol = HttpProtocol(app, ServerState(ServerConfig(), loop))
    protocol.connection_made(transport)  # type: ignore[arg-type]
    try:
        protocol.data_received(raw)
        await transport.closed
    finally:
        protocol.connection_lost(None)  # given up (TimeoutError): its task is cancelled
    head = bytes(transport.sent[:12])
    if not head.startswith(b"HTTP/1.1 "):
        raise ValueError(f"the HTTP front wrote {head!r}")
    return int(head[9:12])


class MemoryTransport:
    """A transport with no socket: keeps what is written, and says when the protocol
    closes it (a quiet request's does after its one response: ``connection: close``).
    `peer` is the address the protocol reads as its client's."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 peer: tuple[str, int] = ("warmup", 0)) -> None:
        self.sent = bytearray()
        self.peer = peer
        self.closed: asyncio.Future[None] = loop.create_future()

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    abort = close

    def is_closing(self) -> bool:
        return self.closed.done()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default
