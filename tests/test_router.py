"""Routing, unit cases and a property test against a plain model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.functions.manifest import Route
from runtime.functions.router import RouteConflict, Router


def router(*routes: tuple[str, str | None, str]) -> Router[str]:
    return Router((Route(path, host), name, name) for path, host, name in routes)


def test_segment_boundaries_longest_prefix_and_hosts() -> None:
    r = router(("/api", None, "api"), ("/api/v2", None, "v2"), ("/", None, "root"),
               ("/", "example.com", "site"), ("/api", "*.corp.test", "corp"))
    assert r.match(b"localhost", b"/api") == ("api", "/api")
    assert r.match(b"localhost", b"/api/x") == ("api", "/api")
    assert r.match(b"localhost", b"/apix") == ("root", "/")
    assert r.match(b"localhost", b"/api/v2/models") == ("v2", "/api/v2")
    assert r.match(b"example.com:8080", b"/api") == ("site", "/")
    assert r.match(b"EXAMPLE.COM", b"/x") == ("site", "/")
    assert r.match(b"a.corp.test", b"/api/1") == ("corp", "/api")
    assert r.match(b"a.corp.test", b"/other") == ("root", "/")


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
