"""The one place where failures become responses: a WASM trap, a Python
exception, a limit hit, a dead isolate host, a worker error in the OpenAI API
and a bug in a stage all end here.

An `EdgefnError` is expected (a function hit its CPU limit, a model is unknown)
and is rendered by the request's target, so a function's error reads like a
function's and the OpenAI API's like OpenAI's. Anything else is a bug: it is
logged with its traceback and answered as a 500 (``crash``, 502, for a function).

A `WorkerDead` (this PoP's model worker is not running) also closes the
connection: a client that retries (an edge's upstream engine does, once) opens
a new one, which a link or load balancer sends to a PoP that is ready.
"""

from __future__ import annotations

import logging
import time

from edgefn_core.errors import EdgefnError, Rejected, WorkerDead
from runtime.executors.output import said
from runtime.net.message import Response, json_response
from runtime.pipeline.stage import Context

log = logging.getLogger("edgefn.pop")

# refusals that say nothing new from one request to the next (the PoP shedding load):
# logged once a second per target and code, with how many more came meanwhile (a
# client at a function's concurrency limit wrote 1,100 warning lines a second)
SHED = frozenset({"concurrency_limit", "overloaded", "replaced"})
SHED_EVERY = 1.0
_shed: dict[tuple[str, str], list[float]] = {}  # (target, code): [when logged, counted since]
_MAX_SHED_KEYS = 10_000


def contain(ctx: Context, exc: Exception) -> Response:
    target = ctx.target
    where = target.label if target is not None else "pipeline"
    if isinstance(exc, EdgefnError):
        more = "" if exc.code not in SHED else _shed_note(where, exc.code)
        if exc.status >= 500 and more is not None:
            log.warning("%s: %s: %s%s", where, exc.code, said(str(exc)), more)  # a guest's text
        if isinstance(exc, Rejected):  # the PoP refused: its shape, but OpenAI's on /v1/*
            openai = target is not None and target.kind == "openai"
            response = target.error_response(exc) if target and openai else plain_error(exc)
            response.headers.extend(exc.headers)
            return response
        response = target.error_response(exc) if target is not None else plain_error(exc)
        response.close = isinstance(exc, WorkerDead)
        return response
    rid = ctx.request_id.decode()
    log.error("%s: unexpected failure (request %s)", where, rid, exc_info=exc)
    if target is not None:
        return target.error_response(target.crashed(exc))
    return plain_error(EdgefnError(f"internal error ({type(exc).__name__}); see the PoP's log, "
                                   f"request {rid}"))


def _shed_note(where: str, code: str) -> str | None:
    """For a refusal of `code` by `where`: None when it is not logged (one came within
    `SHED_EVERY` seconds; it is counted), else what its line adds: how many were
    counted since the last (`` (and N more like it since the last)``) or nothing."""
    now = time.monotonic()
    seen = _shed.get((where, code))
    if seen is not None and now - seen[0] < SHED_EVERY:
        seen[1] += 1
        return None
    if seen is None and len(_shed) >= _MAX_SHED_KEYS:
        _shed.clear()
    _shed[(where, code)] = [now, 0]
    return f" (and {int(seen[1])} more like it since the last)" if seen is not None and seen[1] \
        else ""


def rendered(err: Rejected) -> tuple[int, bytes, bytes]:
    """`err` as `contain` answers it for a function (the PoP's own shape, its headers
    after), as the native lane writes it: the status, the header lines (each ending
    in CRLF) and the body."""
    response = plain_error(err)
    response.headers.extend(err.headers)
    assert isinstance(response.body, bytes)
    return (response.status, b"".join([b"%s: %s\r\n" % h for h in response.headers]),
            response.body)


def plain_error(err: EdgefnError) -> Response:
    """The PoP's own error shape: ``{"error": {"kind", "message"}}`` (and a
    `Rejected`'s detail)."""
    body = {"kind": err.code, "message": str(err), **getattr(err, "detail", {})}
    return json_response({"error": body}, err.status,
                         [(b"x-edgefn-error", err.code.encode())])
