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


def test_wasi_env_a_new_deploy_is_refused_still_loads_and_other_abis_keep_it() -> None:
    """A CGI variable's name or a NUL is refused a new `abi = "wasi"` deploy only: a
    stored version keeps loading, and a reactor gets its env as a length-prefixed
    section (no NUL truncation, no CGI names)."""
    env = b'[env]\nPATH_INFO = "/p"\nHTTP_X = "h"\nSEP = "a\\u0000b"\n'
    head = b'name = "x"\nruntime = "wasm"\nentry = "f.wat"\nroutes = ["/x"]\n'
    wasi_raw = head + b'abi = "wasi"\n' + env
    assert manifest.parse(wasi_raw, "m", new=False).env["SEP"] == "a\0b"
    with pytest.raises(ManifestError, match=r"`env\.PATH_INFO`"):
        manifest.parse(wasi_raw, "m")
    for abi in (b"reactor", b"auto"):
        assert manifest.parse(head + b'abi = "' + abi + b'"\n' + env, "m").env["HTTP_X"] == "h"


def test_every_variable_a_wasi_guest_gets_from_the_request_is_refused_as_env() -> None:
    """What `wasi.environ` sets and what the manifest refuses are written apart: they
    must agree, or a manifest entry of that name is silently dropped again."""
    from runtime.executors.wasm import wasi
    from runtime.net.message import Request

    req = Request(b"POST", b"/u/1", b"q", [(b"x-a", b"1"), (b"content-type", b"t")],
                  b"localhost", "1.1", True, "127.0.0.1:1")
    env = wasi.environ(req, "/u/:id/*", {"MODE": "m"}, {"id": "1", "*": "a"},
                       {"tenant": "t", "kind": "key", "bot": "b"})
    names = {k for k, _ in env} - {"MODE"}
    assert names >= manifest.WASI_CGI_NAMES | {"HTTP_X_A", "EDGEFN_PARAM_ID",
                                               "EDGEFN_PRINCIPAL_TENANT"}
    assert [k for k in sorted(names) if manifest.wasi_env_problem(k, "v") is None] == []
    assert manifest.wasi_env_problem("MODE", "m") is None
