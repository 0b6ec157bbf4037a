"""The admin API's gatekeeping: loopback peers only, the bearer token from
DATA/admin.token (mode 0600), JSON errors."""

from __future__ import annotations

import fcntl
import http.client
import ipaddress
import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.api import AdminApp
from runtime.app import admin_token
from runtime.net.message import Request, Response
from tests.support import EXAMPLES, Running

TOKEN = "t0ken"


def admin_request(client: str, authorization: bytes | None = b"Bearer " + TOKEN.encode(),
                  ) -> Request:
    headers = [(b"host", b"127.0.0.1")]
    if authorization is not None:
        headers.append((b"authorization", authorization))
    return Request(b"GET", b"/v1/functions", b"", headers, b"127.0.0.1", "1.1", True, client)


def error_of(response: object) -> tuple[int, str]:
    assert isinstance(response, Response) and isinstance(response.body, bytes), response
    assert (b"content-type", b"application/json") in response.headers
    return response.status, json.loads(response.body)["error"]["kind"]


@pytest.mark.parametrize("client", ["10.0.0.1:5555", "192.0.2.7:40000", "[2001:db8::1]:5555",
                                    "[::ffff:10.0.0.1]:5555", "0.0.0.0:1", "", "not-an-ip:1"])
def test_non_loopback_peers_are_refused_even_with_the_right_token(client: str) -> None:
    # socket-free: the PoP is never reached for a refused peer
    app = AdminApp(None, TOKEN)  # type: ignore[arg-type]
    assert error_of(app(admin_request(client))) == (403, "forbidden")


@pytest.mark.parametrize("client", ["127.0.0.1:5555", "127.0.0.2:80", "[::1]:5555"])
def test_loopback_peers_get_past_the_peer_check_to_the_token_check(client: str) -> None:
    app = AdminApp(None, TOKEN)  # type: ignore[arg-type]
    assert error_of(app(admin_request(client, b"Bearer wrong"))) == (401, "unauthorized")


def local_non_loopback_ipv4() -> str | None:
    """An IPv4 address of one of this machine's interfaces outside 127/8, if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's address (Linux)
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address
            addr = socket.inet_ntoa(packed[20:24])
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    return None


def admin_address(pop: Running) -> tuple[str, int]:
    host, port = pop.admin.info.admin.rsplit(":", 1)
    return host, int(port)


def raw_admin(pop: Running, method: str, path: str, headers: dict[str, str],
              body: bytes = b"") -> tuple[int, str, dict[str, Any]]:
    conn = http.client.HTTPConnection(*admin_address(pop), timeout=10)
    try:
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type") or "", json.loads(resp.read())
    finally:
        conn.close()


def test_a_real_non_loopback_peer_is_refused(pop: Running) -> None:
    source = local_non_loopback_ipv4()
    if source is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    with socket.socket() as s:
        s.settimeout(10)
        s.bind((source, 0))  # a peer address outside 127/8, talking to 127.0.0.1
        s.connect(admin_address(pop))
        s.sendall(f"GET /v1/functions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{pop.admin.token}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 ")
    assert json.loads(body) == {"error": {"kind": "forbidden", "message":
                                          "the admin API only answers loopback clients"}}


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer ", "Bearer wrong", "{token}", "Basic {token}", "Bearer {token}x",
    "Bearer  {token}"])
def test_a_missing_or_wrong_token_is_401_with_a_json_body(pop: Running,
                                                          authorization: str | None) -> None:
    headers = {} if authorization is None else {
        "Authorization": authorization.format(token=pop.admin.token)}
    status, ctype, body = raw_admin(pop, "GET", "/v1/functions", headers)
    assert (status, ctype) == (401, "application/json")
    assert body == {"error": {"kind": "unauthorized",
                              "message": "missing or wrong admin token or API key"}}
    good = {"Authorization": f"Bearer {pop.admin.token}"}
    assert raw_admin(pop, "GET", "/v1/functions", good)[:2] == (200, "application/json")


def test_head_of_an_admin_endpoint_is_its_get_without_the_body(pop: Running) -> None:
    """`curl -I` got 404 "no admin endpoint HEAD /v1/functions"."""
    conn = http.client.HTTPConnection(*admin_address(pop), timeout=10)
    try:
        conn.request("HEAD", "/v1/functions", headers={
            "Authorization": f"Bearer {pop.admin.token}"})
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"")
        assert int(resp.getheader("content-length") or 0) > 0
    finally:
        conn.close()


ENDPOINTS = ["/v1/functions", "/v1/functions/nobody/versions", "/v1/limits", "/v1/cache/stats",
             "/v1/events", "/v1/deploy", "/v1/stage", "/v1/keys/reload", "/v1/cache/purge",
             "/v1/cache/ai/purge", "/v1/functions/nobody/stage",
             "/v1/functions/nobody/activate", "/v1/functions/nobody/abort",
             "/v1/functions/nobody/promote", "/v1/functions/nobody/rollback",
             "/v1/kv/nons/get", "/v1/vectors/noix/query", "/v1/functions/nobody",
             "/v1/dev/starting"]


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_method_an_endpoint_does_not_take_is_405_with_allow(pop: Running, path: str) -> None:
    """`PUT /v1/functions` was a 404 "no admin endpoint" (RFC 9110 15.5.6: 405 and
    ``Allow``); and each method `allowed_methods` names is one the endpoint takes."""
    from runtime.admin.api import allowed_methods

    allowed = allowed_methods(path.strip("/").split("/")).split(", ")
    assert allowed != [""]
    auth = {"Authorization": f"Bearer {pop.admin.token}"}
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        conn = http.client.HTTPConnection(*admin_address(pop), timeout=10)
        try:
            body = b'{"why": null}' if method == "PUT" else b""
            conn.request(method, path, body, auth)
            resp = conn.getresponse()
            status, answer = resp.status, json.loads(resp.read())
            allow = resp.getheader("allow")
        finally:
            conn.close()
        if method in allowed:
            assert status != 405 and "no admin endpoint" not in str(answer), (method, answer)
        else:
            assert (status, allow) == (405, ", ".join(allowed)), (method, answer)
            assert answer["error"] == {"kind": "method_not_allowed", "message":
                                       f"{method} {path}: this endpoint takes "
                                       f"{', '.join(allowed)}"}
    status, _, answer = raw_admin(pop, "GET", "/v1/nothing", auth)
    assert (status, answer["error"]["kind"]) == (404, "not_found")


def test_a_deploy_with_a_wrong_token_is_refused_and_changes_nothing(pop: Running) -> None:
    from runtime.functions import deploys

    package = deploys.to_tar(deploys.pack_dir(EXAMPLES / "hello-wat"))
    status, _, body = raw_admin(pop, "POST", "/v1/deploy", {"Authorization": "Bearer nope"},
                                package)
    assert (status, body["error"]) == (401, {"kind": "unauthorized",
                                             "message": "missing or wrong admin token or "
                                                        "API key"})
    assert pop.admin.request("GET", "/v1/functions") == {"functions": []}
    assert pop.get("/hello")[0] == 404


def test_the_token_file_is_mode_0600_and_is_the_token_the_api_takes(pop: Running) -> None:
    path = pop.data / "admin.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert len(token) >= 32
    status, _, _ = raw_admin(pop, "GET", "/v1/functions", {"Authorization": f"Bearer {token}"})
    assert status == 200


def test_the_token_file_is_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)  # the most permissive umask: the mode must not come from it
    try:
        first = admin_token(tmp_path / "data")
    finally:
        os.umask(old)
    path = tmp_path / "data" / "admin.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin_token(tmp_path / "data") == first  # kept, not regenerated
    assert admin_token(tmp_path / "other") != first


def test_dev_starting_answers_503_for_paths_not_served_yet_until_it_is_cleared(
        pop: Running) -> None:
    """``PUT /v1/dev/starting`` (`edgefn dev`, while it deploys its folders through the
    admin API): a path no function serves gets 503 ``starting`` with ``Retry-After:
    1`` and the reason, until ``{"why": null}``; a served path is not touched. A body
    that is not ``{"why": text | null}`` is a 400 and changes nothing; the operation
    needs an API key's ``admin:deploy``."""
    from edgefn_core.errors import AdminError
    from runtime.admin.api import operation, path_parts

    pop.deploy(EXAMPLES / "hello-wat")
    assert pop.get("/nothing")[0] == 404
    put = b'{"why": "deploying 1 of 2"}'
    assert pop.admin.request("PUT", "/v1/dev/starting", put) == {"starting": "deploying 1 of 2"}
    status, headers, body = pop.get("/nothing")
    assert (status, headers["retry-after"], headers["x-edgefn-error"]) == (503, "1", "starting")
    assert json.loads(body)["error"]["message"] == ("no function serves /nothing yet: "
                                                    "deploying 1 of 2; retry")
    assert pop.get("/hello")[0] == 200
    for bad in (b'{"why": 5}', b'{"why": ""}', b'{"wh": "x"}', b"[]", b"{",
                json.dumps({"why": "x" * 1001}).encode()):
        with pytest.raises(AdminError) as err:
            pop.admin.request("PUT", "/v1/dev/starting", bad)
        assert (err.value.status, err.value.code) == (400, "bad_request"), bad
        assert pop.get("/nothing")[0] == 503
    assert pop.admin.request("PUT", "/v1/dev/starting", b'{"why": null}') == {"starting": None}
    assert pop.get("/nothing")[0] == 404
    assert operation(b"PUT", path_parts(b"/v1/dev/starting")) == "deploy"
