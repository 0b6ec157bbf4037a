"""`HostCalls` alone: what a guest's call reaches on the PoP and what it is answered,
with an isolate that only records its frames (tests/executors/python/test_isolate_calls.py
has the socket's side). The calls the PoP answers itself (log, deployment), a
binding's result, error and awaitable, the tenant and the raw flag it is called with,
the calls a request's end stops (a model call, a fetch) and the model stream it closes,
a fetch's lineage, and the reply's frames."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from runtime.bindings.fetch import LOOP_ARG
from runtime.executors.python import wire
from runtime.executors.python.calls import HostCalls
from runtime.executors.python.job import Job
from tests.executors.python.test_isolate_calls import CFG, Sink


class Caller(Sink):
    """A `Sink` whose request is `job` (None: a call made outside any request)."""

    def __init__(self, job: Job | None = None) -> None:
        super().__init__()
        self.job = job


class Bindings:
    """A deployment's bindings: each call recorded, answered with `result` (raised
    when it is an exception)."""

    def __init__(self, result: Any = None) -> None:
        self.result = result
        self.called: list[tuple[str, Any, str | None, bool]] = []

    def __call__(self, name: str, args: Any, caller: str | None = None,
                 raw: bool = False) -> Any:
        self.called.append((name, args, caller, raw))
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def replies(caller: Sink) -> list[Any]:
    """The REPLY frames sent to `caller`, decoded."""
    frames = wire.Reader(wire.FRAMING).feed(b"".join(caller.sent))
    assert all(kind == wire.REPLY for kind, _ in frames)
    return [json.loads(payload) for _, payload in frames]


def call(name: Any, args: Any = None, wait: bool = True, id: int = 1) -> dict[str, Any]:
    return {"id": id, "name": name, "args": args, "wait": wait}


def test_a_log_call_is_the_function_s_line_answered_only_when_waited_for(
        caplog: pytest.LogCaptureFixture) -> None:
    bindings, caller = Bindings(), Caller()
    calls = HostCalls(CFG, bindings)
    with caplog.at_level(logging.INFO, logger="edgefn.functions"):
        calls.handle(caller, call("log", {"message": "hi\x1b[2J"}, wait=False))
        calls.handle(caller, call("log", {"message": 42}, id=2))
        calls.handle(caller, call("log", None, id=3))
        # a lone surrogate (JSON's "\\ud800" decodes to one) cannot be UTF-8: replaced
        calls.handle(caller, call("log", {"message": "a\ud800b"}, id=4))
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("edgefn.functions", logging.INFO, "f@v1: hi\\x1b[2J"),  # escaped, as output is
        ("edgefn.functions", logging.INFO, "f@v1: 42"),
        ("edgefn.functions", logging.INFO, "f@v1: "),
        ("edgefn.functions", logging.INFO, "f@v1: a?b")]
    assert replies(caller) == [{"id": 2, "result": None}, {"id": 3, "result": None},
                               {"id": 4, "result": None}]
    assert caller.answered_ids == [2, 3, 4] and bindings.called == [] and calls.dropped == 0


def test_deployment_is_answered_with_the_function_s_name_and_version() -> None:
    bindings, caller = Bindings(), Caller()
    HostCalls(CFG, bindings).handle(caller, call("deployment", id=9))
    assert replies(caller) == [{"id": 9, "result": {"name": "f", "version": "v1"}}]
    assert caller.answered_ids == [9] and bindings.called == []


def test_a_call_with_no_binding_to_reach_is_an_unknown_host_call() -> None:
    caller = Caller()
    HostCalls(CFG, None).handle(caller, call("kv.get", {"key": "k"}, id=1))
    HostCalls(CFG, Bindings()).handle(caller, call(42, id=2))  # a name that is no string
    HostCalls(CFG, Bindings()).handle(caller, call(None, id=3))
    assert replies(caller) == [{"id": 1, "error": "unknown host call 'kv.get'"},
                               {"id": 2, "error": "unknown host call 42"},
                               {"id": 3, "error": "unknown host call None"}]
    assert caller.answered_ids == [1, 2, 3]


def test_a_binding_is_called_for_its_request_s_tenant_and_answers_its_result() -> None:
    """Its result as the reply; args as sent (none: an empty object); the tenant of
    the request the call is made for (none outside a request); raw only for the calls
    whose values travel raw (kv.get)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        bindings = Bindings({"hits": [1, 2]})
        calls, caller = HostCalls(CFG, bindings), Caller(Job(loop, b"req", tenant="acme"))
        calls.handle(caller, call("vectors.query", {"k": 2}, id=1))
        calls.handle(caller, call("kv.list", None, id=2))
        calls.handle(Caller(), call("kv.put", {"key": "k"}, id=3))
        assert bindings.called == [("vectors.query", {"k": 2}, "acme", False),
                                   ("kv.list", {}, "acme", False),
                                   ("kv.put", {"key": "k"}, None, False)]
        assert replies(caller) == [{"id": 1, "result": {"hits": [1, 2]}},
                                   {"id": 2, "result": {"hits": [1, 2]}}]
        assert caller.answered_ids == [1, 2]
        bindings.result = {"value": b"raw", "metadata": None}
        calls.handle(caller, call("kv.get", {"key": "k"}, id=4))
        assert bindings.called[-1] == ("kv.get", {"key": "k"}, "acme", True)

    asyncio.run(go())


def test_a_binding_that_refuses_or_fails_answers_its_error() -> None:
    from edgefn_core.errors import BindingError

    caller = Caller()
    HostCalls(CFG, Bindings(BindingError("kv.put denied: namespace 'x' is not bound"))).handle(
        caller, call("kv.put", {}, id=1))
    HostCalls(CFG, Bindings(ValueError("bad vector"))).handle(caller, call("vectors.upsert",
                                                                          {}, id=2))
    assert replies(caller) == [{"id": 1, "error": "kv.put denied: namespace 'x' is not bound"},
                               {"id": 2, "error": "bad vector"}]
    assert caller.answered_ids == [1, 2]


@pytest.mark.parametrize("name", ["ai.chat", "ai.embed", "fetch"])
def test_a_call_that_ends_with_its_request_is_refused_outside_one(name: str) -> None:
    """A thread that outlived its request (or a call made with none running) gets an
    error for a model call or a fetch, which would run on for no one; the binding is
    never reached. A write is not such a call: it goes through."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ended = Job(loop, b"req", tenant="acme")
        ended.end()
        for caller in (Caller(), Caller(ended)):
            bindings = Bindings({"ok": True})
            calls = HostCalls(CFG, bindings)
            calls.handle(caller, call(name, {"url": "http://x/"}, id=1))
            calls.handle(caller, call("kv.put", {"key": "k"}, id=2))
            assert replies(caller) == [
                {"id": 1, "error": "this call's request has ended (a thread outlived it)"},
                {"id": 2, "result": {"ok": True}}]
            assert [c[0] for c in bindings.called] == ["kv.put"]
            assert caller.answered_ids == [1, 2]

    asyncio.run(go())


def test_a_fetch_carries_its_request_s_lineage_not_the_guest_s() -> None:
    """The loop guard's argument is the PoP's (its request's `Lineage`), whatever the
    guest put there; the guest's own args are not changed; other calls' args are
    passed as they came."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        job = Job(loop, b"req", tenant="acme")
        bindings, caller = Bindings({"status": 200}), Caller(job)
        calls = HostCalls(CFG, bindings)
        sent = {"url": "http://origin/", LOOP_ARG: "forged"}
        calls.handle(caller, call("fetch", sent, id=1))
        calls.handle(caller, call("kv.put", {"key": "k", LOOP_ARG: "theirs"}, id=2))
        calls.handle(caller, call("fetch", ["not", "an", "object"], id=3))
        (_, args, tenant, _), second, third = bindings.called
        assert args == {"url": "http://origin/", LOOP_ARG: job.lineage} and tenant == "acme"
        assert args[LOOP_ARG] is job.lineage
        assert sent == {"url": "http://origin/", LOOP_ARG: "forged"}
        assert second[1] == {"key": "k", LOOP_ARG: "theirs"}
        assert third[1] == ["not", "an", "object"]

    asyncio.run(go())


def test_an_awaited_binding_is_answered_when_it_finishes_and_stopped_with_its_request() -> None:
    """A binding that returns an awaitable is answered once it finishes (its result, or
    its error), not in the call's own turn. A model call's work is stopped when its
    request ends (its cleanup); a write's is not tied to the request."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        gate = loop.create_future()

        async def work(ok: bool) -> dict[str, Any]:
            await gate
            if not ok:
                raise RuntimeError("model worker gone")
            return {"text": "hi"}

        job = Job(loop, b"req", tenant="acme")
        caller = Caller(job)
        results = iter([work(True), work(False), work(True)])
        calls = HostCalls(CFG, lambda name, args, tenant=None, raw=False: next(results))
        calls.handle(caller, call("ai.chat", {}, id=1))
        calls.handle(caller, call("ai.embed", {}, id=2))
        assert len(job.cleanups) == 2  # each model call's task, cancelled if it ends first
        calls.handle(caller, call("kv.put", {}, id=3))
        assert len(job.cleanups) == 2  # a write runs to its end
        await asyncio.sleep(0)
        assert caller.sent == [] and caller.answered_ids == []
        gate.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert sorted(replies(caller), key=lambda r: r["id"]) == [
            {"id": 1, "result": {"text": "hi"}}, {"id": 2, "error": "model worker gone"},
            {"id": 3, "result": {"text": "hi"}}]
        assert sorted(caller.answered_ids) == [1, 2, 3]

        ended = Job(loop, b"req", tenant="acme")
        ended.end()
        calls = HostCalls(CFG, lambda name, args, tenant=None, raw=False: work(True))
        calls.handle(Caller(ended), call("kv.put", {}, id=4))  # no request left to stop it
        assert ended.cleanups == []

    asyncio.run(go())


def test_a_model_stream_is_closed_when_its_request_ends() -> None:
    """`ai.chat_stream`'s stream is closed (`ai.chat_close`, for the same tenant) when
    the request ends, however it ends, and at once if it already has; a reply with no
    stream id, or another call's, closes nothing."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        asked: list[tuple[str, Any, str | None]] = []
        closed = loop.create_future()

        async def opened(result: Any) -> Any:
            return result

        def bindings(name: str, args: Any, tenant: str | None = None, raw: bool = False) -> Any:
            asked.append((name, args, tenant))
            if name == "ai.chat_close":
                closed.set_result(None)
                return opened(None)
            return opened(args["gives"])

        calls = HostCalls(CFG, bindings)
        job = Job(loop, b"req", tenant="acme")
        caller = Caller(job)
        calls.handle(caller, call("ai.chat_stream", {"gives": {"stream": 7}}, id=1))
        calls.handle(caller, call("ai.chat_stream", {"gives": {"stream": "7"}}, id=2))
        calls.handle(caller, call("ai.chat_stream", {"gives": [7]}, id=3))
        calls.handle(caller, call("ai.chat", {"gives": {"stream": 8}}, id=4))
        for _ in range(5):
            await asyncio.sleep(0)
        assert [r["result"] for r in sorted(replies(caller), key=lambda r: r["id"])] == [
            {"stream": 7}, {"stream": "7"}, [7], {"stream": 8}]
        assert [a[0] for a in asked].count("ai.chat_close") == 0  # not before the end
        job.end()
        await asyncio.wait_for(closed, 1)
        assert asked[-1] == ("ai.chat_close", {"stream": 7}, "acme")
        assert [a[0] for a in asked].count("ai.chat_close") == 1

    asyncio.run(go())


def test_a_model_stream_whose_request_ended_before_its_reply_is_closed_at_once() -> None:
    """The stream opened, then the request ended before the reply was made (the
    call's work done, so its end cancelled nothing): it is closed as the reply is
    made, not left generating; a closing that fails is quiet (nothing left to stop)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        asked: list[tuple[str, Any, str | None]] = []
        unhandled: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: unhandled.append(context))
        opened = loop.create_future()
        opened.set_result({"stream": 3})

        async def failing() -> None:
            raise ConnectionError("model worker gone")

        def bindings(name: str, args: Any, tenant: str | None = None, raw: bool = False) -> Any:
            asked.append((name, args, tenant))
            return failing() if name == "ai.chat_close" else opened

        job = Job(loop, b"req", tenant="acme")
        caller = Caller(job)
        HostCalls(CFG, bindings).handle(caller, call("ai.chat_stream", {}, id=1))
        job.end()  # this same turn: the reply's task has not run
        for _ in range(5):
            await asyncio.sleep(0)
        assert replies(caller) == [{"id": 1, "result": {"stream": 3}}]
        assert asked == [("ai.chat_stream", {}, "acme"), ("ai.chat_close", {"stream": 3}, "acme")]
        import gc
        gc.collect()
        await asyncio.sleep(0)
        assert unhandled == []  # the failed closing's exception was retrieved

    asyncio.run(go())


def test_a_call_sent_without_waiting_is_dropped_with_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    bindings, caller = Bindings({"ok": True}), Caller()
    calls = HostCalls(CFG, bindings)
    with caplog.at_level(logging.INFO, logger="edgefn.functions"):
        calls.handle(caller, call("x" * 100, wait=False))
        calls.handle(caller, call("kv.put", wait=False))
        calls.handle(caller, {"id": 3, "name": "kv.put", "args": {}})  # no "wait" at all
    assert [r.getMessage() for r in caplog.records] == [
        f"f@v1: dropped host call {'x' * 64!r} sent without waiting for its answer (later "
        "ones are dropped silently)"]
    assert caplog.records[0].levelno == logging.WARNING
    assert calls.dropped == 3 and caller.sent == [] and bindings.called == []


def test_a_result_msgspec_cannot_encode_is_answered_as_json_encodes_it() -> None:
    caller = Caller()
    HostCalls(CFG, Bindings({True: 1, None: [2]})).handle(caller, call("vectors.stats", id=5))
    assert replies(caller) == [{"id": 5, "result": {"true": 1, "null": [2]}}]
