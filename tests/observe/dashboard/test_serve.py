"""The dashboard's pages without sockets: login by token sets an HttpOnly,
SameSite=Strict cookie; expired, reused and missing tokens/sessions get 401."""

from __future__ import annotations

from runtime.net.message import Request
from runtime.observe.dashboard import serve
from runtime.observe.dashboard.login import Logins


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def get(path: bytes, query: bytes = b"", cookie: bytes | None = None) -> Request:
    headers = [(b"cookie", cookie)] if cookie is not None else []
    return Request(b"GET", path, query, headers, b"127.0.0.1", "1.1", True, "127.0.0.1:1")


def test_a_token_logs_in_with_a_strict_httponly_cookie() -> None:
    logins = Logins(Clock())
    resp = serve.page(get(b"/dashboard", b"token=" + logins.issue().encode()), logins)
    assert resp.status == 200 and b"<title>edgefn dashboard</title>" in resp.body  # type: ignore[operator]
    cookie = dict(resp.headers)[b"set-cookie"].decode()
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "; Path=/dashboard;" in cookie  # not `/`: every port of the host got it
    sid = cookie.split(";")[0].split("=", 1)[1]
    js = serve.page(get(b"/dashboard/app.js", cookie=f"a=b; edgefn_dash={sid}".encode()), logins)
    assert js.status == 200 and b"EventSource" in js.body  # type: ignore[operator]
    assert serve.allowed(get(b"/v1/dashboard/stream", cookie=f"edgefn_dash={sid}".encode()),
                         logins) is None


def test_an_expired_token_is_401() -> None:
    clock = Clock()
    logins = Logins(clock)
    token = logins.issue()
    clock.now += 60
    resp = serve.page(get(b"/dashboard", b"token=" + token.encode()), logins)
    assert resp.status == 401 and b"expired" in resp.body  # type: ignore[operator]


def test_no_or_a_bad_cookie_is_401_and_unknown_files_404() -> None:
    logins = Logins(Clock())
    assert serve.page(get(b"/dashboard"), logins).status == 401
    assert serve.page(get(b"/dashboard", cookie=b'edgefn_dash="x'), logins).status == 401
    assert serve.page(get(b"/dashboard/../admin.token"), logins).status == 404
    refused = serve.allowed(get(b"/v1/dashboard/stream", cookie=b"edgefn_dash=x"), logins)
    assert refused is not None and refused.status == 401
