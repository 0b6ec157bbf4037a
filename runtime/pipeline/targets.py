"""`Targets`: what a request is for, looked up once and early.

The security stages run before `route` but act per target (a function's
``auth``, ``[waf]``, ``[bots]``, ``[[rate_limits]]``; the OpenAI API's auth), so
the first stage that needs the target resolves it here, and `route` and
`openai` reuse the answer (``ctx.resolved``). A path no one serves resolves to
None; `route` answers its 404. A function with a canary resolves to the
version the request's key is split to (`runtime.functions.canary`).

Built-in APIs also claim path prefixes: ``before`` function routes (the OpenAI
API's ``/v1/models/{id}``), or ``after`` them, for what no function serves (the
rest of ``/v1/``, so an unknown path there gets the OpenAI API's 404).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.functions import canary
from runtime.net.message import Request
from runtime.pipeline.stage import Context, Target

if TYPE_CHECKING:
    from runtime.functions.registry import Registry


class Targets:
    def __init__(self, registry: Registry, builtin: dict[bytes, Target] | None = None,
                 before: tuple[tuple[bytes, Target], ...] = (),
                 after: tuple[tuple[bytes, Target], ...] = ()) -> None:
        """`builtin`: exact paths a built-in API answers (the OpenAI API's), taken
        before function routes; `before` and `after`: (prefix, target) pairs taken
        before function routes and when none matches. Routes are read from
        `registry.router` per request: a deploy replaces it."""
        self.registry = registry
        self.builtin = builtin or {}
        self.before = before
        self.after = after

    def resolve(self, request: Request, ctx: Context) -> Target | None:
        """The request's target (also set as ``ctx.target``, with ``ctx.route`` and
        ``ctx.params`` for a function), looked up at most once per request."""
        if ctx.resolved:
            return ctx.target
        ctx.resolved = True
        builtin = self.builtin.get(request.path) or _prefixed(request.path, self.before)
        if builtin is not None:
            ctx.target = builtin
            return builtin
        hit = self.registry.router.match(request.host, request.path)
        if hit is None:
            ctx.target = _prefixed(request.path, self.after)
            return ctx.target
        fn, ctx.route, params = hit
        split = self.registry.canaries.get(fn.name) if self.registry.canaries else None
        ctx.target = fn if split is None else canary.choose(split, fn, request, ctx)
        if params:  # a plain prefix's hit carries the shared, read-only NO_PARAMS
            ctx.params = dict(params)
        return ctx.target


def _prefixed(path: bytes, prefixes: tuple[tuple[bytes, Target], ...]) -> Target | None:
    for prefix, target in prefixes:
        if path.startswith(prefix):
            return target
    return None
