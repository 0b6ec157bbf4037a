"""`request_id`: every response carries a request id (``x-request-id`` by default).

A well-formed incoming id (1..128 of ``A-Za-z0-9._:-``) is kept, so a caller's
trace id flows through; otherwise one is made: a per-process random prefix and
a counter, unique and cheap.
"""

from __future__ import annotations

import itertools
import re
import secrets

from runtime.config import RequestIdStage
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result, then

WELL_FORMED = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
QUIET_ID = b"warmup"  # the id of every warm-up request (`runtime.pipeline.warm`)


class RequestId:
    name = "request_id"

    def __init__(self, config: RequestIdStage) -> None:
        self.header = config.header.lower().encode()
        self.trust = config.trust_incoming
        self.prefix = secrets.token_hex(6).encode()
        self.counter = itertools.count(1)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        rid = request.header(self.header) if self.trust else None
        if ctx.quiet:  # a warm-up takes no number: the ids clients see stay consecutive
            rid = QUIET_ID
        elif rid is None or not WELL_FORMED.fullmatch(rid) or rid == QUIET_ID:
            rid = b"%s-%x" % (self.prefix, next(self.counter))
        ctx.request_id = rid
        result = call_next(request, ctx)
        if isinstance(result, Response):
            return self.tagged(result, rid)
        return then(result, self.tagged, rid)

    def tagged(self, response: Response, rid: bytes) -> Response:
        """`response` with the request id `rid`, in place of one a function set (a
        client saw two): this stage's, and the native lane's for the calls it
        finishes in Python."""
        headers = response.headers
        name = self.header
        for h, _ in headers:
            if h == name:
                headers[:] = [pair for pair in headers if pair[0] != name]
                break
        headers.append((name, rid))
        return response
