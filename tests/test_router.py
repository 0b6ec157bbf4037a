"""Routing, unit cases and property tests against plain models: the prefix model
from before patterns, and a segment-by-segment reference matcher for routes
with captures, wildcards and hosts."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.functions import router as router_module
from runtime.functions.manifest import Route
from runtime.functions.router import RouteConflict, Router


def router(*routes: tuple[str, str | None, str]) -> Router[str]:
    return Router((Route(path, host), name, name) for path, host, name in routes)


def test_segment_boundaries_longest_prefix_and_hosts() -> None:
    r = router(("/api", None, "api"), ("/api/v2", None, "v2"), ("/", None, "root"),
               ("/", "example.com", "site"), ("/api", "*.corp.test", "corp"))
    assert r.match(b"localhost", b"/api") == ("api", "/api", {})
    assert r.match(b"localhost", b"/api/x") == ("api", "/api", {})
    assert r.match(b"localhost", b"/apix") == ("root", "/", {})
    assert r.match(b"localhost", b"/api/v2/models") == ("v2", "/api/v2", {})
    assert r.match(b"example.com:8080", b"/api") == ("site", "/", {})
    assert r.match(b"EXAMPLE.COM", b"/x") == ("site", "/", {})
    assert r.match(b"a.corp.test", b"/api/1") == ("corp", "/api", {})
    assert r.match(b"a.corp.test", b"/other") == ("root", "/", {})


def test_no_match_and_conflicts() -> None:
    assert router(("/a", None, "a")).match(b"h", b"/b") is None
    with pytest.raises(RouteConflict, match="already served by function 'a'"):
        router(("/x", None, "a"), ("/x/", None, "b"))
    router(("/x", None, "a"), ("/x", "h.test", "b"))  # different hosts: no conflict


SEGMENT = st.sampled_from(["a", "b", "api", "v1", "x"])
PATHS = st.lists(SEGMENT, max_size=3).map(lambda s: "/" + "/".join(s))


def model(routes: dict[str, str], path: str) -> str | None:
    """Longest route that equals the path or is a segment-prefix of it."""
    best = None
    for prefix, name in routes.items():
        p = prefix.rstrip("/") or "/"
        covers = path == p or p == "/" or path.startswith(p + "/")
        if covers and (best is None or len(p) > len(best[0])):
            best = (p, name)
    return best[1] if best else None


@given(st.dictionaries(PATHS, st.text("fgh", min_size=1, max_size=3), max_size=6), PATHS)
def test_match_agrees_with_the_model(routes: dict[str, str], path: str) -> None:
    r = Router((Route(p), f"owner-{p}", name) for p, name in routes.items())
    hit = r.match(b"host", path.encode())
    assert (hit[0] if hit else None) == model(routes, path)


def test_captures_and_the_wildcard_remainder() -> None:
    r = router(("/users/:id", None, "user"), ("/users/:id/files/*", None, "files"),
               ("/static/*", None, "static"), ("/*", "cdn.test", "cdn"))
    assert r.match(b"h", b"/users/42") == ("user", "/users/:id", {"id": "42"})
    assert r.match(b"h", b"/users/42/") == ("user", "/users/:id", {"id": "42"})
    assert r.match(b"h", b"/users/42/posts") == ("user", "/users/:id", {"id": "42"})
    assert r.match(b"h", b"/users/a%20b/files/x/y.txt") == (
        "files", "/users/:id/files/*", {"id": "a%20b", "*": "x/y.txt"})
    assert r.match(b"h", b"/users/7/files") == ("files", "/users/:id/files/*", {"id": "7", "*": ""})
    assert r.match(b"h", b"/static/") == ("static", "/static/*", {"*": ""})
    assert r.match(b"h", b"/static") == ("static", "/static/*", {"*": ""})
    assert r.match(b"h", b"/staticx") is None
    assert r.match(b"h", b"/users") is None  # a capture needs a segment
    assert r.match(b"h", b"/users//x") is None  # ... a non-empty one
    assert r.match(b"h", b"/users/\xc3\xa9") == ("user", "/users/:id", {"id": "\xc3\xa9"})
    assert r.match(b"cdn.test:80", b"/") == ("cdn", "/*", {"*": ""})
    assert r.match(b"cdn.test", b"/users/1") == ("cdn", "/*", {"*": "users/1"})


def test_precedence_literal_over_capture_over_remainder() -> None:
    r = router(("/users/me", None, "me"), ("/users/:id", None, "user"), ("/users", None, "list"),
               ("/:section/:id/edit", None, "edit"), ("/", None, "root"),
               ("/users/:id", "*.corp.test", "corp"), ("/", "a.corp.test", "a"))
    assert r.match(b"h", b"/users/me/x")[0] == "me"  # literal beats capture, though shorter
    assert r.match(b"h", b"/users/7/x")[0] == "user"
    assert r.match(b"h", b"/users")[0] == "list"  # /users/:id needs one more segment
    assert r.match(b"h", b"/users/7/edit")[0] == "user"  # `users` beats `:section` first
    assert r.match(b"h", b"/posts/7/edit")[:3] == ("edit", "/:section/:id/edit",
                                                   {"section": "posts", "id": "7"})
    assert r.match(b"h", b"/posts/7")[0] == "root"
    assert r.match(b"h", b"/posts/7/editor")[0] == "root"  # segments, not string prefixes
    assert r.match(b"a.corp.test", b"/users/1")[0] == "a"  # exact host beats wildcard host
    assert r.match(b"b.corp.test", b"/users/1")[0] == "corp"
    assert r.match(b"b.corp.test", b"/other")[0] == "root"  # no host route matches
    wild = router(("/", "*.test", "test"), ("/", "*.corp.test", "corp"))
    assert wild.match(b"b.corp.test", b"/")[0] == "corp"  # the longer wildcard host first


def test_pattern_conflicts_name_the_owner() -> None:
    with pytest.raises(RouteConflict, match="'/users/:name' is already served by function 'a'"):
        router(("/users/:id", None, "a"), ("/users/:name", None, "b"))
    with pytest.raises(RouteConflict, match="'/api/\\*' is already served by function 'a'"):
        router(("/api", None, "a"), ("/api/*", None, "b"))
    with pytest.raises(RouteConflict, match=r"on host X\.test is already served by function 'a'"):
        router(("/:x", "x.test", "a"), ("/:y", "X.test", "b"))
    r = Router([(Route("/api"), "a", "x"), (Route("/api/*"), "a", "y")])  # one owner: fine
    assert r.match(b"h", b"/api/1")[0] in ("x", "y")
    router(("/u/:id", None, "a"), ("/u/:id/x", None, "b"), ("/u/x", None, "c"))


def test_an_escape_matches_in_either_case_and_captures_keep_the_requests() -> None:
    """RFC 3986 6.2.2.1: ``%c3%a9`` and ``%C3%A9`` are one; curl sends what was typed."""
    r = router(("/caf%C3%A9", None, "cafe"), ("/caf%c3%a9/:id", None, "item"),
               ("/%e9t%E9/*", "h.test", "summer"))
    assert r.match(b"x", b"/caf%c3%a9") == ("cafe", "/caf%C3%A9", {})
    assert r.match(b"x", b"/caf%C3%a9/") == ("cafe", "/caf%C3%A9", {})
    assert r.match(b"x", b"/caf%c3%A9/%aa%2f") == ("item", "/caf%C3%A9/:id", {"id": "%aa%2f"})
    assert r.match(b"h.test", b"/%E9t%e9/a%2fb") == ("summer", "/%E9t%E9/*", {"*": "a%2fb"})
    assert r.match(b"x", b"/cafe%c3%a9") is None and r.match(b"x", b"/caf%c3%a8") is None
    with pytest.raises(RouteConflict):  # one path, however its escapes are written
        router(("/caf%C3%A9", None, "a"), ("/caf%c3%a9", None, "b"))


def test_a_table_without_patterns_is_scanned_with_byte_comparisons_only() -> None:
    """The hello benchmark's path: no regex runs when no route has a pattern."""
    literal = router(("/a", None, "a"), ("/b", "h.test", "b"))
    assert literal._any_scan is router_module._scan_literal
    assert literal._exact["h.test"][0] is router_module._scan_literal
    assert literal.match(b"x", b"/a")[2] is router_module.NO_PARAMS  # nothing allocated
    mixed = router(("/a", None, "a"), ("/b/:id", None, "b"), ("/c", "h.test", "c"))
    assert mixed._any_scan is router_module._scan
    assert mixed._exact["h.test"][0] is router_module._scan_literal


# -- routes with patterns and hosts against a reference matcher ---------------------------------
HOSTS = [None, "h.test", "*.w.test"]
REQUEST_HOSTS = [b"h.test", b"a.w.test", b"other.test"]
# "ab": segment boundaries; an escape in either case (RFC 3986 6.2.2.1: one and the same)
PATH_SEGMENT = st.sampled_from(["a", "b", "api", "", "x", "ab", "%c3%a9", "%C3%a9", "%E9"])
REQUEST_PATHS = st.lists(PATH_SEGMENT, max_size=4).map(lambda s: "/" + "/".join(s))


@st.composite
def route_paths(draw: st.DrawFn) -> str:
    segments = []
    for i in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            segments.append(draw(st.sampled_from(["a", "b", "api", "%C3%A9", "%c3%A9", "%e9"])))
        else:  # names differ between routes of one shape: those must still conflict
            segments.append(f":{draw(st.sampled_from('pq'))}{i}")
    if draw(st.booleans()):
        segments.append("*")
    trailing = draw(st.sampled_from(["", "/"]))
    return "/" + "/".join(segments) + (trailing if segments else "")  # "//" is refused


def canon(path: str) -> str:
    return re.sub("%..", lambda m: m[0].upper(), path)


def reference(path: str, route: str) -> tuple[tuple[int, ...], dict[str, str]] | None:
    """(rank, captures) if `route` serves `path`, compared segment by segment, escapes
    whatever their case; what is captured as the request has it."""
    pattern = canon(route).rstrip("/").split("/")[1:]
    wildcard = pattern[-1:] == ["*"]
    pattern = pattern[:-1] if wildcard else pattern
    parts = path.split("/")[1:]
    if len(parts) < len(pattern):
        return None
    params = {}
    for want, part in zip(pattern, parts, strict=False):
        if want.startswith(":") and part:
            params[want[1:]] = part
        elif want != canon(part):
            return None
    if wildcard:
        params["*"] = "/".join(parts[len(pattern):])
    return (*(1 if s.startswith(":") else 2 for s in pattern), 0), params


def shape(route: str) -> str:
    pattern = [s for s in canon(route).rstrip("/").split("/")[1:] if s != "*"]
    return "/" + "/".join(":" if s.startswith(":") else s for s in pattern)


def reference_match(routes: list[tuple[str, str | None, str]], host: bytes,
                    path: str) -> tuple[str, str, dict[str, str]] | None:
    name = host.decode()
    tables = [[r for r in routes if r[1] == name],
              [r for r in routes if r[1] and r[1].startswith("*.") and name.endswith(r[1][1:])],
              [r for r in routes if r[1] is None]]
    for table in tables:
        hits = [(hit, r) for r in table if (hit := reference(path, r[0]))]
        if hits:
            (_, params), (route, _, target) = max(hits, key=lambda h: h[0][0])
            return target, canon(route), params
    return None


@settings(max_examples=300)
@given(st.dictionaries(st.tuples(route_paths(), st.sampled_from(HOSTS)),
                       st.text("fgh", min_size=1, max_size=3), max_size=7),
       st.sampled_from(REQUEST_HOSTS), REQUEST_PATHS)
def test_patterns_agree_with_the_reference_matcher(routes: dict[tuple[str, str | None], str],
                                                   host: bytes, path: str) -> None:
    table = [(p, h, name) for (p, h), name in routes.items()]
    shapes = [(h, shape(p)) for p, h, _ in table]
    if len(set(shapes)) < len(shapes):  # owners are per route: one shape twice conflicts
        with pytest.raises(RouteConflict):
            Router((Route(p, h), f"owner-{p}", name) for p, h, name in table)
        return
    r = Router((Route(p, h), f"owner-{p}", name) for p, h, name in table)
    assert r.match(host, path.encode()) == reference_match(table, host, path)


@settings(max_examples=300)
@given(route_paths(), st.sampled_from(HOSTS), route_paths(), st.sampled_from(HOSTS),
       st.lists(st.tuples(st.sampled_from(REQUEST_HOSTS), REQUEST_PATHS), min_size=1,
                max_size=20))
def test_overlap_is_true_whenever_a_request_matches_both_routes(
        a: str, host_a: str | None, b: str, host_b: str | None,
        requests: list[tuple[bytes, str]]) -> None:
    """What refuses one tenant's route inside another's (`Registry`): it may never miss
    a request both would take."""
    ra, rb = Route(a, host_a), Route(b, host_b)
    both = [(h, p) for h, p in requests
            if Router([(ra, "x", 1)]).match(h, p.encode()) is not None
            and Router([(rb, "y", 2)]).match(h, p.encode()) is not None]
    if both:
        assert router_module.overlap(ra, rb) and router_module.overlap(rb, ra), both


@pytest.mark.parametrize(("a", "b", "meet"), [
    (("/alice/*", None), ("/alice/y", None), True), (("/", None), ("/x", "h.test"), True),
    (("/:who/y", None), ("/alice", None), True), (("/alice", None), ("/alicex", None), False),
    (("/a/b", None), ("/a/c", None), False), (("/a", "h.test"), ("/a", "g.test"), False),
    (("/a", "*.w.test"), ("/a", "x.w.test"), True), (("/a", "*.w.test"), ("/a", "*.v.w.test"),
                                                     True),
    (("/a", "*.w.test"), ("/a", "w2.test"), False),
    (("/%c3%A9", None), ("/%C3%A9/:p1/:p2", None), True),  # escapes in either case
    (("/%c3%a9", None), ("/%c3%a8/x", None), False),
])
def test_overlap_cases(a: tuple[str, str | None], b: tuple[str, str | None], meet: bool) -> None:
    assert router_module.overlap(Route(*a), Route(*b)) is meet


# -- what mutation testing found unchecked (`make mutate`) -------------------------------------
@pytest.mark.parametrize(("a", "b", "meet"), [
    ("*.w.test", "x.w.test", True),
    ("*.w.test", "w.test", False),      # `*.` needs a subdomain: not the apex
    ("*.w.test", "aw.test", False),     # nor a name that merely ends alike
    ("*.w.test", "*.v.w.test", True),   # x.v.w.test takes both
    ("*.w.test", "*.aw.test", False),
])
def test_hosts_overlap_both_ways(a: str, b: str, meet: bool) -> None:
    """What `Registry._check_tenant_routes` refuses between tenants: a miss is an
    isolation hole, a false hit a refused deploy."""
    for x, y in ((a, b), (b, a)):
        assert router_module.overlap(Route("/p", x), Route("/p", y)) is meet, (x, y)


def test_a_wildcard_host_needs_a_subdomain() -> None:
    r = router(("/", "*.w.test", "wild"), ("/", None, "any"))
    assert r.match(b"a.w.test", b"/")[0] == "wild"  # type: ignore[index]
    assert r.match(b"w.test", b"/")[0] == "any"  # type: ignore[index]
    assert r.match(b"aw.test", b"/")[0] == "any"  # type: ignore[index]


def test_a_conflict_carries_the_route_and_the_owner() -> None:
    with pytest.raises(RouteConflict) as err:
        router(("/x", None, "a"), ("/x/", None, "b"))
    assert (err.value.path, err.value.owner) == ("/x/", "a")
