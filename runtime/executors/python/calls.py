"""Host calls: a guest's calls into the PoP over its isolate's socket.

``log`` and ``deployment`` are answered here; anything else is a binding
(``kv.get``, ``vectors.query``, ``ai.chat``, ...) handed to the deployment's
capabilities, whose denials and failures go back to the guest as errors (the
SDK raises `edgefn.BindingError`). An awaitable binding (the AI) is answered
when it finishes, without holding up the isolate's other frames. A KV value read
is answered raw, after a small JSON head (`wire.REPLY_VALUE`): never base64- or
JSON-encoded on the PoP's loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from typing import Any, Protocol

import msgspec

from runtime.bindings.fetch import LOOP_ARG
from runtime.executors.output import GuestLines
from runtime.executors.python import wire
from runtime.executors.python.config import HostConfig
from runtime.executors.python.job import Job

functions_log = logging.getLogger("edgefn.functions")

LOG_LINE_MAX = 4096


class Bindings(Protocol):
    """A deployment's `runtime.bindings.Bindings.call`."""

    def __call__(self, name: str, args: dict[str, Any], caller: str | None = None,
                 raw: bool = False) -> Any:
        """Binding `name` for a request of tenant `caller`; `raw`: KV values read
        come as bytes."""


class Caller(Protocol):
    """The isolate a call came from."""

    def send(self, data: bytes) -> None:
        """Queue a frame to it."""

    def answered(self, msg: dict[str, Any]) -> None:
        """Call `msg`, which its guest waits for, was answered (once, its reply sent)."""


class HostCalls:
    def __init__(self, cfg: HostConfig, bindings: Bindings | None = None) -> None:
        self.cfg = cfg
        self.bindings = bindings
        self.dropped = 0  # calls sent without waiting that are not `log`
        self.logged = GuestLines(functions_log, cfg.label, "", logging.INFO)  # env.log

    def handle(self, isolate: Caller, msg: dict[str, Any]) -> None:
        """Answer `msg` ({"id", "name", "args", "wait"}); a REPLY is sent only if the
        guest waits for one."""
        name = msg.get("name")
        args = msg.get("args") or {}
        reply: dict[str, Any]
        if not msg.get("wait") and name != "log":
            # the SDK waits for every call but `log`; one it does not wait for would
            # run unanswered work for nobody (a flood of them queued the PoP's loop)
            self.dropped += 1
            if self.dropped == 1:  # once: the flood itself must not flood the log
                functions_log.warning("%s: dropped host call %r sent without waiting for "
                                      "its answer (later ones are dropped silently)",
                                      self.cfg.label, str(name)[:64])
            return
        if name == "log":  # escaped, cut and rate-limited as the host's output is
            self.logged.line(str(args.get("message", ""))[:LOG_LINE_MAX].encode("utf-8",
                                                                                 "replace"))
            reply = {"result": None}
        elif name == "deployment":
            reply = {"result": {"name": self.cfg.name, "version": self.cfg.version}}
        elif self.bindings is not None and isinstance(name, str):
            job = getattr(isolate, "job", None)  # the request the call is made for, if any
            if (job is None or job.done) and _ends_with_request(name):
                # a thread that outlived its request: a model call held a batch slot for
                # 120 s (the thread is stopped; what it asked would run on for no one)
                reply = {"error": "this call's request has ended (a thread outlived it)"}
                if msg.get("wait"):
                    _answer(isolate, msg, reply)
                return
            if name == "fetch" and isinstance(args, dict):  # the request's, not the guest's
                args = {**args, LOOP_ARG: getattr(job, "lineage", None)}
            try:
                result = self.bindings(name, args, getattr(job, "tenant", None),
                                       raw=name in wire.VALUE_REPLIES)
            except Exception as e:  # BindingError: denied or failed; the guest raises it
                reply = {"error": str(e)}
            else:
                if inspect.isawaitable(result):
                    # the call's work as a task of its own, which the request's end stops:
                    # `_reply_later` awaits it, so even a cancel before either ran (the
                    # client gone in this same turn) ends in the guest's error reply (the
                    # reply's own task, cancelled unstarted, sent none: the guest waited
                    # to its wall limit, holding the isolate)
                    work = asyncio.ensure_future(result)
                    asyncio.get_running_loop().create_task(
                        self._reply_later(isolate, msg, work, name, job))
                    if job is not None and not job.done and _ends_with_request(name):
                        job.cleanups.append(work.cancel)  # stopped with its request
                    return
                reply = {"result": result}
        else:
            reply = {"error": f"unknown host call {name!r}"}
        if msg.get("wait"):
            _answer(isolate, msg, reply)

    async def _reply_later(self, isolate: Caller, msg: dict[str, Any],
                           pending: Awaitable[Any], name: str = "",
                           job: Job | None = None) -> None:
        """The reply to a call that awaits (a model call): its result, or its error;
        when the request's client went away meanwhile (`pending`, the call's task, is
        cancelled), an error that ends the handler's wait. A model stream it opens is
        closed when the request ends, however it ends."""
        try:
            reply = {"result": await pending}
        except asyncio.CancelledError:
            reply = {"error": "cancelled: the request's client went away"}
        except Exception as e:
            reply = {"error": str(e)}
        else:
            result = reply["result"]
            if name == "ai.chat_stream" and job is not None and isinstance(result, dict):
                self._close_with(job, result.get("stream"))
        _answer(isolate, msg, reply)

    def _close_with(self, job: Job, stream: Any) -> None:
        """Close AI stream `stream` when `job` ends (at once if it has): a function
        whose client left, or that stopped reading, held the model generating to
        `max_tokens` and a batch slot until another of its streams opened."""
        bindings = self.bindings
        if bindings is None or not isinstance(stream, int):
            return
        tenant = job.tenant

        def close() -> None:
            closing = bindings("ai.chat_close", {"stream": stream}, tenant)
            if inspect.isawaitable(closing):
                asyncio.ensure_future(closing).add_done_callback(_quiet)

        if job.done:
            close()
        else:
            job.cleanups.append(close)


def _ends_with_request(name: str) -> bool:
    """A call stopped when its request ends or its client leaves: a model call or a
    fetch (a write is not: a handler's writes are not cut halfway)."""
    return name.startswith("ai.") or name == "fetch"


def _quiet(task: asyncio.Future[Any]) -> None:
    """A closing that failed (the worker is gone) has nothing left to stop."""
    if not task.cancelled():
        task.exception()


def _answer(isolate: Caller, msg: dict[str, Any], reply: dict[str, Any]) -> None:
    """Send call `msg`'s `reply` ({"result"} or {"error"})."""
    for part in _reply({"id": msg.get("id"), **reply}):
        isolate.send(part)
    isolate.answered(msg)


def _reply(answer: dict[str, Any]) -> tuple[bytes, ...]:
    """The frame that answers a call, in parts: a result whose "value" is bytes (a KV
    read, `wire.VALUE_REPLIES`) as a REPLY_VALUE frame, its head the reply with the
    value emptied and the value sent as it is (as base64 JSON, a 16 MiB value took
    ~70 ms of the PoP's loop); any other a REPLY frame, which msgspec encodes in 0.4x
    json's time, whatever it cannot encode going through json."""
    result = answer.get("result")
    if isinstance(result, dict) and isinstance(value := result.get("value"), bytes):
        head = msgspec.json.encode({**answer, "result": {**result, "value": ""}})
        return wire.value_frame(wire.REPLY_VALUE, head, value)
    try:
        payload = msgspec.json.encode(answer)
    except TypeError:
        return (wire.json_frame(wire.REPLY, answer),)
    return (wire.frame(wire.REPLY, payload),)
