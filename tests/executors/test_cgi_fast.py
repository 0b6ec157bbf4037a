"""`wasi.environ` and `wasi.parse_response`, written for speed (a cache of header
names' variables, bytes methods instead of regular expressions), against their plain
statement below: the same variables in the same order, the same status, headers and
body, the same failures, for any request and any CGI output hypothesis makes."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core.abi import BAD_HEADER_VALUE, HEADER_NAME, check_head_size
from edgefn_core.errors import FunctionError
from runtime.executors.wasm import wasi
from runtime.net.message import Request

SKIP = frozenset({b"content-length", b"content-type", b"authorization"})


def environ(request: Request, route: str, env: dict[str, str], params: Mapping[str, str],
            principal: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    def text(raw: bytes) -> str:
        return raw.decode("utf-8", "replace")

    out = [
        ("REQUEST_METHOD", text(request.method)),
        ("PATH_INFO", text(request.path)),
        ("QUERY_STRING", text(request.query)),
        ("SERVER_PROTOCOL", f"HTTP/{request.http_version}"),
        ("CONTENT_LENGTH", str(len(request.body))),
        ("CONTENT_TYPE", text(request.header(b"content-type") or b"")),
        ("X_MATCHED_ROUTE", route),
        ("REMOTE_ADDR", request.client.rsplit(":", 1)[0]),
    ]
    for name, value in request.headers:
        if name not in SKIP:
            out.append(("HTTP_" + text(name).upper().replace("-", "_"), text(value)))
    out += [(wasi.param_variable(k), text(v.encode("latin-1"))) for k, v in params.items()]
    if principal:
        out += [(f"EDGEFN_PRINCIPAL_{k.upper()}", v) for k, v in principal.items()]
        if "tenant" in principal:
            out.append(("REMOTE_USER", principal["tenant"]))
    taken = {k for k, _ in out}
    return [(k, v) for k, v in env.items() if k not in taken] + out


def parse_response(output: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    if output.startswith((b"\n", b"\r\n")):
        raise FunctionError("bad_response", 502, "CGI output starts with a blank line: "
                            "write a header line (Content-Type, Status or Location; RFC "
                            "3875 6.2) before the blank line that ends them")
    end = re.search(rb"\r?\n\r?\n", output)
    if end is None:
        raise FunctionError("bad_response", 502,
                            "CGI output has no blank line ending its headers")
    head, body = output[:end.start()], output[end.end():]
    status = size = 0
    headers: list[tuple[bytes, bytes]] = []
    for line in head.replace(b"\r\n", b"\n").split(b"\n"):
        name, colon, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if not colon or not HEADER_NAME.match(name) or BAD_HEADER_VALUE.search(value):
            raise FunctionError("bad_response", 502, f"invalid CGI header line {line[:80]!r}")
        if name == b"status":
            code = value.split(b" ", 1)[0]
            if not code.isdigit() or not 200 <= int(code) <= 599:
                raise FunctionError("bad_response", 502, f"invalid CGI Status {value[:40]!r}")
            status = int(code)
        else:
            headers.append((name, value))
            size += len(name) + len(value)
    check_head_size(headers, size)
    if not status:
        status = 302 if any(k == b"location" for k, _ in headers) else 200
    return status, headers, body


def outcome(parse: object, output: bytes) -> object:
    try:
        return parse(output)  # type: ignore[operator]
    except FunctionError as e:
        return ("raised", e.code, e.status, str(e))


NAMES = st.sampled_from([b"host", b"content-type", b"content-length", b"authorization",
                         b"x-a", b"x-b-c", b"accept", b"caf\xc3\xa9", b"\xff", b"user-agent"])
SOME_BYTES = st.binary(max_size=12) | st.sampled_from([b"", b"caf\xc3\xa9", b"ok\xff\xfe"])


@settings(max_examples=300, deadline=None)
@given(method=st.sampled_from([b"GET", b"POST", b"HEAD"]), path=SOME_BYTES, query=SOME_BYTES,
       headers=st.lists(st.tuples(NAMES, SOME_BYTES), max_size=8),
       client=st.sampled_from(["127.0.0.1:5", "::1:80", "nocolon", ":9", ""]),
       body=st.binary(max_size=4), version=st.sampled_from(["1.1", "1.0"]),
       params=st.dictionaries(st.sampled_from(["id", "*", "x_y"]),
                              st.text("aé\xff/", max_size=4), max_size=2),
       principal=st.none() | st.dictionaries(st.sampled_from(["tenant", "bot", "kind"]),
                                             st.text("ab", max_size=3), max_size=3),
       env=st.dictionaries(st.sampled_from(["MODE", "PATH_INFO", "HTTP_X_A", "A"]),
                           st.text("xy", max_size=2), max_size=3))
def test_environ_is_its_plain_statement(method: bytes, path: bytes, query: bytes,
                                        headers: list[tuple[bytes, bytes]], client: str,
                                        body: bytes, version: str, params: dict[str, str],
                                        principal: dict[str, str] | None,
                                        env: dict[str, str]) -> None:
    request = Request(method, path, query, headers, b"h", version, True, client)
    request.body = body
    for _ in range(2):  # the second time, every header name's variable is cached
        assert wasi.environ(request, "/r", env, params, principal) == \
            environ(request, "/r", env, params, principal)


LINES = st.sampled_from([b"X-A: b", b"Status: 404 Not Found", b"status:201", b"Status: 150",
                         b"Status: 99", b"Status: 0600", b"Location: /x", b"Bad Name: v", b"NoColon", b"X-B:\tv\t", b"x-c: a\rb",
                         b"x-d: a\x00", b": empty name", b"X-E:", b"  X-F :  v  ", b"\x0bX-G: v",
                         b"Status: abc", b"X-\xff: v", b"x-h: caf\xc3\xa9"])
ENDS = st.sampled_from([b"\n", b"\r\n"])


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.tuples(LINES, ENDS), max_size=6), blank=st.sampled_from(
    [b"\n", b"\r\n", b""]), body=st.binary(max_size=8) | st.sampled_from([b"\n\n", b"\r\n\r\n"]))
def test_parse_response_is_its_plain_statement(lines: list[tuple[bytes, bytes]], blank: bytes,
                                               body: bytes) -> None:
    output = b"".join(line + end for line, end in lines) + blank + body
    assert outcome(wasi.parse_response, output) == outcome(parse_response, output)


@pytest.mark.parametrize("output", [b"X-A: b\n\nok", b"Status: 418 teapot\r\nX-A: b\r\n\r\n",
                                    b"X-A: b\rc\n\n", b"X-\xff: v\n\n"])
def test_examples_agree(output: bytes) -> None:
    assert outcome(wasi.parse_response, output) == outcome(parse_response, output)


def lane_frame(output: bytes) -> bytes | None:
    from runtime.net import lane

    module = lane.load()
    if module is None:
        pytest.skip("the native lane cannot be built here")
    got: bytes | None = module.cgi_frame(output)
    return got


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(st.tuples(LINES, ENDS), max_size=6), blank=st.sampled_from(
    [b"\n", b"\r\n", b"", b"\r\r\n\n"]), body=st.binary(max_size=8) | st.sampled_from(
    [b"\n\n", b"\r\n\r\n"]))
def test_the_lanes_cgi_parse_answers_as_parse_response_or_leaves_it(
        lines: list[tuple[bytes, bytes]], blank: bytes, body: bytes) -> None:
    """lane.c's `cgi_frame` (a command run by the lane's C): where it answers, the
    frame decodes (as the lane writes it) to what `parse_response` gives; where
    `parse_response` raises, it leaves the output to Python (None)."""
    from edgefn_core.abi import decode_response

    output = b"".join(line + end for line, end in lines) + blank + body
    frame, python = lane_frame(output), outcome(wasi.parse_response, output)
    if frame is None:
        assert isinstance(python, tuple) and python[0] == "raised", (output, python)
    else:
        assert decode_response(frame) == python, output


@pytest.mark.parametrize("output", [b"X-A: b\n\nok", b"Status: 418 teapot\r\nX-A: b\r\n\r\n",
                                    b"Location: /x\n\n", b"status: 0200\nX-B:\tv \t\n\nbody",
                                    b"X-A: b\r\r\n\n", b"Content-Type: text/plain\n\n" +
                                    b"x" * 70_000])
def test_the_lanes_cgi_parse_takes_the_plain_answers(output: bytes) -> None:
    from edgefn_core.abi import decode_response

    frame = lane_frame(output)
    assert frame is not None and decode_response(frame) == wasi.parse_response(output)


def test_the_lanes_cgi_parse_leaves_a_head_past_the_limit() -> None:
    """Header fields past MAX_HEAD_BYTES (130 KB of them): parse_response refuses them,
    and the C stops at the limit rather than build a frame of all of them."""
    output = b"x-a: bcdefgh\n" * 10_000 + b"\nbody"
    raised = outcome(wasi.parse_response, output)
    assert isinstance(raised, tuple) and raised[0] == "raised"
    assert lane_frame(output) is None


def test_a_cgi_header_block_is_bounded_before_it_is_split() -> None:
    """5 million `a:` lines (under 16 MiB) were split and read one by one: the PoP's
    loop held 3.7 s."""
    with pytest.raises(FunctionError, match=r"^CGI header block of 14999999 bytes: more than "
                                            r"131072$"):
        wasi.parse_response(b"a:\n" * 5_000_000 + b"\nbody")
    with pytest.raises(FunctionError, match=r"^CGI output has 4097 header lines: more than "
                                            r"4096$"):
        wasi.parse_response(b"a:\n" * 4097 + b"\nbody")
    assert wasi.parse_response(b"a:\n" * 4096 + b"\nbody")[2] == b"body"
    # the lane's C leaves what parse_response refuses to Python, which says why
    assert lane_frame(b"a:\n" * 4097 + b"\nbody") is None
    assert lane_frame(b"a:" + b" " * (1 << 17) + b"\n\nbody") is None  # past MAX_CGI_HEAD
    assert lane_frame(b"a:\n" * 4096 + b"\nbody") is not None
    with pytest.raises(FunctionError, match="starts with a blank line"):
        wasi.parse_response(b"\r\nbody")

