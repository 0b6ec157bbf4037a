"""Host-header routing end to end: routes bound to `a.example` and `*.example.com`
beside a host-less catch-all, over real HTTP with different Host headers."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import Running, reactor

# name -> its routes, as TOML
FUNCTIONS = {
    "site-a": '[{ path = "/", host = "a.example" }]',
    "wild": '[{ path = "/api", host = "*.example.com" }]',
    "wild-admin": '[{ path = "/api/admin", host = "*.example.com" }]',
    "anyhost": '["/"]',
}

CASES = [  # (Host header, path, function that must answer)
    ("a.example", "/", "site-a"),
    ("a.example", "/deep/path?q=1", "site-a"),
    ("A.Example:8080", "/x", "site-a"),  # host names are case-insensitive; the port is no part
    ("b.example", "/", "anyhost"),  # another host: the host-less route
    ("x.a.example", "/", "anyhost"),  # an exact host route does not cover subdomains
    ("x.example.com", "/api", "wild"),
    ("x.example.com", "/api/v1/items", "wild"),
    ("x.example.com:80", "/api", "wild"),
    ("x.example.com", "/api/admin/users", "wild-admin"),  # then the longest prefix wins
    ("x.example.com", "/apix", "anyhost"),  # prefixes match on segment boundaries
    ("x.example.com", "/other", "anyhost"),  # host matches, no path does: host-less route
    ("example.com", "/api", "anyhost"),  # `*.` needs a subdomain
    ("notexample.com", "/api", "anyhost"),
    ("example.com.evil", "/api", "anyhost"),
]


@pytest.fixture
def routed(pop: Running, tmp_path: Path) -> Running:
    for name, routes in FUNCTIONS.items():
        d = tmp_path / name
        d.mkdir()
        (d / "main.wat").write_text(reactor(""))
        (d / "edgefn.toml").write_text(
            f'name = "{name}"\nruntime = "wasm"\nentry = "main.wat"\nroutes = {routes}\n')
        pop.deploy(d)
    return pop


def served_by(pop: Running, host: str, path: str) -> str:
    status, headers, body = pop.get(path, headers={"Host": host})
    assert (status, body) == (200, b"ok"), (host, path, status, body)
    return headers["x-edgefn-function"].split("@")[0]


def test_host_routes_pick_the_function_by_the_host_header(routed: Running) -> None:
    got = [(host, path, served_by(routed, host, path)) for host, path, _ in CASES]
    assert got == CASES


def test_a_request_without_a_host_header_gets_the_host_less_route(routed: Running) -> None:
    with socket.create_connection((routed.host, routed.port), timeout=5) as s:
        s.sendall(b"GET /api HTTP/1.0\r\n\r\n")  # HTTP/1.0 needs no Host
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200 ")
    assert b"\r\nx-edgefn-function: anyhost@" in head


def test_host_routes_alone_answer_404_for_other_hosts(pop: Running, tmp_path: Path) -> None:
    d = tmp_path / "only-a"
    d.mkdir()
    (d / "main.wat").write_text(reactor(""))
    (d / "edgefn.toml").write_text('name = "only-a"\nruntime = "wasm"\nentry = "main.wat"\n'
                                   'routes = [{ path = "/", host = "a.example" }]\n')
    pop.deploy(d)
    assert pop.get("/", headers={"Host": "a.example"})[0] == 200
    status, headers, _ = pop.get("/", headers={"Host": "b.example"})
    assert (status, headers["x-edgefn-error"]) == (404, "no_route")
