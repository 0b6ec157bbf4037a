"""The HTTP front against RFC 9110/9112 where an exploratory run found it wrong: an
endless header line, trailers, upgrades and CONNECT, clients that close, Host and
absolute-form targets, transfer codings, bodiless streamed statuses, 100-continue
for HTTP/1.0, a 408 deadline kept across a response, and the request line."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import pytest

from runtime.net.message import Request, Response
from tests.net.test_protocol import MockTransport, connect, responses, run


def headers_app(request: Request) -> Response:
    """Answers with the request's headers and its host, one per line."""
    body = b"".join(b"%s=%s\n" % kv for kv in request.headers) + b"host:" + request.host
    return Response(200, [], body)


def ended(t: MockTransport) -> bool:
    """The front is done with the connection: closed, or (after a 431, a 413) its
    answer and a FIN sent, what still comes read and dropped for a while."""
    return t.closed or t.eof_written


def test_an_endless_header_line_is_refused_once_past_the_limits() -> None:
    """httptools keeps a header line until it ends (copying it at every read), and
    `on_header` only sees it then: one line with no CRLF grew the PoP by hundreds of
    MB. Now the bytes read without any part of the message ending are counted."""
    async def go() -> None:
        proto, t = connect(max_header_bytes=1000, max_url_bytes=100)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: a\r\nX: ")
        sent = 0
        while not ended(t) and sent < 1 << 20:
            proto.data_received(b"a" * 100)
            sent += 100
        assert ended(t) and responses(t.buffer)[0][0] == 431
        assert sent <= 1000 + 100 + 100  # refused at the first read past the limits
    run(go())


def test_an_endless_header_line_read_whole_at_once_is_refused_at_once() -> None:
    """The line came in the message's first read and nothing followed: before, the
    count began at the next read, so the client got the 408 of `header_timeout`."""
    async def go() -> None:
        proto, t = connect(max_header_bytes=1000, max_url_bytes=100)
        head = b"GET /" + b"u" * 90 + b" HTTP/1.1\r\nHost: a\r\nX: "
        proto.data_received(head + b"a" * (1000 + 100 - 90 - 1))  # within the limits
        assert not t.closed
        proto, t = connect(max_header_bytes=1000, max_url_bytes=100)
        proto.data_received(head + b"a" * 1400)
        assert ended(t) and responses(t.buffer)[0][0] == 431
    run(go())


def test_a_read_ending_one_request_and_beginning_the_next_is_not_counted_whole() -> None:
    """What the previous request took of the read (here a chunked body's framing, which
    no callback counts) is not the next one's head."""
    async def go() -> None:
        proto, t = connect(max_header_bytes=1000, max_url_bytes=100)
        chunks = b"1\r\nx\r\n" * 400 + b"0\r\n\r\n"
        proto.data_received(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                            + chunks + b"GET / HTTP/1.1\r\nHost: a\r\nX: b")
        proto.data_received(b"\r\n\r\n")
        assert [r[0] for r in responses(t.buffer)] == [200, 200]
    run(go())


def test_a_field_value_has_no_whitespace_around_it() -> None:
    """RFC 9110 5.5: leading and trailing SP/HTAB are not part of a field value. llhttp
    dropped the leading only: `X-Api-Key: efn_k ` was another key, `Host: a ` another
    host. (The native lane trims alike: tests/net/test_native_lane*.py send " v ".)"""
    async def go() -> None:
        proto, t = connect(headers_app)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: a \t\r\nX-A: \t v w \t \r\n"
                            b"X-B:   \r\n\r\n")
        status, _, body = responses(t.buffer)[0]
        assert status == 200, body
        assert body == b"host=a\nx-a=v w\nx-b=\nhost:a"
    run(go())


def test_a_trickled_trailer_is_bounded_too() -> None:
    async def go() -> None:
        proto, t = connect(max_header_bytes=1000, max_url_bytes=100)
        proto.data_received(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"3\r\nabc\r\n0\r\nX-T: ")
        for _ in range(30):
            if ended(t):
                break
            proto.data_received(b"b" * 100)
        assert ended(t) and responses(t.buffer)[0][0] == 431
    run(go())


def test_a_large_header_section_in_many_reads_still_passes() -> None:
    async def go() -> None:
        proto, t = connect(headers_app, max_header_bytes=4000, max_url_bytes=100)
        raw = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(
            b"X-%d: %s\r\n" % (i, b"v" * 30) for i in range(60)) + b"\r\n"
        for i in range(0, len(raw), 7):  # 7 bytes a read
            proto.data_received(raw[i:i + 7])
        assert responses(t.buffer)[0][0] == 200 and not t.closed
    run(go())


def test_trailer_fields_are_not_merged_into_the_headers() -> None:
    """A trailer got past the x-edgefn-warmup check (RFC 9110 6.5.1: never merged)."""
    async def go() -> None:
        proto, t = connect(headers_app)
        proto.data_received(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"3\r\nabc\r\n0\r\nx-edgefn-warmup: 1\r\nAuthorization: x\r\n\r\n")
        (status, _, body), = responses(t.buffer)
        assert status == 200 and b"warmup" not in body and b"authorization" not in body
    run(go())


def recording() -> tuple[list[Request], Callable[[Request], Response]]:
    """An app that answers 200 "ran", and the requests it was given."""
    ran: list[Request] = []

    def app(request: Request) -> Response:
        ran.append(request)
        return Response(200, [], b"ran")

    return ran, app


@pytest.mark.parametrize(("raw", "status"), [
    # a body would be skipped by the parser: refused before the function runs
    (b"POST / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
     b"Content-Length: 5\r\n\r\nhello", 400),
    (b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 501),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    (b"GET / HTTP/3.0\r\nHost: a\r\n\r\n", 505),  # (400s: "Invalid HTTP version")
    (b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),  # an HTTP/2 client's preface
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
     b"3\r\nabc\r\n0\r\n\r\n", 501),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"GET /echo#x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET http://a:99999/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 400),  # as nginx (see the next test)
])
def test_what_the_front_does_not_serve_gets_one_answer(raw: bytes, status: int) -> None:
    async def go() -> None:
        ran, app = recording()
        proto, t = connect(app)
        proto.data_received(raw)
        assert [r[0] for r in responses(t.buffer)] == [status] and ran == []
        assert b"User callback error" not in t.buffer and t.closed
    run(go())


def test_a_later_http_1_minor_version_is_served_as_1_1() -> None:
    """RFC 9110 2.5: HTTP/1.2 (or 1.9) is served as the highest 1.x the server
    speaks; it was a 400 "malformed HTTP request: Invalid HTTP version"."""
    async def go() -> None:
        ran, app = recording()
        proto, t = connect(app)
        proto.data_received(b"GET /a HTTP/1.2\r\nHost: a\r\n\r\nGET /b HTTP/1.9\r\n"
                            b"Host: a\r\n\r\n")
        await asyncio.sleep(0)
        got = responses(t.written)
        assert [(r[0], r[2]) for r in got] == [(200, b"ran"), (200, b"ran")], t.written
        assert t.written.startswith(b"HTTP/1.1 200 OK\r\n") and not t.closed
        assert [(r.path, r.http_version, r.keep_alive) for r in ran] == [
            (b"/a", "1.1", True), (b"/b", "1.1", True)]
    run(go())


def test_an_http2_preface_is_told_to_send_http_1_1() -> None:
    async def go() -> None:
        proto, t = connect(lambda request: Response(200, [], b"ran"))
        proto.data_received(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert b"HTTP/2 is not supported: send HTTP/1.1" in t.buffer and t.closed
    run(go())


def test_options_asterisk_is_told_what_the_pop_does_not_serve() -> None:
    """It was told "an absolute request target needs http(s)://host"."""
    async def go() -> None:
        proto, t = connect(lambda request: Response(200, [], b"ran"))
        proto.data_received(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n")
        assert [r[0] for r in responses(t.buffer)] == [400]
        assert b"asterisk-form target (OPTIONS *) is not served" in t.buffer
    run(go())


def test_an_upgrade_without_a_body_is_answered_as_http_1_1_then_closed() -> None:
    """`curl --http2` on http:// asks for h2c: it got a 200 and then a second, 400,
    response to the same request (RFC 9110 7.8: a server may ignore Upgrade)."""
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings"
                            b"\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
        (status, headers, body), = responses(t.buffer)
        assert (status, body, headers.get(b"connection")) == (200, b"GET /a? body=", b"close")
        assert t.closed
    run(go())


def test_the_absolute_form_targets_authority_is_the_host() -> None:
    async def go() -> None:
        proto, t = connect(headers_app)
        proto.data_received(b"GET http://internal.example:8080/p HTTP/1.1\r\n"
                            b"Host: public.example\r\n\r\n")
        (status, _, body), = responses(t.buffer)
        assert status == 200 and body.endswith(b"host:internal.example:8080")
    run(go())


def test_a_client_that_closes_its_side_is_gone() -> None:
    """A half-close reads like a hang-up: the connection closes and what runs for it
    is cancelled (an abandoned model answer must not run to its end)."""
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert proto.eof_received() is False  # asyncio closes the transport
        assert responses(t.buffer)[0][2] == b"GET /1? body="  # answered before the EOF
    run(go())


@pytest.mark.parametrize("status", [204, 304])
def test_a_streamed_bodiless_status_has_no_transfer_encoding(status: int) -> None:
    async def go() -> None:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"ignored"

        proto, t = connect(lambda r: Response(status, [], chunks()))
        proto.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert b"transfer-encoding" not in t.buffer and b"ignored" not in t.buffer
        assert t.buffer.count(b"HTTP/1.1 %d" % status) == 2 and not t.closed  # kept alive
    run(go())


def test_a_head_does_not_wait_on_a_streamed_body() -> None:
    """Its body is never sent: an endless stream held the connection to the function's
    wall limit, and one failing late closed it under the next pipelined request."""
    async def go() -> None:
        streams: list[AsyncGenerator[bytes]] = []

        async def endless() -> AsyncGenerator[bytes]:
            while True:
                yield b"data: tick\n\n"
                await asyncio.sleep(0.01)

        def app(r: Request) -> Response:
            if r.method == b"HEAD":
                streams.append(endless())
                return Response(200, [(b"content-type", b"text/event-stream")], streams[-1])
            return Response(200, [], b"next")

        proto, t = connect(app)
        proto.data_received(b"HEAD /sse HTTP/1.1\r\nHost: a\r\n\r\n"
                            b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert t.buffer.count(b"HTTP/1.1 200") == 2 and b"tick" not in t.buffer
        assert t.buffer.endswith(b"next") and not t.closed
        assert streams[0].ag_frame is None  # started, then closed: what runs for it stops
    run(go())


def test_no_100_continue_for_http_1_0() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        assert t.buffer == b""  # RFC 9110 15.2: no 1xx to an HTTP/1.0 client
        proto.data_received(b"hello")
        assert responses(t.buffer)[0][0] == 200
    run(go())


def test_a_request_arriving_during_a_response_keeps_its_408() -> None:
    """The end of the response before it reset its deadline to the keep-alive one,
    with no 408: a slow client held the connection longer, and got a silent close."""
    async def go() -> None:
        async def slow(request: Request) -> Response:
            await asyncio.sleep(0.05)
            return Response(200, [], b"first")

        proto, t = connect(slow, header_timeout=5.0, keepalive_timeout=60.0)
        proto.data_received(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGE")
        deadline = proto.deadline
        await asyncio.sleep(0.1)
        assert responses(t.buffer)[0][2] == b"first"
        assert (proto.deadline, proto.deadline_status) == (deadline, 408)
        proto.on_deadline()
        assert responses(t.buffer)[-1][0] == 408
    run(go())




def target_app(request: Request) -> Response:
    return Response(200, [], b"%s %s?%s" % (request.host, request.path, request.query))


@pytest.mark.parametrize(("target", "seen"), [
    (b"http://a.example", b"a.example /?"),  # no path: "/"; no port: none in the host
    (b"https://a.example/p?q=1", b"a.example /p?q=1"),
    (b"http://[::1]:8080/p?q", b"[::1]:8080 /p?q"),
    (b"HTTP://EX.COM/qa", b"EX.COM /qa?"),  # the scheme is case-insensitive (was a 400)
    (b"Https://a.example/p", b"a.example /p?"),
])
def test_an_absolute_form_target_gives_the_path_query_and_host(target: bytes,
                                                                seen: bytes) -> None:
    async def go() -> None:
        proto, t = connect(target_app)
        proto.data_received(b"GET %s HTTP/1.1\r\nHost: public.example\r\n\r\n" % target)
        assert [(s, b) for s, _, b in responses(t.buffer)] == [(200, seen)]
    run(go())


@pytest.mark.parametrize(("raw", "status", "reason"), [
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, b"more than one Host header"),
    (b"GET /echo#x HTTP/1.1\r\nHost: a\r\n\r\n", 400, b"a request target has no fragment (#...)"),
    (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 400, b"the asterisk-form target (OPTIONS *) is "
     b"not served: the PoP's functions answer OPTIONS for their own paths"),
    (b"GET ftp://a/x HTTP/1.1\r\nHost: a\r\n\r\n", 400,
     b"an absolute request target needs http(s)://host"),
    (b"GET http://a:99999/ HTTP/1.1\r\nHost: a\r\n\r\n", 400,
     b"request target is neither a path nor an absolute URL: 'http://a:99999/'"),
    (b"GET / HTTP/1.1\r\nHost: a@evil\r\n\r\n", 400,
     b"invalid Host header 'a@evil': expected host[:port]"),
    (b"GET /hello%5C..%5Cprobe HTTP/1.1\r\nHost: a\r\n\r\n", 400,
     b"a request path has no `.` or `..` segments (RFC 3986 5.2.4): send it normalised"),
    (b"FOO / HTTP/1.1\r\nHost: a\r\n\r\n", 501, b"request method 'FOO' is not recognized "
     b"(HTTP methods: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, ...)"),
    (b"G@T / HTTP/1.1\r\nHost: a\r\n\r\n", 400, b"malformed HTTP request: Invalid method"),
])
def test_a_refused_request_is_told_why(raw: bytes, status: int, reason: bytes) -> None:
    async def go() -> None:
        proto, t = connect(target_app)
        proto.data_received(raw)
        ((got, headers, body),) = responses(t.buffer)
        assert (got, headers[b"content-type"]) == (status, b"text/plain; charset=utf-8")
        assert body.startswith(reason)
    run(go())


def test_an_app_that_fails_gets_a_plain_500() -> None:
    def app(request: Request) -> Response:
        raise ValueError("bug")

    async def go() -> None:
        proto, t = connect(app)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        ((status, headers, body),) = responses(t.buffer)
        assert (status, headers[b"content-type"], body) == (
            500, b"text/plain; charset=utf-8", b"internal server error\n")
    run(go())
