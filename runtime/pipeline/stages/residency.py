"""`residency`: a tenant pinned to a region (``[residency] tenants``) is served only
by PoPs of that region. Runs after `auth`: the tenant is the principal's, or, on a
request another PoP of the topology forwarded, the signed ``x-edgefn-tenant``
header's (`runtime.security.residency`).

Outside its region a pinned tenant's request is refused (451 ``residency_violation``)
before any cache, store or function sees it, and its path and query are blanked so
the refusal's event and log line carry none of its content. In its region the
stage records the signed header for the hops the request makes (`forward_of`).
A call another PoP de-sensitised (``x-edgefn-desensitised``) is recorded as such,
with the tenant's keyed hash the mark carries.
On a PoP with ``[residency.samples] ingest`` it also answers the samples' ingest path.
"""

from __future__ import annotations

from typing import Any

from runtime.net.message import Request
from runtime.pipeline.stage import Context, Next, Result
from runtime.security import residency as r

BLANK_PATH = b"/[residency]"


class Residency:
    name = "residency"

    def __init__(self, settings: r.ResidencySettings, pop: str, region: str,
                 ingest: Any = None) -> None:
        self.settings = settings
        self.pop = pop
        self.region = region
        self.ingest = ingest  # runtime.observe.samples.Ingest, on central

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        if self.ingest is not None and request.path == self.ingest.path:
            return self.ingest(request)
        tenant = self._tenant(request, ctx)
        home = self.settings.tenants.get(tenant) if tenant is not None else None
        if tenant is not None and home is None and ctx.principal is None:
            # an unpinned tenant a lower tier forwarded: its caches and events are its
            # own here too, and its hops carry it on
            record: dict[str, Any] = {"result": "unpinned", "forwarded": tenant}
            if self.settings.secret:
                record["forward"] = r.sign(self.settings.secret, tenant,
                                           ctx.request_id.decode())
            ctx.decide("residency", record)
            return call_next(request, ctx)
        if tenant is None or home is None:
            # the label a tier below sets: only in a topology (a PoP with the shared
            # secret); elsewhere any client could write it into the events
            if self.settings.secret and \
                    (mark := request.header(r.DESENSITISED_HEADER)) is not None:
                ctx.decide("residency", {"result": "desensitised",
                                         "tenant": mark.decode("latin-1")[:32]})
            return call_next(request, ctx)
        # a tenant a lower tier forwarded is no principal here: its event still names it
        named = {"forwarded": tenant} if ctx.principal is None else {}
        if home != self.region:
            request.path, request.query = BLANK_PATH, b""
            ctx.decide("residency", {"tenant_region": home, "result": "refused", **named})
            raise r.refusal(tenant, home, self.pop, self.region)
        record = {"tenant_region": home, "result": "ok", **named}
        if self.settings.secret:
            record["forward"] = r.sign(self.settings.secret, tenant, ctx.request_id.decode())
        ctx.decide("residency", record)
        return call_next(request, ctx)

    def _tenant(self, request: Request, ctx: Context) -> str | None:
        """The principal's tenant, else the signed header's. Raises `Rejected` (403)
        for a header this topology did not sign."""
        if ctx.principal is not None and ctx.principal.tenant:
            return ctx.principal.tenant
        value = request.header(r.TENANT_HEADER)
        if value is None:
            return None
        return r.verify(self.settings.secret, value.decode("latin-1"), ctx.request_id.decode())

