"""Warm-up: a new version's request path runs before any request is routed to it.

A deploy already compiles, instantiates and (Python) imports the handler in every
isolate; what it did not run is the request path itself: the reactor's
``edgefn_handle``, response decoding and header handling (WASM), the PoP's side
of an isolate round trip and the handler's first call (Python). Those ran for
the first time on the first user request (README "Cold starts" has the figures).

Two kinds, chosen from the manifest, neither running user side effects unasked:

- a **declared** route (``warmup = "/path"``, any runtime): the PoP sends
  ``GET /path`` straight to the new version's executor (not through the
  pipeline: nothing is logged, counted, cached or sent to events), once per
  initial isolate. Its bindings are live, so the route must be one without
  side effects; the user says so by declaring it. An answer of 500 or more, or
  a trap or limit, fails the deploy (`DeployError` naming the route): nothing
  switches and the previous version keeps serving.
- an **implicit** dry run for WASM reactors without host imports: such a module
  can do nothing but compute a response from the request, so a synthetic
  ``GET`` of its first route is run on throw-away stores. A trap there does not
  fail the deploy (a handler may reject a request it did not expect); it is
  logged.

Anything else (a Python function or a reactor with bindings, without a declared
route) keeps the warm-up it had: instantiation, imports and the guest runner's
path around the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from edgefn_core.errors import DeployError, EdgefnError
from runtime.executors.output import escaped
from runtime.executors.wasm.function import INLINE_SLICE_MS, SLICE_EXPIRED
from runtime.functions.manifest import Manifest, Route
from runtime.functions.router import Router
from runtime.net.message import Request, Response

if TYPE_CHECKING:
    from runtime.functions.registry import Deployment

log = logging.getLogger("edgefn.pop")

HOST = b"warmup.edgefn.invalid"  # the Host of warm-up requests (RFC 6761: never resolves)
HEADER = (b"x-edgefn-warmup", b"1")  # marks a warm-up request for the handler
CLIENT = "warmup:0"  # the client address a warm-up request reports
DRY_RUNS = 2  # the second reuses the pool slot and pages the first one warmed


async def warm(fn: Deployment) -> None:
    """Run `fn`'s warm-up (see the module docstring) on the running loop, after
    `fn.executor.activate()`. Raises `DeployError` if a declared route fails."""
    with unmetered(fn.executor):
        path = fn.manifest.warmup
        if path is not None:
            await _declared(fn, path)
        elif getattr(fn.executor, "pure", False):
            await _dry(fn)


@contextlib.contextmanager
def unmetered(executor: object) -> Iterator[None]:
    """`executor`'s instantiation histogram (edgefn_wasm_instantiate_seconds, which
    counts requests) as it was before the block: a warm-up is not a request.
    Requests that run meanwhile on the same loop are undone too, so use it only
    while none can (before a switch), or around one request's few milliseconds."""
    times = getattr(executor, "instantiate_times", None)
    saved = bytes(times) if times is not None else b""
    try:
        yield
    finally:
        if times is not None:
            ctypes.memmove(ctypes.addressof(times), saved, len(saved))


async def _declared(fn: Deployment, path: str) -> None:
    """GET `path` on `fn`: Python, once per initial isolate, at once (so each isolate
    serves one); WASM, `DRY_RUNS` times. Raises `DeployError` naming the route and
    what it answered."""
    request, route, params = request_for(fn.manifest, path)
    runs = fn.manifest.pool.min if fn.manifest.runtime == "python" else DRY_RUNS
    outcomes = await asyncio.gather(*(_run(fn, request, route, params) for _ in range(runs)),
                                    return_exceptions=True)
    for outcome in outcomes:
        _check(fn, path, outcome)


def _check(fn: Deployment, path: str, outcome: object) -> None:
    """Raises `DeployError` unless `outcome` is a response below 500."""
    if isinstance(outcome, Response) and outcome.status < 500:
        return
    if isinstance(outcome, Response):
        why = f"answered {outcome.status}"
    elif isinstance(outcome, EdgefnError):  # a guest's text: escaped (one log line)
        why = f"failed: {outcome.code}: {escaped(str(outcome))}"
    else:
        why = f"failed: {outcome!r}"
    raise DeployError(f"{fn.label}: warm-up GET {path} (manifest `warmup`) {why}; "
                      "nothing was switched")


async def _dry(fn: Deployment) -> None:
    """A synthetic GET of `fn`'s first route, `DRY_RUNS` times; a failure is logged."""
    path = sample_path(fn.manifest.route_list()[0])
    try:
        request, _, params = request_for(fn.manifest, path)
    except DeployError as e:  # a route the sample path misses: nothing to warm, not an error
        log.info("%s: no warm-up: %s", fn.label, e)
        return
    dry_run = fn.executor.dry_run  # type: ignore[attr-defined]  # only pure reactors: WASM
    for _ in range(DRY_RUNS):
        try:  # inline, cut at the slice: a looping handler costs a deploy 5 ms
            dry_run(request, params)
        except EdgefnError as e:
            if e.code == SLICE_EXPIRED:
                log.info("%s: warm-up GET %s stopped at the %d ms inline slice (the handler "
                         "runs longer; deploying anyway)", fn.label, path, INLINE_SLICE_MS)
            else:
                log.warning("%s: warm-up GET %s failed (deploying anyway): %s", fn.label,
                            path, e)
            return


async def _run(fn: Deployment, request: Request, route: str,
               params: dict[str, str]) -> Response:
    """One warm-up request on `fn`'s executor, within its wall-time limit. Raises
    what the executor raises, `FunctionError` (wall_limit) past the limit."""
    result = fn.executor.handle(request, route, params)
    if inspect.isawaitable(result):
        async with asyncio.timeout(fn.manifest.limits.wall_ms / 1000 + 1):
            result = await result
    return result


def sample_path(route: Route) -> str:
    """A path `route` matches: each ``:name`` capture becomes ``warmup``, a
    trailing ``*`` matches nothing."""
    segments = [("warmup" if s.startswith(":") else s)
                for s in route.path.rstrip("/").split("/")[1:] if s != "*"]
    return "/" + "/".join(segments)


def request_for(m: Manifest, path: str, host: bytes = HOST
                ) -> tuple[Request, str, dict[str, str]]:
    """A warm-up GET of `path` and the route of `m` that matches it, with its
    captures: sent with `host`, else with a host a host-bound route names. Raises
    `DeployError` if no route of `m` matches `path`."""
    target, _, query = path.encode().partition(b"?")
    router = Router((r, m.name, None) for r in m.route_list())
    named = [r.host.replace("*.", "warmup.").encode() for r in m.route_list() if r.host]
    for h in (host, *named):
        hit = router.match(h, target)
        if hit is not None:
            request = Request(b"GET", target, query, [(b"host", h), HEADER], h, "1.1", False,
                              CLIENT)
            return request, hit[1], dict(hit[2])
    raise DeployError(f"{m.name}: warm-up route {path!r} (manifest `warmup`) is not "
                      "served by any of its routes")


async def warm_all(live: list[Deployment]) -> None:
    """Warm-up of the versions a PoP restored at boot, before it listens. They are
    live already, so a declared route that fails is logged, not refused."""
    for fn in live:
        try:
            await warm(fn)
        except DeployError as e:
            log.error("%s", e)
