"""The `residency` stage without sockets: the real request_id and events stages in
front of it, a stage that plays `auth` (sets the principal) before it."""

from __future__ import annotations

import json
import time

import pytest

from edgefn_core.errors import Rejected
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.stages.residency import BLANK_PATH, Residency
from runtime.security import residency as r
from runtime.security.principal import Principal
from tests.observe.events.helpers import events_chain, request, run

SECRET = "s3cret-of-this-topology"
SETTINGS = r.ResidencySettings(tenants={"acme-eu": "emea"}, secret=SECRET)


class As:
    """Plays `auth`: the request comes from `tenant`."""

    name = "as"

    def __init__(self, tenant: str | None) -> None:
        self.tenant = tenant

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        if self.tenant is not None:
            ctx.principal = Principal(kind="key", tenant=self.tenant, key_id="k_1")
        return call_next(request, ctx)


class Forwarded:
    """Keeps the ``x-edgefn-tenant`` a hop from this request would carry."""

    name = "forwarded"

    def __init__(self) -> None:
        self.values: list[str | None] = []

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        self.values.append(r.forward_of(ctx.decisions))
        return Response(200, [], b"served")


def chain(tenant: str | None, region: str, settings: r.ResidencySettings = SETTINGS):
    tail = Forwarded()
    app, seen, _ = events_chain(As(tenant), Residency(settings, "pop-a", region), tail)
    return app, seen, tail


def with_rid(rid: bytes, *headers: tuple[bytes, bytes]) -> Request:
    req = request(b"/v1/chat/completions", method=b"POST")
    req.headers += [(b"x-request-id", rid), *headers]
    return req


def test_a_pinned_tenant_outside_its_region_is_refused_and_leaves_no_path() -> None:
    app, seen, tail = chain("acme-eu", region="americas")
    response = run(app(request(b"/orders/MARKER-123", b"q=MARKER-456")))
    assert response.status == 451
    error = json.loads(response.body)["error"]  # type: ignore[arg-type]
    assert error["kind"] == "residency_violation"  # the PoP's shape (OpenAI's on /v1: e2e)
    assert "'emea'" in error["message"] and "'americas'" in error["message"]
    assert tail.values == [], "nothing after the stage saw it"
    event = seen.events[0]
    assert event.path == BLANK_PATH.decode() and event.query == ""
    assert "MARKER" not in json.dumps(event.decisions)


def test_in_its_region_it_is_served_and_its_hops_carry_a_signed_tenant() -> None:
    app, seen, tail = chain("acme-eu", region="emea")
    response = run(app(with_rid(b"rid-1")))
    assert response.status == 200 and seen.events[0].path == "/v1/chat/completions"
    assert [r.verify(SECRET, v, "rid-1") for v in tail.values] == ["acme-eu"]


@pytest.mark.parametrize("tenant", [None, "someone-else"])
def test_tenants_not_pinned_pass_anywhere_and_carry_nothing(tenant: str | None) -> None:
    app, _, tail = chain(tenant, region="americas")
    assert run(app(request())).status == 200
    assert tail.values == [None]


def test_the_next_tier_enforces_the_pin_from_the_signed_header() -> None:
    app, seen, tail = chain(None, region="americas")
    header = (r.TENANT_HEADER, r.sign(SECRET, "acme-eu", "rid-2").encode())
    response = run(app(with_rid(b"rid-2", header)))
    assert response.status == 451 and tail.values == []
    # its event names the tenant and the error (its de-sensitised sample hashes them)
    assert [(e.tenant, e.error) for e in seen.events] == [("acme-eu", "residency_violation")]
    app, seen, tail = chain(None, region="emea")
    assert run(app(with_rid(b"rid-2", header))).status == 200
    # and passes it on to the tier after it, signed anew
    assert [r.verify(SECRET, v, "rid-2") for v in tail.values] == ["acme-eu"]
    assert [e.tenant for e in seen.events] == ["acme-eu"]


def test_an_unpinned_tenant_a_lower_tier_forwarded_is_named_and_passed_on() -> None:
    """Its caches and events are its own on this tier too (they were the anonymous
    tenant's, shared by every tenant forwarded here)."""
    app, seen, tail = chain(None, region="americas")
    header = (r.TENANT_HEADER, r.sign(SECRET, "globex", "rid-5").encode())
    assert run(app(with_rid(b"rid-5", header))).status == 200
    assert [r.verify(SECRET, v, "rid-5") for v in tail.values] == ["globex"]
    assert [e.tenant for e in seen.events] == ["globex"]
    forged = (r.TENANT_HEADER, r.sign("not-ours", "globex", "rid-6").encode())
    assert run(app(with_rid(b"rid-6", forged))).status == 403


@pytest.mark.parametrize("value", [
    b"acme-eu;" + b"0" * 32,  # a made-up tag
    r.sign("another-topology-secret", "acme-eu", "rid-3").encode(),
    r.sign(SECRET, "acme-eu", "another-request").encode(),  # replayed from another request
    b"acme-eu",
    r.sign(SECRET, "acme-eu", "rid-3", now=1).encode(),  # replayed long after
])
def test_a_tenant_header_this_topology_did_not_sign_is_forbidden(value: bytes) -> None:
    app, _, tail = chain(None, region="emea")
    response = run(app(with_rid(b"rid-3", (r.TENANT_HEADER, value))))
    assert response.status == 403 and tail.values == []
    assert b"x-edgefn-tenant" in response.body  # type: ignore[operator]


@pytest.mark.parametrize("age", [r.SIGNED_FOR_S + 2, -r.SIGNED_FOR_S - 2])
def test_a_signed_tenant_holds_a_short_while_either_way_of_the_clock(age: int) -> None:
    """A captured header replayed later (with its request id) is refused; so is one
    signed ahead of the clock by more than the skew allowed."""
    app, _, tail = chain(None, region="emea")
    stale = r.sign(SECRET, "acme-eu", "rid-7", now=time.time() - age).encode()
    response = run(app(with_rid(b"rid-7", (r.TENANT_HEADER, stale))))
    assert response.status == 403 and tail.values == []
    assert b"holds 120 s" in response.body  # type: ignore[operator]
    fresh = r.sign(SECRET, "acme-eu", "rid-7", now=time.time() - age / 2).encode()
    assert run(app(with_rid(b"rid-7", (r.TENANT_HEADER, fresh)))).status == 200


def test_the_tag_covers_the_tenant_and_when_it_was_signed() -> None:
    value = r.sign(SECRET, "acme-eu", "rid-8", now=1000)
    assert r.verify(SECRET, value, "rid-8", now=1000 + r.SIGNED_FOR_S) == "acme-eu"
    tenant, issued, tag = value.split(";")
    for forged in (f"globex;{issued};{tag}", f"{tenant};1100;{tag}", f"{tenant};{tag}",
                   f"{tenant};-1000;{tag}", f"a;b;{value}"):
        with pytest.raises(Rejected):
            r.verify(SECRET, forged, "rid-8", now=1100)
    assert r.tenant_of(value) == "acme-eu" and r.tenant_of(f"x;y;{value}") == f"x;y;{tenant}"


def test_without_a_secret_a_tenant_header_is_not_trusted() -> None:
    app, _, _ = chain(None, region="emea", settings=r.ResidencySettings(
        tenants={"acme-eu": "emea"}))
    header = (r.TENANT_HEADER, r.sign(SECRET, "acme-eu", "rid-4").encode())
    assert run(app(with_rid(b"rid-4", header))).status == 403


def test_answers_on_the_chain_without_a_task() -> None:
    app, _, _ = chain("acme-eu", region="emea")
    assert isinstance(app(request()), Response)


def test_a_desensitised_call_is_served_and_recorded_with_its_mark() -> None:
    app, seen, tail = chain(None, region="americas")
    mark = r.hashed_id(SECRET, "acme-eu")
    response = run(app(with_rid(b"ds-1", (r.DESENSITISED_HEADER, mark.encode()))))
    assert response.status == 200 and tail.values == [None]  # it carries no tenant on
    assert seen.events[0].decisions["residency"] == {"result": "desensitised", "tenant": mark}
    app, seen, _ = chain(None, region="americas")
    run(app(with_rid(b"ds-2")))
    assert "residency" not in (seen.events[0].decisions or {})  # unmarked: nothing recorded
    # a PoP outside a topology (no secret): a client's label is not recorded
    app, seen, _ = chain(None, region="americas", settings=r.ResidencySettings())
    run(app(with_rid(b"ds-3", (r.DESENSITISED_HEADER, b"acme-FORGED"))))
    assert "residency" not in (seen.events[0].decisions or {})
