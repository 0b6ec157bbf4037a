"""KV values between a Python function and the PoP travel raw (`wire.CALL_VALUE`,
`wire.REPLY_VALUE`), never base64 in JSON on the PoP's loop, through a real
function on a real PoP: every value comes back byte for byte, as the same Python
objects as before, and a value over the limit is refused with the same message."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from edgefn_core import hostcall
from runtime.executors.python import calls, wire
from runtime.executors.python.isolate import Isolate
from tests.support import Running, pop_thread, python_function

VALUES = """
import json
from edgefn import BindingError, Response


def handle(request, env):
    kv, q = env.kv("vals"), request.query
    key, meta = q.get("key", "k"), json.loads(q.get("meta", "null"))
    if request.method == "PUT":  # the body, or `size` bytes made here (past the body limit)
        value = request.body if "size" not in q else b"x" * int(q["size"])
        try:
            if "cas" in q:
                version = kv.cas(key, json.loads(q["cas"]), value)
            else:
                version = kv.put(key, value, metadata=meta)
        except BindingError as e:
            return Response(str(e), status=413)
        return Response.json(version)
    entry, plain = kv.get_with_metadata(key), kv.get(key)
    if entry is None:
        return Response(repr(plain), status=404)
    kinds = [type(plain).__name__, type(entry["value"]).__name__]
    assert plain == entry["value"], "get and get_with_metadata differ"
    return Response(entry["value"], headers={
        "x-kinds": " ".join(kinds), "x-meta": json.dumps(entry["metadata"]),
        "x-version": str(entry["version"]), "x-fields": " ".join(sorted(entry))})
"""


class Frames:
    """The host-call frames the PoP reads from its isolates (kind, payload length)
    and the answers it writes (kind)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read: list[tuple[bytes, int]] = []
        self.answered: list[bytes] = []
        frame, reply = Isolate._frame, calls._reply

        def read(isolate: Isolate, kind: bytes, payload: bytes) -> None:
            if kind in (wire.CALL, wire.CALL_VALUE):
                self.read.append((kind, len(payload)))
            frame(isolate, kind, payload)

        def answer(msg: dict[str, Any]) -> tuple[bytes, ...]:
            parts = reply(msg)
            self.answered.append(parts[0][4:5])  # the kind, after the length
            return parts

        monkeypatch.setattr(Isolate, "_frame", read)
        monkeypatch.setattr(calls, "_reply", answer)

    def clear(self) -> None:
        self.read.clear()
        self.answered.clear()


@pytest.fixture(scope="module")
def values_pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("values")
    with pop_thread(root / "data") as running:
        running.deploy(python_function(
            root, "values", VALUES, extra='[bindings]\nkv = ["vals"]',
            limits="memory_mb = 512\nmax_response_mb = 32\ncpu_ms = 10000\nwall_ms = 20000"))
        yield running


@pytest.fixture
def frames(values_pop: Running, monkeypatch: pytest.MonkeyPatch) -> Frames:
    return Frames(monkeypatch)


def put(pop: Running, key: str, value: bytes, **query: str) -> tuple[int, bytes]:
    q = urllib.parse.urlencode({"key": key, **query})
    status, _, body = pop.request("PUT", f"/values?{q}", value, timeout=60)
    return status, body


@pytest.mark.parametrize("value", [
    b"",
    bytes(range(256)) * 4,
    b"\xd3M4" * 100,  # base64 "0000...": in JSON, a run of 400 digits the PoP refused
    os.urandom(16 << 20),  # the largest value
], ids=["empty", "every-byte", "base64-digits", "16MiB"])
def test_a_value_comes_back_byte_for_byte_and_raw_both_ways(
        values_pop: Running, frames: Frames, value: bytes) -> None:
    meta = {"lang": "en", "n": [1, 2.5, None], "s": "\u00e9\U0001f600"}
    status, body = put(values_pop, "k", value, meta=json.dumps(meta))
    assert status == 200, body
    version = json.loads(body)
    status, headers, got = values_pop.get("/values?key=k", timeout=60)
    assert status == 200 and got == value, (len(got), len(value))
    assert headers["x-kinds"] == "bytes bytes"  # what a function got before, as before
    assert json.loads(headers["x-meta"]) == meta and headers["x-version"] == str(version)
    assert headers["x-fields"] == "expires_at metadata value version"
    # the value went raw both ways: a CALL_VALUE whose JSON is the small part, and the
    # gets (with metadata and plain) answered REPLY_VALUE; no CALL frame carried it
    (sent,) = [n for kind, n in frames.read if kind == wire.CALL_VALUE]
    assert len(value) < sent < len(value) + 300, (sent, len(value))
    assert all(n < 1000 for kind, n in frames.read if kind == wire.CALL)
    assert frames.answered.count(wire.REPLY_VALUE) == 2


def test_a_cas_sends_its_value_raw(values_pop: Running, frames: Frames) -> None:
    value = bytes(range(255, -1, -1)) * 1024
    status, body = put(values_pop, "c", b"old")
    version = json.loads(body)
    status, body = put(values_pop, "c", value, cas=str(version + 1000))  # not its version
    assert (status, body) == (200, b"null")
    assert values_pop.get("/values?key=c")[2] == b"old"
    status, body = put(values_pop, "c", value, cas=str(version))
    assert status == 200 and json.loads(body) > version
    assert values_pop.get("/values?key=c")[2] == value
    assert [kind for kind, _ in frames.read].count(wire.CALL_VALUE) == 3


def test_a_value_over_the_limit_is_refused_with_the_same_message(
        values_pop: Running, frames: Frames) -> None:
    # past the store's 16 MiB: sent (raw) and refused by the store, as before
    status, body = put(values_pop, "big", b"", size=str((16 << 20) + 1))
    assert (status, body.decode()) == (413, "value of 16777217 bytes for key b'big' in "
                                            "'vals' exceeds the limit of 16777216 bytes")
    assert [kind for kind, _ in frames.read] == [wire.CALL_VALUE]
    # past what a call carries: refused by the SDK, counted as the base64 JSON it was
    frames.clear()
    size = 18 << 20
    status, body = put(values_pop, "big", b"", size=str(size))
    m = re.fullmatch(rb"kv\.put: its arguments are (\d+) bytes of JSON \(at most 25165824\)",
                     body)
    assert status == 413 and m is not None, body
    head = len(json.dumps({"id": 1, "name": "kv.put", "args": {
        "namespace": "vals", "key": "big", "value": "", "ttl": None, "metadata": None},
        "wait": True}))
    assert int(m[1]) - hostcall.base64_size(size) in range(head, head + 12)  # the id's digits
    assert frames.read == []  # never sent
    assert values_pop.get("/values?key=big")[0] == 404
