"""Manifest validation. Each folder under manifest_cases/ is one case: its
edgefn.toml and error.txt, the exact message expected ({file} and {dir} are
replaced by the case's paths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import ManifestError
from runtime.functions import manifest

CASES = Path(__file__).parent / "manifest_cases"


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir()))
def test_invalid_manifest_names_file_field_and_expectation(case: str) -> None:
    d = CASES / case
    expected = (d / "error.txt").read_text().strip()
    expected = expected.replace("{file}", str(d / "edgefn.toml")).replace("{dir}", str(d))
    with pytest.raises(ManifestError) as err:
        manifest.load(d)
    assert str(err.value) == expected


def test_valid_manifest_with_defaults_and_host_routes(tmp_path: Path) -> None:
    (tmp_path / "f.wat").write_text("(module)")
    (tmp_path / "edgefn.toml").write_text(
        'name = "api"\nruntime = "wasm"\nentry = "f.wat"\n'
        'routes = ["/api", { path = "/", host = "*.example.com" }]\n'
        '[env]\nMODE = "prod"\n[bindings]\nkv = ["cache"]\n')
    m = manifest.load(tmp_path)
    assert m.limits.cpu_ms == 50 and m.limits.memory_mb == 64 and m.abi == "auto"
    assert m.limits.concurrency == manifest.DEFAULT_CONCURRENCY == 32
    assert [(r.path, r.host) for r in m.route_list()] == [("/api", None), ("/", "*.example.com")]
    assert m.env == {"MODE": "prod"} and m.bindings.kv == ["cache"]


def test_every_example_manifest_is_valid() -> None:
    examples = Path(__file__).parent.parent / "functions" / "examples"
    dirs = [p.parent for p in examples.rglob("edgefn.toml")]
    assert len(dirs) >= 3
    for d in dirs:
        manifest.load(d)


@pytest.mark.parametrize(("path", "segments", "wildcard", "shape"), [
    ("/", (), False, "/"),
    ("/*", (), True, "/"),
    ("/api/", ("api",), False, "/api"),
    ("/api/*", ("api",), True, "/api"),
    ("/users/:id", ("users", ":id"), False, "/users/:"),
    ("/users/:user_id/files/*/", ("users", ":user_id", "files"), True, "/users/:/files"),
    ("/a//b", ("a", "", "b"), False, "/a//b"),  # a literal prefix, matched as bytes as before
])
def test_route_paths_parse_into_segments_and_a_shape(path: str, segments: tuple[str, ...],
                                                     wildcard: bool, shape: str) -> None:
    pattern = manifest.parse_path(path)
    assert (pattern.segments, pattern.wildcard, pattern.shape) == (segments, wildcard, shape)
    assert pattern.literal == (":" not in path and "*" not in path)


def test_one_shape_on_two_hosts_is_not_a_duplicate() -> None:
    m = manifest.parse(b'name = "x"\nruntime = "wasm"\nentry = "f.wat"\n'
                       b'routes = ["/u/:id", { path = "/u/:name", host = "a.test" }]\n', "m")
    assert [r.path for r in m.route_list()] == ["/u/:id", "/u/:name"]


def test_owner_defaults_to_the_function_name_and_shares_parse(tmp_path: Path) -> None:
    head = 'name = "api"\nruntime = "wasm"\nentry = "f.wat"\nroutes = ["/api"]\n'
    plain = manifest.parse(head.encode(), "f")
    assert (plain.owner, plain.tenant, plain.bindings.share) == (None, "api",
                                                                 manifest.Share())
    m = manifest.parse((head + 'owner = "acme"\n[bindings]\nkv = ["a", "b"]\nvectors = ["v"]\n'
                        '[bindings.share.kv]\na = { read = ["bob"], write = ["carol"] }\n'
                        '[bindings.share.vectors]\nv = { read = ["bob"] }\n').encode(), "f")
    assert (m.owner, m.tenant) == ("acme", "acme")
    assert m.bindings.share.kv == {"a": manifest.Grant(read=["bob"], write=["carol"])}
    assert m.bindings.share.vectors == {"v": manifest.Grant(read=["bob"])}


def test_a_stored_version_skips_the_checks_only_new_deploys_get() -> None:
    """What an older edgefn stored (a WASM manifest with a `[pool]`, since refused)
    keeps loading at start; a new deploy of it is refused."""
    d = CASES / "wasm-pool"
    assert manifest.load(d, new=False).pool.min == 2
    with pytest.raises(ManifestError):
        manifest.load(d)


def test_routes_a_new_deploy_is_refused_still_load_from_a_stored_version() -> None:
    """An upgrade stopped serving a whole function whose stored version had one such
    route; only new deploys are refused them."""
    from edgefn_core.errors import ManifestError
    from runtime.functions.router import Router

    raw = (b'name = "x"\nruntime = "wasm"\nentry = "f.wat"\n'
           b'routes = ["/ok/*", "/api//v1", { path = "/h", host = "*" }]\n')
    stored = manifest.parse(raw, "m", new=False)
    router = Router([(r, "x", "x") for r in stored.route_list()])
    assert router.match(b"", b"/ok/1") is not None
    with pytest.raises(ManifestError, match="expected no empty segment"):
        manifest.parse(raw, "m")
