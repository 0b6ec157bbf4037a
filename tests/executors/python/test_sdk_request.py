"""The guest SDK's Request as the isolate loop makes it from the PoP's encoding:
headers, params, query and url are decoded when first read, and read the same as
a Request built by hand. No processes: the SDK is plain Python.

The SDK imported is this checkout's (``functions/sdk/python``), not whatever
``edgefn`` the environment has installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qsl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgefn_core.abi import encode_pairs, encode_params, encode_request
from edgefn_core.errors import ProtocolError


def load_sdk() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "functions/sdk/python/edgefn/__init__.py"
    spec = importlib.util.spec_from_file_location("edgefn_checkout_sdk", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sdk = load_sdk()
HEADERS = [(b"host", b"edge.example"), (b"x-name", "café".encode()), (b"x-two", b"1"),
           (b"x-two", b"2"), (b"traceparent", b"00-abc-def-01")]


def decode(query: bytes = b"a=1&b=&a=3", params: dict[str, str] | None = None,
           principal: list[tuple[bytes, bytes]] | None = None) -> tuple[object, dict[str, str]]:
    buf = encode_request(b"POST", b"/users/42", query, HEADERS,
                         encode_pairs([(b"MODE", b"test")]), b"{}",
                         encode_params(params or {"id": "42"}),
                         encode_pairs(principal) if principal else b"")
    return sdk.Request._decode(buf)


def test_a_decoded_request_reads_every_field() -> None:
    request, env = decode()
    assert (request.method, request.path, request.query_string, request.body) == (
        "POST", "/users/42", "a=1&b=&a=3", b"{}")
    assert request.query == {"a": "3", "b": ""}
    assert request.params == {"id": "42"}
    assert request.headers.get("X-Name") == "café"
    assert request.headers.get_all("x-two") == ["1", "2"]
    assert request.url == "http://edge.example/users/42?a=1&b=&a=3"
    assert env == {"MODE": "test"}
    assert (request.principal, request.bot, request.agent) == (None, None, None)


def test_a_decoded_request_without_a_query_or_host_header() -> None:
    buf = encode_request(b"GET", b"/", b"", [], b"", b"")
    request, env = sdk.Request._decode(buf)
    assert (request.query, request.params, request.headers.items(), env) == ({}, {}, [], {})
    assert request.url == "http://localhost/"


def test_the_principal_is_decoded_with_the_request() -> None:
    request, _ = decode(principal=[(b"kind", b"key"), (b"tenant", b"acme"), (b"bot", b"browser")])
    assert (request.principal.tenant, request.bot) == ("acme", "browser")


def test_decoded_fields_are_read_once_and_can_be_replaced() -> None:
    request, _ = decode()
    assert request.headers is request.headers  # decoded once, then the same object
    request.headers = sdk.Headers([("host", "other")])
    request.query = {"q": "1"}
    assert (request.headers.get("host"), request.query) == ("other", {"q": "1"})


def test_a_request_built_by_hand_reads_as_before() -> None:
    request = sdk.Request("GET", "/p", "x=1", sdk.Headers([("Host", "h")]), b"")
    assert (request.query, request.params, request.url) == ({"x": "1"}, {}, "http://h/p?x=1")


def test_a_malformed_request_is_refused_naming_the_field() -> None:
    buf = encode_request(b"GET", b"/p", b"", HEADERS, b"", b"")
    with pytest.raises(ProtocolError, match="header"):
        sdk.Request._decode(buf[:30])


def test_a_response_takes_a_fetch_responses_headers_and_a_dict_s_names_once() -> None:
    """`Response(r.body, status=r.status, headers=r.headers)` (a proxy) raised "too many
    values to unpack"; a dict naming Content-Type and content-type sent both; and
    `Response.json` replaced a type the handler chose."""
    sdk = load_sdk()
    fetched = sdk.Headers([("Content-Type", "text/csv"), ("set-cookie", "a=1"),
                           ("set-cookie", "b=2")])
    assert (len(fetched), fetched.keys()) == (3, ["content-type", "set-cookie", "set-cookie"])
    proxied = sdk.Response(b"x,y", 200, fetched)
    assert proxied.headers.items() == fetched.items()
    both = sdk.Response("hi", headers={"Content-Type": "text/html", "content-type": "text/csv"})
    assert both.headers.items() == [("content-type", "text/csv")]
    problem = sdk.Response.json({"title": "nope"}, 400,
                                headers={"content-type": "application/problem+json"})
    assert problem.headers.get_all("content-type") == ["application/problem+json"]
    assert sdk.Response.json([]).headers.get("content-type") == "application/json"
    for status in (204, 304):  # no content, so no type of it (as `Response(str)` does)
        assert sdk.Response.json(None, status).headers.get("content-type") is None
    pairs = sdk.Response(b"", 204, [("set-cookie", "a=1"), ("set-cookie", "b=2")])
    assert pairs.headers.get_all("set-cookie") == ["a=1", "b=2"]


def test_a_value_that_is_not_bytes_or_str_is_named() -> None:
    """`kv.put("k", 5)` raised "a bytes-like object is required, not 'int'" from inside
    the SDK's base64 step (`bytes(5)` would store five NUL bytes)."""
    sdk = load_sdk()
    with pytest.raises(TypeError, match="expected bytes or str, got int"):
        sdk._bytes(5)
    hi = [sdk._bytes(v) for v in ("hi", b"hi", bytearray(b"hi"), memoryview(b"hi"))]
    assert hi == [b"hi"] * 4 and {type(v) for v in hi} == {bytes}


@given(st.text("ab=&%+2F c\u00e9", max_size=24))
def test_the_query_reads_as_parse_qsl_reads_it(query: str) -> None:
    """Without `%` or `+` it is split by hand (nothing to unquote); with them
    `parse_qsl` reads it: both as ``parse_qsl(..., keep_blank_values=True)``."""
    request, _ = sdk.Request._decode(encode_request(
        b"GET", b"/", query.encode("latin-1", "replace"), [], encode_pairs([]), b""))
    assert request.query == dict(parse_qsl(request.query_string, keep_blank_values=True))


@pytest.mark.parametrize(("body", "status", "headers"), [
    ("text", 200, [("content-type", "text/plain; charset=utf-8")]),
    ("text", 404, [("content-type", "text/plain; charset=utf-8")]),
    ("", 204, []), ("", 304, []), (b"bytes", 200, []), (iter([b"a"]), 200, []),
])
def test_a_response_without_headers_types_text_only(body: object, status: int,
                                                    headers: list[tuple[str, str]]) -> None:
    assert sdk.Response(body, status).headers.items() == headers
    assert sdk.Response(body, status, {}).headers.items() == headers  # as the dict path does


# a query's raw bytes as a client may send them: escapes valid, short, invalid or of
# bytes that are not UTF-8, `+`, empty fields and names, `=` in values, any byte
QUERY_PART = st.sampled_from([b"a", b"b", b"=", b"&", b"&&", b"+", b"%", b"%2", b"%20", b"%2B",
                              b"%26", b"%3D", b"%zz", b"%C3%A9", b"%ff", b"%E2%82", b"\xe9",
                              b"\xff", b";", b"#", b" ", b"\x00", b"==", b"a=b=c"])
QUERIES = st.lists(QUERY_PART | st.binary(max_size=3), max_size=12).map(b"".join)


@given(QUERIES)
def test_any_query_reads_as_parse_qsl_reads_it(raw: bytes) -> None:
    """The fast path (no `%`, no `+`) and `parse_qsl` agree on any bytes the PoP
    passes on (latin-1 text: one character a byte), as on a str built by hand."""
    request, _ = sdk.Request._decode(encode_request(b"GET", b"/", raw, [], encode_pairs([]), b""))
    assert request.query == dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))
    by_hand = raw.decode("utf-8", "replace") + "\u2603=\u00e9&"
    assert sdk.Request("GET", "/", by_hand, sdk.Headers(), b"").query == dict(
        parse_qsl(by_hand, keep_blank_values=True))


BODIES = st.sampled_from(["", "text", b"", b"bytes", bytearray(b"b"), memoryview(b"m")])


@given(BODIES, st.integers(100, 599) | st.sampled_from([204, 304]))
def test_a_response_without_headers_is_one_with_no_headers(body: object, status: int) -> None:
    """The fast path of ``headers=None`` builds what the checked path builds from `[]`."""
    fast, checked = sdk.Response(body, status), sdk.Response(body, status, [])
    assert (fast.body, fast.status, fast.headers.items()) == (
        checked.body, checked.status, checked.headers.items())
    assert type(fast.headers) is type(checked.headers)
