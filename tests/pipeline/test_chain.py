"""The pipeline without sockets: a chain of real stages over a plain Request."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Awaitable
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from edgefn_core.errors import ApiError, EdgefnError, FunctionError
from runtime import config as c
from runtime.ai.openai_api import OpenAITarget
from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.stages.access_log import AccessLog
from runtime.pipeline.stages.openai import OpenAI
from runtime.pipeline.stages.request_id import RequestId
from runtime.pipeline.targets import Targets


def request(path: bytes = b"/hello", headers: list[tuple[bytes, bytes]] | None = None
            ) -> Request:
    return Request(b"GET", path, b"", headers or [], b"example.com", "1.1", True,
                   "127.0.0.1:5555")


class Answer:
    """A last stage: answers with `body` (sync), or via a coroutine (`slow`)."""

    name = "answer"

    def __init__(self, body: bytes = b"hi", slow: bool = False,
                 fail: Exception | None = None, target: Any = None) -> None:
        self.body, self.slow, self.fail, self.target = body, slow, fail, target

    def __call__(self, req: Request, ctx: Context, call_next: Next) -> Result:
        ctx.target = self.target
        if self.slow:
            return self._later()
        if self.fail is not None:
            raise self.fail
        return Response(200, [], self.body)

    async def _later(self) -> Response:
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return Response(200, [], self.body)


class FakeFunction:
    """A target as a deployment is one: renders its errors with its name."""

    label = "fn@v1"

    def error_response(self, err: EdgefnError) -> Response:
        return Response(err.status, [(b"x-edgefn-error", err.code.encode())],
                        f"fn: {err}".encode())

    def crashed(self, exc: Exception) -> EdgefnError:
        return FunctionError("crash", 502, f"failed inside edgefn: {exc!r}")


def front(*stages: Any, log: io.BytesIO | None = None, timed: bool = False) -> Chain:
    access = AccessLog(c.AccessLogStage(), log if log is not None else io.BytesIO())
    return Chain([RequestId(c.RequestIdStage()), access, *stages], timed)


def run(result: Response | Awaitable[Response]) -> Response:
    if isinstance(result, Response):
        return result
    return asyncio.run(_wait(result))


async def _wait(result: Awaitable[Response]) -> Response:
    return await result


def header(response: Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


def test_a_synchronous_chain_answers_without_a_coroutine() -> None:
    log = io.BytesIO()
    result = front(Answer(), log=log)(request())
    assert type(result) is Response  # the HTTP front writes it at once, no task
    assert result.body == b"hi"
    assert header(result, b"x-request-id")
    line = log.getvalue().decode()
    assert "method=GET path=/hello status=200 fn=- " in line and " bytes=2 " in line


def test_an_async_stage_resolves_through_the_same_stages() -> None:
    log = io.BytesIO()
    result = front(Answer(b"later", slow=True), log=log)(request())
    assert not isinstance(result, Response)
    response = run(result)
    assert response.body == b"later" and header(response, b"x-request-id")
    assert "status=200" in log.getvalue().decode() and "bytes=5" in log.getvalue().decode()


@pytest.mark.parametrize(("incoming", "kept"), [
    (b"trace-42", True), (b"a.b:c-D_9", True), (b"x" * 128, True),
    (b"x" * 129, False), (b"has space", False), (b"semi;colon", False), (b"", False),
    (b"warmup", False)])  # the PoP's warm-ups' id: a client's read like one in the log
def test_a_well_formed_incoming_request_id_is_kept(incoming: bytes, kept: bool) -> None:
    response = run(front(Answer())(request(headers=[(b"x-request-id", incoming)])))
    rid = header(response, b"x-request-id")
    assert (rid == incoming) is kept
    assert rid and len(rid) <= 128


def test_generated_request_ids_are_unique() -> None:
    chain = front(Answer())
    ids = {header(run(chain(request())), b"x-request-id") for _ in range(1000)}
    assert len(ids) == 1000


@pytest.mark.parametrize("slow", [False, True])
def test_a_function_error_is_rendered_by_its_target_and_keeps_the_request_id(
        slow: bool) -> None:
    log = io.BytesIO()
    err = FunctionError("cpu_limit", 503, "exceeded its CPU limit of 50 ms")
    response = run(front(Answer(slow=slow, fail=err, target=FakeFunction()), log=log)(
        request(headers=[(b"x-request-id", b"t-1")])))
    assert (response.status, header(response, b"x-edgefn-error")) == (503, b"cpu_limit")
    assert response.body == b"fn: exceeded its CPU limit of 50 ms"
    assert header(response, b"x-request-id") == b"t-1"
    assert "status=503 fn=fn@v1 " in log.getvalue().decode()


@pytest.mark.parametrize("slow", [False, True])
def test_an_unexpected_exception_becomes_the_targets_crash(slow: bool) -> None:
    response = run(front(Answer(slow=slow, fail=KeyError("oops"), target=FakeFunction()))(
        request()))
    assert (response.status, header(response, b"x-edgefn-error")) == (502, b"crash")
    assert b"KeyError('oops')" in response.body


def test_an_unexpected_exception_without_a_target_is_a_500_naming_the_request() -> None:
    response = run(front(Answer(fail=RuntimeError("bug")))(request(
        headers=[(b"x-request-id", b"t-9")])))
    body = msgspec.json.decode(response.body)
    assert response.status == 500 and body["error"]["kind"] == "internal_error"
    assert "t-9" in body["error"]["message"]


class ExplodingApi:
    paths = frozenset({b"/v1/models"})

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def __call__(self, req: Request, ctx: object = None) -> Response:
        raise self.exc


def openai_stage(api: ExplodingApi) -> OpenAI:
    """The openai stage over an empty function registry."""
    registry = SimpleNamespace(router=Router(), canaries={})
    targets = Targets(registry, dict.fromkeys(api.paths, OpenAITarget()))  # type: ignore[arg-type]
    return OpenAI(api, targets)  # type: ignore[arg-type]


@pytest.mark.parametrize(("exc", "status", "kind", "code"), [
    (ZeroDivisionError("x"), 500, "server_error", "internal_error"),
    (ApiError("invalid_value", 400, "bad n", "n"), 400, "invalid_request_error",
     "invalid_value")])
def test_openai_errors_keep_openais_shape(exc: Exception, status: int, kind: str,
                                          code: str) -> None:
    response = run(front(openai_stage(ExplodingApi(exc)))(request(b"/v1/models")))
    err = msgspec.json.decode(response.body)["error"]
    assert response.status == status
    assert (err["type"], err["code"]) == (kind, code)
    assert set(err) == {"message", "type", "param", "code"}


def test_the_openai_stage_passes_other_paths_on() -> None:
    chain = front(openai_stage(ExplodingApi(ZeroDivisionError())), Answer(b"fn"))
    assert run(chain(request(b"/v1/modelsx"))).body == b"fn"


def test_past_the_last_stage_is_a_404() -> None:
    response = run(Chain([])(request(b"/nothing")))
    assert response.status == 404 and b"/nothing" in response.body


def test_a_streamed_body_is_logged_when_it_ends_with_the_bytes_sent() -> None:
    log = io.BytesIO()

    async def body() -> AsyncIterator[bytes]:
        for part in (b"ab", b"cde"):
            yield part

    class Streams:
        name = "streams"

        def __call__(self, req: Request, ctx: Context, call_next: Next) -> Result:
            return Response(200, [], body())

    response = front(Streams(), log=log)(request())
    assert isinstance(response, Response) and log.getvalue() == b""

    async def drain() -> bytes:
        assert not isinstance(response.body, bytes)
        return b"".join([chunk async for chunk in response.body])

    assert asyncio.run(drain()) == b"abcde"
    assert "bytes=5" in log.getvalue().decode()


def test_a_timed_chain_records_each_stage() -> None:
    seen: dict[str, float] = {}

    class Peek:
        name = "peek"

        def __call__(self, req: Request, ctx: Context, call_next: Next) -> Result:
            seen.update(ctx.timings())
            return Response(200, [], b"")

    run(front(Peek(), timed=True)(request()))
    assert list(seen) == ["request_id", "access_log", "peek"]
    assert all(v >= 0 for v in seen.values())


def test_json_access_log_lines_carry_the_stage_timings() -> None:
    log = io.BytesIO()
    access = AccessLog(c.AccessLogStage(format="json"), log)
    run(Chain([RequestId(c.RequestIdStage()), access, Answer()], timed=True)(request()))
    line = msgspec.json.decode(log.getvalue())
    assert (line["status"], line["path"], line["bytes"]) == (200, "/hello", 2)
    assert set(line["stages"]) == {"request_id", "access_log", "answer"}
