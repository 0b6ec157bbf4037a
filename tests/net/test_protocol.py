"""HTTP protocol tests without sockets: a mock transport records what is written."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from email.utils import parsedate_to_datetime
from typing import Any

import pytest

from runtime.net.message import Request, Response
from runtime.net.protocol import LINGER_BYTES, LINGER_SECONDS, HttpProtocol, Outbox
from runtime.net.server import ServerConfig, ServerState


class MockTransport:
    def __init__(self, outbox: Outbox | None = None) -> None:
        self.written = b""
        self.writes = 0
        self.closed = False
        self.eof_written = False  # a FIN after the last response, the connection still read
        self.reading = True
        self.outbox = outbox

    @property
    def buffer(self) -> bytes:
        """What was written once the loop has turned (the responses it answered in
        one go are written then: `runtime.net.protocol.Outbox`)."""
        if self.outbox is not None:
            self.outbox.flush()
        return self.written

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.eof_written, "write after close"
        self.written += data
        self.writes += 1

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high_water = high

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default


def echo_app(request: Request) -> Response:
    body = b"%s %s?%s body=%s" % (request.method, request.path, request.query, request.body)
    return Response(200, [(b"content-type", b"text/plain")], body)


def connect(app: Callable[[Request], Any] = echo_app, **config: Any) -> tuple[HttpProtocol, MockTransport]:
    loop = asyncio.get_running_loop()
    state = ServerState(ServerConfig(**config), loop)
    proto = HttpProtocol(app, state)
    transport = MockTransport(state.outbox)
    proto.connection_made(transport)  # type: ignore[arg-type]
    return proto, transport


def responses(raw: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Split a byte stream of HTTP/1.1 responses (content-length or chunked)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers = dict(line.split(b": ", 1) for line in lines[1:])
        if status == 100:
            raw = rest
            continue
        if headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line, 16)
                body, rest = body + rest[:size], rest[size + 2:]
                if size == 0:
                    break
        else:
            n = int(headers.get(b"content-length", b"0"))
            body, rest = rest[:n], rest[n:]
        out.append((status, headers, body))
        raw = rest
    return out


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_keep_alive_answers_several_requests_on_one_connection() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        proto.data_received(b"GET /b?q=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        got = responses(t.buffer)
        assert [b for _, _, b in got] == [b"GET /a? body=", b"GET /b?q=1 body="]
        assert not t.closed
    run(go())


def test_pipelined_requests_in_one_packet_are_answered_in_order() -> None:
    def slow_then_fast(request: Request) -> Any:
        if request.path == b"/slow":
            async def later() -> Response:
                await asyncio.sleep(0.05)
                return Response(200, [], b"slow")
            return later()
        return Response(200, [], request.path)

    async def go() -> None:
        proto, t = connect(slow_then_fast)
        proto.data_received(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nGET /1 HTTP/1.1\r\nHost: t\r\n\r\n"
                            b"POST /2 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabcGET /3 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert t.buffer == b""  # /slow is first: nothing may overtake it
        await asyncio.sleep(0.1)
        assert [b for _, _, b in responses(t.buffer)] == [b"slow", b"/1", b"/2", b"/3"]
    run(go())


def test_request_split_across_packets_byte_by_byte() -> None:
    async def go() -> None:
        proto, t = connect()
        for byte in b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello":
            proto.data_received(bytes([byte]))
        assert responses(t.buffer)[0][2] == b"POST /p? body=hello"
    run(go())


def test_chunked_request_body_is_reassembled() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        assert responses(t.buffer)[0][2] == b"POST /c? body=hello world"
    run(go())


def test_streaming_response_is_chunked_and_keeps_the_connection() -> None:
    async def events() -> AsyncIterator[bytes]:
        for i in range(3):
            yield b"data: %d\n\n" % i
            await asyncio.sleep(0)

    def app(request: Request) -> Any:
        async def stream() -> Response:
            return Response(200, [(b"content-type", b"text/event-stream")], events())
        return stream()

    async def go() -> None:
        proto, t = connect(app)
        proto.data_received(b"GET /sse HTTP/1.1\r\nHost: t\r\n\r\nGET /sse HTTP/1.1\r\nHost: t\r\n\r\n")
        await asyncio.sleep(0.05)
        got = responses(t.buffer)
        assert len(got) == 2
        _, headers, body = got[0]
        assert headers[b"transfer-encoding"] == b"chunked"
        assert headers[b"content-type"] == b"text/event-stream"
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert not t.closed
    run(go())


def test_stream_failing_midway_cuts_the_connection() -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"part"
        raise RuntimeError("boom")

    async def go() -> None:
        proto, t = connect(lambda r: Response(200, [], broken()))
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        await asyncio.sleep(0.02)
        assert b"4\r\npart\r\n" in t.buffer
        assert not t.buffer.endswith(b"0\r\n\r\n")  # no clean end: the client sees a cut
        assert t.closed
    run(go())


@pytest.mark.parametrize(("raw", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: zz\r\n\r\n", 400),
    (b"GET / HTTP/9.9\r\n\r\n", 505),  # any version but 1.x: 505 (README)
    (b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00", 400),  # a TLS ClientHello on the plain port
    (b"FOO / HTTP/1.1\r\nHost: a\r\n\r\n", 501),  # a method HTTP does not know (9.1)
    (b"GET / HTTP/1.1\r\nHost: t\r\n\r\nBREW /pot HTTP/1.1\r\nHost: t\r\n\r\n", 501),  # the second one
])
def test_malformed_requests_get_400_and_close(raw: bytes, status: int) -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(raw)
        got = [r[0] for r in responses(t.buffer)]
        assert got == ([200, status] if b"BREW" in raw else [status])
        if status == 501:
            assert b"is not recognized" in t.buffer and (b"'FOO'" in t.buffer
                                                         or b"'BREW'" in t.buffer)
        assert t.closed
    run(go())


def test_body_too_large_by_content_length_is_413_before_reading_it() -> None:
    """The 413 and a FIN; what the client still uploads is read and dropped (a close
    with unread data sends a reset, which can discard the 413 at the client) until it
    closes, `LINGER_SECONDS` pass, or `LINGER_BYTES` more arrive."""
    async def go() -> None:
        proto, t = connect(max_body_bytes=10)
        proto.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n")
        assert responses(t.buffer)[0][0] == 413
        assert t.eof_written and not t.closed and t.reading
        proto.data_received(b"GET /next HTTP/1.1\r\nHost: t\r\n\r\n" * 100)  # dropped, not answered
        assert len(responses(t.buffer)) == 1 and not t.closed
        proto.deadline = proto.loop.time() - 1  # what the sweep does at the deadline
        proto.on_deadline()
        assert t.closed
        proto, t = connect(max_body_bytes=10)
        proto.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n")
        assert 1 < proto.deadline - proto.loop.time() <= LINGER_SECONDS
        proto.data_received(b"x" * LINGER_BYTES)
        assert not t.closed
        proto.data_received(b"x")
        assert t.closed
    run(go())


def test_a_json_client_gets_the_front_errors_as_json() -> None:
    """An API client (the `openai` package sends JSON) parses the error it gets; a
    plain one reads text."""
    async def go() -> None:
        for head, ctype in ((b"Content-Type: application/json\r\n", b"application/json"),
                            (b"Accept: application/json\r\n", b"application/json"),
                            (b"Content-Type: text/plain\r\n", b"text/plain; charset=utf-8")):
            proto, t = connect(max_body_bytes=10)
            proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n" + head +
                                b"Content-Length: 11\r\n\r\n")
            ((status, headers, body),) = responses(t.buffer)
            assert (status, headers[b"content-type"]) == (413, ctype) and t.eof_written
            if ctype == b"application/json":
                assert json.loads(body) == {"error": {
                    "message": "request body larger than 10 bytes",
                    "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
            else:
                assert body == b"request body larger than 10 bytes\n"
    run(go())


def test_chunked_body_too_large_is_413() -> None:
    async def go() -> None:
        proto, t = connect(max_body_bytes=10)
        proto.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n")
        assert responses(t.buffer)[0][0] == 413
        assert t.eof_written
    run(go())


def test_headers_too_large_is_431_and_url_too_long_is_414() -> None:
    async def go() -> None:
        proto, t = connect(max_header_bytes=100)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 200 + b"\r\n\r\n")
        assert responses(t.buffer)[0][0] == 431
        proto, t = connect(max_url_bytes=50)
        proto.data_received(b"GET /" + b"a" * 100 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        assert responses(t.buffer)[0][0] == 414
    run(go())


def test_error_after_pipelined_good_request_keeps_order() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\nNOT HTTP\r\n\r\n")
        got = responses(t.buffer)
        assert [s for s, _, _ in got] == [200, 400]
        assert t.closed
    run(go())


def test_slow_client_gets_408_and_idle_client_is_closed_silently() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        proto.on_deadline()
        assert responses(t.buffer)[0][0] == 408
        assert t.closed
        proto, t = connect()
        proto.on_deadline()  # idle keep-alive connection
        assert t.buffer == b"" and t.closed
    run(go())


def test_server_sweeper_expires_a_slow_client_for_real() -> None:
    async def go() -> None:
        from runtime.net.server import Server

        server = Server(echo_app, ServerConfig(header_timeout=0.2, sweep_interval=0.05))
        await server.start("127.0.0.1", 0)
        host, port = server.address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        assert data.startswith(b"HTTP/1.1 408")
        writer.close()
        await server.shutdown(1)
    run(go())


def test_app_exception_is_a_500_and_the_connection_survives() -> None:
    def app(request: Request) -> Response:
        if request.path == b"/boom":
            raise ValueError("bug")
        return Response(200, [], b"fine")

    async def go() -> None:
        proto, t = connect(app)
        proto.data_received(b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\nGET /next HTTP/1.1\r\nHost: t\r\n\r\n")
        got = responses(t.buffer)
        assert [(s, b) for s, _, b in got] == [(500, b"internal server error\n"), (200, b"fine")]
    run(go())


def test_http10_closes_and_head_has_no_body() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n")
        head = t.buffer
        assert head.endswith(b"\r\n\r\n") and b"content-length: 14" in head
        proto, t = connect()
        proto.data_received(b"GET / HTTP/1.0\r\n\r\n")
        assert b"connection: close" in t.buffer and t.closed
    run(go())


def test_expect_100_continue_is_answered_before_the_body() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert t.buffer == b"HTTP/1.1 100 Continue\r\n\r\n"
        proto.data_received(b"ok")
        assert responses(t.buffer)[0][2] == b"POST /? body=ok"
    run(go())


def test_a_pipelined_100_continue_comes_once_the_requests_before_it_are_answered() -> None:
    """Its head read while an earlier request's answer was on its way, the 100 was
    never sent: the client waited for it, then got body_timeout's 408 (RFC 9110
    10.1.1: a server MUST send a 100 or a final status)."""
    released = asyncio.Event()

    async def later(r: Request) -> Response:
        await released.wait()
        return echo_app(r)

    def app(r: Request) -> Any:
        return later(r) if r.path == b"/slow" else echo_app(r)

    async def go() -> None:
        proto, t = connect(app)
        proto.data_received(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nPOST /b HTTP/1.1\r\n"
                            b"Host: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        await asyncio.sleep(0.01)
        assert t.written == b""  # nothing yet: /slow is not answered
        released.set()
        for _ in range(50):
            await asyncio.sleep(0.001)
            if t.written.endswith(b"100 Continue\r\n\r\n"):
                break
        assert t.written.startswith(b"HTTP/1.1 200 OK\r\n")
        assert t.written.endswith(b"GET /slow? body=HTTP/1.1 100 Continue\r\n\r\n")
        proto.data_received(b"ok")
        await asyncio.sleep(0.01)
        assert [r[2] for r in responses(t.written)] == [b"GET /slow? body=", b"POST /b? body=ok"]
        # a body sent without waiting for it: no 100 once its turn comes
        released.clear()
        proto.data_received(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\nPOST /c HTTP/1.1\r\n"
                            b"Host: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi")
        released.set()
        await asyncio.sleep(0.02)
        assert t.written.count(b"100 Continue") == 1
        assert [r[2] for r in responses(t.written)][2:] == [b"GET /slow? body=",
                                                            b"POST /c? body=hi"]
    run(go())


def test_answers_wait_for_the_loops_turn_then_go_out_in_one_write_per_connection() -> None:
    """Responses a loop iteration answered are written after it, together: two
    connections' and, pipelined on one, two in one write, in order."""
    async def go() -> None:
        (a, ta), (b, tb) = connect(), connect()
        a.data_received(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n")
        b.data_received(b"GET /3 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert ta.written == tb.written == b""  # not yet: the loop has not turned
        await asyncio.sleep(0)
        assert [r[2] for r in responses(ta.written)] == [b"GET /1? body=", b"GET /2? body="]
        assert [r[2] for r in responses(tb.written)] == [b"GET /3? body="]
        assert (ta.writes, tb.writes) == (1, 1)
    run(go())


def test_what_else_a_connection_writes_comes_after_its_waiting_answers() -> None:
    """A 100 Continue, a stream's head and a close each send the answers already
    waiting first: a connection's bytes keep the order of its requests."""
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nPOST /b HTTP/1.1\r\nHost: t\r\n"
                            b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        first = b"HTTP/1.1 200 OK\r\n"
        assert t.written.startswith(first) and t.written.endswith(
            b"GET /a? body=HTTP/1.1 100 Continue\r\n\r\n")  # without the loop turning

        async def chunks() -> AsyncIterator[bytes]:
            yield b"streamed"

        def app(r: Request) -> Response:
            return Response(200, [], chunks()) if r.path == b"/s" else echo_app(r)

        proto, t = connect(app)
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /s HTTP/1.1\r\nHost: t\r\n\r\n"
                            b"GET /c HTTP/1.0\r\n\r\n")
        for _ in range(50):
            await asyncio.sleep(0.001)
            if t.closed:
                break
        assert [r[2] for r in responses(t.written)] == [b"GET /a? body=", b"streamed",
                                                        b"GET /c? body="]
        assert t.closed  # the 1.0 answer was written before the close
    run(go())


def test_an_answer_ready_when_the_client_half_closes_is_sent_before_the_close() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n")
        if not proto.eof_received():  # what asyncio does then: close, connection lost
            t.close()
            proto.connection_lost(None)
        assert responses(t.written)[0][2] == b"GET /1? body="
    run(go())


def test_answers_past_write_buffer_bytes_are_written_at_once() -> None:
    async def go() -> None:
        proto, t = connect(lambda r: Response(200, [], b"x" * (int(r.path[1:]))),
                           write_buffer_bytes=1000)
        proto.data_received(b"GET /400 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert t.written == b""
        proto.data_received(b"GET /500 HTTP/1.1\r\nHost: a\r\n\r\n")  # 900 + two heads
        assert [len(r[2]) for r in responses(t.written)] == [400, 500] and t.writes == 1
        proto.data_received(b"GET /1000 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert t.writes == 2 and len(responses(t.written)) == 3
        await asyncio.sleep(0)
        assert t.writes == 2  # nothing was left waiting
    run(go())


def test_a_request_whose_client_leaves_before_its_turn_still_runs_its_cleanups() -> None:
    """A pipelined request's task was made when the one before it answered; a reset
    that came before that task's first step cancelled it unstarted, so nothing of the
    app's awaitable ran, `finally` blocks included: the dispatch stage's concurrency
    slot leaked (enough resets left a function answering 503 for good)."""
    async def go() -> None:
        held = 0
        answers: list[asyncio.Future[Response]] = []

        def app(request: Request) -> Any:
            nonlocal held
            held += 1  # as `dispatch` takes a slot before it returns the awaitable
            answer = asyncio.get_running_loop().create_future()
            answers.append(answer)

            async def counted() -> Response:
                nonlocal held
                try:
                    return await answer
                finally:
                    held -= 1
            return counted()

        proto, t = connect(app)
        proto.data_received(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
        answers[0].set_result(Response(200, [], b"one"))
        await asyncio.sleep(0)  # /1 answered, /2's task made; the reset comes next
        t.close()
        proto.connection_lost(ConnectionResetError())
        for _ in range(5):
            await asyncio.sleep(0)
        assert held == 0
    run(go())


def test_many_pipelined_requests_that_answer_at_once_behind_a_waiting_one_all_answer() -> None:
    """A task started at once that also answered at once dispatched the next request
    from inside itself: 2000 pipelined behind one that waited nested that deep
    (RecursionError, a few hundred answered, the connection hung)."""
    async def go() -> None:
        first = asyncio.get_running_loop().create_future()

        def app(request: Request) -> Any:
            async def answer() -> Response:
                if request.path == b"/wait":
                    await first
                return Response(200, [], request.path)
            return answer()

        proto, t = connect(app)
        proto.data_received(b"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n" + b"".join(
            b"GET /%d HTTP/1.1\r\nHost: a\r\n\r\n" % i for i in range(2000)))
        first.set_result(None)
        for _ in range(20):
            await asyncio.sleep(0)
        got = [r[2] for r in responses(t.buffer)]
        assert got == [b"/wait", *(b"/%d" % i for i in range(2000))]
    run(go())


def test_app_headers_cannot_override_framing() -> None:
    async def go() -> None:
        proto, t = connect(lambda r: Response(200, [(b"content-length", b"999"),
                                                    (b"transfer-encoding", b"chunked")], b"abc"))
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert t.buffer.count(b"content-length") == 1 and b"chunked" not in t.buffer
        assert responses(t.buffer)[0][2] == b"abc"
    run(go())


def test_shutdown_finishes_in_flight_response_then_closes() -> None:
    async def go() -> None:
        def app(request: Request) -> Any:
            async def later() -> Response:
                await asyncio.sleep(0.05)
                return Response(200, [], b"done")
            return later()
        proto, t = connect(app)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        proto.shutdown()
        assert not t.closed  # busy: not cut
        await asyncio.sleep(0.1)
        got = responses(t.buffer)
        assert got[0][2] == b"done" and got[0][1][b"connection"] == b"close"
        assert t.closed
        idle, t2 = connect()
        idle.shutdown()
        assert t2.closed
    run(go())


def test_pipelining_flood_pauses_reading() -> None:
    async def go() -> None:
        def app(request: Request) -> Any:
            async def later() -> Response:
                await asyncio.sleep(0.01)
                return Response(200, [], b"x")
            return later()
        proto, t = connect(app, max_pipelined=4)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 10)
        assert not t.reading
        await asyncio.sleep(0.3)
        assert len(responses(t.buffer)) == 10
        assert t.reading
    run(go())


# -- property: any way of cutting the byte stream gives the same answers -------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

REQUESTS = [
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /b?q=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    b"PUT /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
    b"DELETE /d HTTP/1.1\r\nHost: t\r\nX-A: 1\r\nX-B: 2\r\n\r\n",
]


@settings(max_examples=150, deadline=None)
@given(order=st.lists(st.sampled_from(range(len(REQUESTS))), min_size=1, max_size=6),
       cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12))
def test_pipelined_stream_cut_anywhere_gives_the_same_responses(order: list[int],
                                                                cuts: list[int]) -> None:
    stream = b"".join(REQUESTS[i] for i in order)
    expected = [b"GET /a? body=", b"POST /b?q=1 body=hello", b"PUT /c? body=abcde",
                b"DELETE /d? body="]

    async def go() -> list[bytes]:
        proto, t = connect()
        pos = 0
        for cut in [*sorted(set(cuts)), len(stream)]:
            if cut > pos:
                proto.data_received(stream[pos:cut])
                pos = cut
        return [b for _, _, b in responses(t.buffer)]

    assert run(go()) == [expected[i] for i in order]


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=300), max_size=8),
       prefix=st.sampled_from([b"", b"GET / HTTP/1.1\r\nHost: t\r\n", b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"]))
def test_no_input_raises_out_of_the_protocol(chunks: list[bytes], prefix: bytes) -> None:
    async def go() -> None:
        proto, t = connect()
        for chunk in [prefix, *chunks]:
            proto.data_received(chunk)  # must never raise
        proto.on_deadline()
        proto.connection_lost(None)
        for status, _, _ in responses(t.buffer):
            assert status in (200, 400, 408, 413, 414, 431)
    run(go())


class SlowReaderTransport(MockTransport):
    """A transport whose client reads nothing: past the high-water mark it tells the
    protocol to pause writing, as uvloop does; `drain` is the client catching up."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: HttpProtocol | None = None
        self.unsent = 0

    def write(self, data: bytes) -> None:
        super().write(data)
        self.unsent += len(data)
        assert self.protocol is not None
        if self.unsent > (self.high_water or 0) and not self.protocol.write_paused:
            self.protocol.pause_writing()

    def drain(self) -> None:
        self.unsent = 0
        assert self.protocol is not None
        self.protocol.resume_writing()


def slow_reader(app: Callable[[Request], Any], **config: Any) -> tuple[HttpProtocol,
                                                                        SlowReaderTransport]:
    proto = HttpProtocol(app, ServerState(ServerConfig(**config), asyncio.get_running_loop()))
    t = SlowReaderTransport()
    t.protocol = proto
    proto.connection_made(t)  # type: ignore[arg-type]
    return proto, t


def test_pipelined_responses_wait_while_the_client_reads_nothing() -> None:
    async def go() -> None:
        proto, t = slow_reader(lambda r: Response(200, [], b"z" * 3000), write_buffer_bytes=1024)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 10)
        assert len(responses(t.buffer)) == 1  # the first one went past the mark
        assert not t.reading
        t.drain()
        assert len(responses(t.buffer)) == 2
        for _ in range(8):
            t.drain()
        assert len(responses(t.buffer)) == 10
        assert t.reading  # all answered: read again
    run(go())


async def settled(reached: Callable[[], bool]) -> None:
    """Wait (up to 5 s) for `reached`, then give the loop a few more turns."""
    for _ in range(500):
        if reached():
            break
        await asyncio.sleep(0.01)
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_stream_is_not_pulled_while_the_client_reads_nothing() -> None:
    pulled = []

    async def endless() -> AsyncIterator[bytes]:
        while len(pulled) < 100:
            pulled.append(1)
            yield b"c" * 600
            await asyncio.sleep(0)

    async def go() -> None:
        async def stream() -> Response:
            return Response(200, [], endless())
        proto, t = slow_reader(lambda r: stream(), write_buffer_bytes=1024)
        proto.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        await settled(lambda: len(pulled) >= 2)
        assert len(pulled) == 2  # 1200 bytes unsent: past 1024, so no third chunk
        t.drain()
        await settled(lambda: len(pulled) >= 4)
        assert len(pulled) == 4
    run(go())


def test_a_connection_past_a_cap_gets_503_with_retry_after_and_is_closed() -> None:
    async def go() -> None:
        state = ServerState(ServerConfig(max_connections=2, retry_after=7),
                            asyncio.get_running_loop())
        admitted = []
        for _ in range(3):
            proto, t = HttpProtocol(echo_app, state), MockTransport()
            proto.connection_made(t)  # type: ignore[arg-type]
            admitted.append((proto, t))
        assert admitted[2][1].buffer == b""  # the answer waits for the request (no RST)
        admitted[2][0].data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        (status, headers, _), = responses(admitted[2][1].buffer)
        assert (status, headers[b"retry-after"], admitted[2][1].closed) == (503, b"7", True)
        assert [t.buffer for _, t in admitted[:2]] == [b"", b""]
        admitted[2][0].connection_lost(None)  # a refused one frees no slot it never held
        assert len(state.connections) == 2
        admitted[0][0].connection_lost(None)
        proto, t = HttpProtocol(echo_app, state), MockTransport()
        proto.connection_made(t)  # type: ignore[arg-type]
        assert not t.closed
    run(go())


def test_a_refused_connection_that_sends_nothing_gets_its_503_at_the_deadline() -> None:
    async def go() -> None:
        state = ServerState(ServerConfig(max_connections_per_client=1),
                            asyncio.get_running_loop())
        first, refused = HttpProtocol(echo_app, state), HttpProtocol(echo_app, state)
        first.connection_made(MockTransport())  # type: ignore[arg-type]
        t = MockTransport()
        refused.connection_made(t)  # type: ignore[arg-type]
        assert 0 < refused.deadline - state.loop.time() <= 1.0
        refused.on_deadline()
        assert responses(t.buffer)[0][0] == 503 and t.closed
        assert not state.refusing
    run(go())


def test_pipelined_bodies_past_max_body_bytes_pause_reading() -> None:
    async def go() -> None:
        def app(request: Request) -> Any:
            async def later() -> Response:
                await asyncio.sleep(0.01)
                return Response(200, [], b"%d" % len(request.body))
            return later()
        proto, t = connect(app, max_body_bytes=1000)
        post = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 600\r\n\r\n" + b"b" * 600
        proto.data_received(post * 2)  # one in the app, one queued: 600 bytes waiting
        assert t.reading
        proto.data_received(post)  # 1200 bytes of bodies waiting: past 1000
        assert not t.reading
        await settled(lambda: len(responses(t.buffer)) == 3)
        assert [b for _, _, b in responses(t.buffer)] == [b"600"] * 3
        assert t.reading
    run(go())


def test_every_response_is_dated_once_the_apps_own_date_kept() -> None:
    """RFC 9110 6.6.1: an origin server with a clock sends Date (there was none)."""
    async def go() -> None:
        before = int(time.time())
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
        assert t.buffer.count(b"\r\ndate: ") == 1
        date = responses(t.buffer)[0][1][b"date"]
        assert date.endswith(b" GMT")
        assert before <= parsedate_to_datetime(date.decode()).timestamp() <= time.time()
        stored = b"Sun, 06 Nov 1994 08:49:37 GMT"
        proto, t = connect(lambda r: Response(200, [(b"date", stored)], b"x"))
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
        assert t.buffer.count(b"\r\ndate: ") == 1 and responses(t.buffer)[0][1][b"date"] == stored
        state = proto.state  # the date is made once a second, on a timer of the loop
        assert state.date_timer is not None and 0 < state.date_timer.when() - \
            asyncio.get_running_loop().time() <= 1.01
        state.stop()
        assert state.date_timer is None
    run(go())


def test_a_chunked_http10_request_closes_the_connection_after_its_answer() -> None:
    """RFC 9112 6.1: Transfer-Encoding in 1.0 is faulty framing. A 1.0 hop in front
    ignores it (no body), so what followed the chunks was answered as a request."""
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"POST /a HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: "
                            b"chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /smuggled HTTP/1.0\r\n"
                            b"Connection: keep-alive\r\n\r\n")
        got = responses(t.buffer)
        assert [(s, b) for s, _, b in got] == [(200, b"POST /a? body=abc")]
        assert got[0][1][b"connection"] == b"close" and t.closed
    run(go())


def test_http10_keep_alive_is_announced_and_205_has_no_content() -> None:
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert responses(t.buffer)[0][1][b"connection"] == b"keep-alive" and not t.closed
        proto, t = connect(lambda r: Response(205, [], b"some content"))
        proto.data_received(b"GET /reset HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n")
        got = responses(t.buffer)
        assert [(s, h[b"content-length"], b) for s, h, b in got] == [(205, b"0", b"")] * 2
        assert b"connection" not in got[0][1]  # 1.1: kept open without saying so
    run(go())


@pytest.mark.parametrize("host", [b"a, b", b"a@evil.example", b"evil.example/x?", b"a b/c@d",
                                  b"[::1", b"h:80:80", b"h\\x"])
def test_a_host_that_is_not_host_and_port_is_400(host: bytes) -> None:
    """RFC 9112 3.2: functions building links from the Host got "a@evil.example"."""
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
        got = responses(t.buffer)
        assert [s for s, _, _ in got] == [400] and b"invalid Host header" in got[0][2]
    run(go())


@pytest.mark.parametrize("path", [b"/hello/../probe", b"/probe/%2e%2e/hello", b"/a/.",
                                  b"/./a", b"/a/%2E/b", b"/a/..?q=1", b"/a/..%2fb",
                                  b"/a%2F..%2Fb", b"/a/..%5cb", b"/a\\..\\b"])
def test_a_path_with_dot_segments_is_400(path: bytes) -> None:
    """Routed as sent, /hello/../probe was served by hello; a function normalising
    its path acted on /probe."""
    async def go() -> None:
        proto, t = connect()
        proto.data_received(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
        got = responses(t.buffer)
        assert [s for s, _, _ in got] == [400] and b"segments" in got[0][2]
    run(go())


def test_plain_hosts_and_dotted_names_pass_and_an_absolute_target_names_the_host() -> None:
    seen: list[tuple[bytes, bytes, list[bytes]]] = []

    def app(r: Request) -> Response:
        seen.append((r.host, r.path, [v for k, v in r.headers if k == b"host"]))
        return Response(200, [], b"")

    async def go() -> None:
        for host, path in ((b"", b"/a/.b"), (b"example.com:8080", b"/a..b/c"),
                           (b"[::1]:80", b"/static/..x%2f"), (b"127.0.0.1", b"/.well-known/x"),
                           (b"h", b"/my%20docs/a.b%2fc")):
            proto, t = connect(app)
            proto.data_received(b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, host))
            assert responses(t.buffer)[0][0] == 200, (host, path)
        proto, t = connect(app)
        proto.data_received(b"GET http://other.example:8443/p HTTP/1.1\r\nHost: x\r\n\r\n")
        assert seen[-1] == (b"other.example:8443", b"/p", [b"other.example:8443"])
        proto, t = connect(app)  # an IPv6 literal keeps its brackets (it was refused)
        proto.data_received(b"GET http://[::1]:8080/p HTTP/1.1\r\nHost: x\r\n\r\n")
        assert seen[-1] == (b"[::1]:8080", b"/p", [b"[::1]:8080"])
    run(go())


def test_an_http11_request_without_host_is_400_and_http10_needs_none() -> None:
    """RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request with no Host."""
    async def go() -> None:
        for raw in (b"GET /a HTTP/1.1\r\n\r\n", b"GET http://h/a HTTP/1.1\r\n\r\n"):
            proto, t = connect()
            proto.data_received(raw)
            ((status, _, body),) = responses(t.buffer)
            assert status == 400 and b"needs a Host header" in body and t.closed, raw
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.0\r\n\r\n")
        assert responses(t.buffer)[0][0] == 200
    run(go())


def test_a_streamed_205_sends_no_content_and_front_errors_are_dated() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"hello"

    async def go() -> None:
        proto, t = connect(lambda r: Response(205, [], chunks()))
        proto.data_received(b"GET /r HTTP/1.1\r\nHost: h\r\n\r\n")
        for _ in range(20):
            await asyncio.sleep(0)
        ((status, _, body),) = responses(t.buffer)
        assert (status, body) == (205, b"") and b"hello" not in t.buffer
        proto, t = connect()
        proto.data_received(b"GET /a HTTP/1.1\r\n\r\n")  # no Host: the front's own 400
        assert responses(t.buffer)[0][0] == 400 and b"\r\ndate: " in t.buffer
    run(go())
