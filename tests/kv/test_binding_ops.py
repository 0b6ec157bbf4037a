"""What the KV and vector bindings promise, through a real Python function over
HTTP on a real PoP (real LMDB, real usearch): TTL, compare-and-swap, metadata,
list cursors, vector filters and delete, and wrong-dimension errors.

Each test deploys its own function with its own KV namespace and vector index,
so no test sees another's data."""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.client import AdminError
from tests.support import Running, pop_thread, python_function

# Runs the binding calls a request lists, in order, and answers their results;
# a failed call gives {"error": message} unless the step says "uncaught".
PROBE = '''
from edgefn import BindingError, Response


def handle(request, env):
    out = []
    for step in request.json():
        if step["op"] == "call":  # the host call itself, for arguments the SDK lacks
            run = lambda: env._call(step["name"], step["args"], True)
        else:
            target = env.kv(step["name"]) if step["kind"] == "kv" else env.vectors(step["name"])
            method = getattr(target, step["op"])
            run = lambda: method(*step.get("args", []), **step.get("kwargs", {}))
        if step.get("uncaught"):
            result = run()
        else:
            try:
                result = run()
            except BindingError as e:
                out.append({"error": str(e)})
                continue
        if isinstance(result, bytes):
            result = result.decode()
        elif isinstance(result, dict) and isinstance(result.get("value"), bytes):
            result = {**result, "value": result["value"].decode()}
        out.append({"ok": result})
    return Response.json(out)
'''
NAMES = itertools.count(1)


class Probe:
    """A deployed probe function with its own namespace `ns` and index `index`."""

    def __init__(self, pop: Running, root: Path) -> None:
        n = next(NAMES)
        self.pop, self.name, self.ns, self.index = pop, f"probe-{n}", f"ns-{n}", f"ix-{n}"
        d = root / self.name
        d.mkdir()
        (d / "main.py").write_text(PROBE)
        (d / "edgefn.toml").write_text(
            f'name = "{self.name}"\nruntime = "python"\nentry = "main.py"\n'
            f'routes = ["/{self.name}"]\n[bindings]\nkv = ["{self.ns}"]\n'
            f'vectors = ["{self.index}"]\n[pool]\nstandby = false\n')
        pop.deploy(d)

    def raw(self, *steps: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        return self.pop.request("POST", f"/{self.name}", json.dumps(list(steps)).encode())

    def run(self, *steps: dict[str, Any]) -> list[Any]:
        status, _, body = self.raw(*steps)
        assert status == 200, body
        return json.loads(body)  # type: ignore[no-any-return]

    def kv(self, op: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"kind": "kv", "name": self.ns, "op": op, "args": args, "kwargs": kwargs}

    def vec(self, op: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"kind": "vectors", "name": self.index, "op": op, "args": args,
                "kwargs": kwargs}

    def ok(self, *steps: dict[str, Any]) -> Any:
        """The result of each step (one step: its result); fails on any error."""
        results = self.run(*steps)
        assert all("ok" in r for r in results), results
        values = [r["ok"] for r in results]
        return values[0] if len(values) == 1 else values


@pytest.fixture(scope="module")
def store_pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with pop_thread(tmp_path_factory.mktemp("stores") / "data") as running:
        yield running


@pytest.fixture
def probe(store_pop: Running, tmp_path: Path) -> Probe:
    return Probe(store_pop, tmp_path)


# -- KV ----------------------------------------------------------------------------------------
def test_the_kv_binding_passes_ttl_through(probe: Probe) -> None:
    ttl, cas_ttl = 3600.0, 600.0
    before = time.time()
    put, forever, entry, plain = probe.ok(
        probe.kv("put", "a", "1", ttl=ttl), probe.kv("put", "b", "1"),
        probe.kv("get_with_metadata", "a"), probe.kv("get_with_metadata", "b"))
    after = time.time()
    assert isinstance(put, int) and isinstance(forever, int)
    assert before + ttl - 1 <= entry["expires_at"] <= after + ttl + 1, entry
    assert plain["expires_at"] is None
    # cas takes a ttl in the binding (the SDK's cas does not pass one: the raw call)
    swapped, entry = probe.ok(
        {"op": "call", "name": "kv.cas", "args": {"namespace": probe.ns, "key": "b",
                                                  "expected_version": forever,
                                                  "value": "Mg==", "ttl": cas_ttl}},
        probe.kv("get_with_metadata", "b"))
    assert swapped > forever and entry["value"] == "2"
    assert before + cas_ttl - 1 <= entry["expires_at"] <= time.time() + cas_ttl + 1, entry


def test_a_key_put_with_a_ttl_expires(probe: Probe) -> None:
    ttl = 1.0
    put_at = time.time()
    _, entry, listed = probe.ok(probe.kv("put", "brief", "here", ttl=ttl),
                                probe.kv("get_with_metadata", "brief"), probe.kv("list"))
    if time.time() - put_at < ttl * 0.8:  # read back well within its lifetime
        assert entry["value"] == "here" and [k["key"] for k in listed["keys"]] == ["brief"]
    deadline = put_at + ttl + 10  # generous: the point is that it ends, not when
    while probe.ok(probe.kv("get", "brief")) is not None:
        assert time.time() < deadline, "the key outlived its ttl by 10 s"
        time.sleep(0.1)
    assert time.time() - put_at >= ttl * 0.95  # not gone before its time
    assert probe.ok(probe.kv("get_with_metadata", "brief")) is None
    assert probe.ok(probe.kv("list"))["keys"] == []


def test_compare_and_swap(probe: Probe) -> None:
    v1 = probe.ok(probe.kv("put", "c", "one"))
    v2 = probe.ok(probe.kv("cas", "c", v1, "two"))
    assert isinstance(v2, int) and v2 > v1
    # a stale version (someone wrote since v1) and "only if absent" both lose:
    # the binding answers None and writes nothing
    stale, absent_only, value = probe.ok(probe.kv("cas", "c", v1, "three"),
                                         probe.kv("cas", "c", None, "four"),
                                         probe.kv("get", "c"))
    assert (stale, absent_only, value) == (None, None, "two")
    created, missing, entry, never = probe.ok(
        probe.kv("cas", "fresh", None, "new"), probe.kv("cas", "ghost", v2, "boo"),
        probe.kv("get_with_metadata", "fresh"), probe.kv("get", "ghost"))
    assert isinstance(created, int) and missing is None and never is None
    assert entry["value"] == "new" and entry["version"] == created
    deleted, after_delete = probe.ok(probe.kv("delete", "c"), probe.kv("cas", "c", v2, "x"))
    assert deleted is True and after_delete is None  # a deleted key has no version


def test_metadata_round_trip(probe: Probe) -> None:
    meta = {"lang": "en", "n": 3, "ratio": 0.25, "tags": ["a", "b"], "nested": {"ok": True}}
    _, entry, listed = probe.ok(probe.kv("put", "doc", "text", metadata=meta),
                                probe.kv("get_with_metadata", "doc"),
                                probe.kv("list", "do"))
    assert entry["metadata"] == meta and entry["value"] == "text"
    assert listed["keys"] == [{"key": "doc", "metadata": meta, "expires_at": None}]
    _, entry = probe.ok(probe.kv("put", "doc", "text2"), probe.kv("get_with_metadata", "doc"))
    assert entry["metadata"] is None  # a put replaces the metadata too
    too_big = probe.run(probe.kv("put", "doc", "x", metadata={"k": "v" * 2000}))
    assert "metadata of" in too_big[0]["error"] and "exceeds the limit" in too_big[0]["error"]


def test_list_cursor_pages_cover_every_key_exactly_once(probe: Probe) -> None:
    keys = [f"p/{i:02d}" for i in range(23)]
    probe.ok(*(probe.kv("put", k, "v") for k in [*keys, "o/1", "q/1"]))
    limit, cursor, pages = 5, None, []
    for _ in range(20):  # a cursor that never ends must not hang the test
        page = probe.ok(probe.kv("list", "p/", cursor, limit))
        pages.append([k["key"] for k in page["keys"]])
        cursor = page["cursor"]
        if cursor is None:
            break
    seen = [k for page in pages for k in page]
    assert seen == keys  # every key once, in key order, nothing outside the prefix
    assert [len(p) for p in pages] == [limit] * 4 + [3]
    bad = probe.run(probe.kv("list", "o/", probe.ok(probe.kv("list", "p/", None, 2))["cursor"]))
    assert "cursor does not belong to this prefix" in bad[0]["error"]


# -- vectors -----------------------------------------------------------------------------------
def test_vector_metadata_filters_and_delete(probe: Probe) -> None:
    items = [{"id": "e1", "vector": [1, 0, 0], "metadata": {"lang": "en"}},
             {"id": "e2", "vector": [0.9, 0.1, 0], "metadata": {"lang": "en", "tier": 1}},
             {"id": "f1", "vector": [0.95, 0.05, 0], "metadata": {"lang": "fr"}},
             {"id": "f2", "vector": [0, 1, 0], "metadata": {"lang": "fr", "tier": 1}},
             {"id": "x", "vector": [-1, 0, 0.1]}]
    assert probe.ok(probe.vec("upsert", items)) == 5
    q = [1, 0, 0]
    everything, fr, tier1_fr, none = probe.ok(
        probe.vec("query", q, k=10), probe.vec("query", q, k=10, filter={"lang": "fr"}),
        probe.vec("query", q, k=10, filter={"lang": "fr", "tier": 1}),
        probe.vec("query", q, k=10, filter={"lang": "de"}))
    assert [m["id"] for m in everything] == ["e1", "f1", "e2", "f2", "x"]
    assert [m["id"] for m in fr] == ["f1", "f2"]
    assert fr[0]["metadata"] == {"lang": "fr"}
    assert [m["id"] for m in tier1_fr] == ["f2"] and none == []
    assert probe.ok(probe.vec("query", q, k=1, filter={"lang": "fr"}))[0]["id"] == "f1"

    removed, again, fr, everything = probe.ok(
        probe.vec("delete", ["f1", "nope"]), probe.vec("delete", ["f1"]),
        probe.vec("query", q, k=10, filter={"lang": "fr"}), probe.vec("query", q, k=10))
    assert (removed, again) == (1, 0)
    assert [m["id"] for m in fr] == ["f2"]
    assert [m["id"] for m in everything] == ["e1", "e2", "f2", "x"]


def test_a_vector_of_the_wrong_dimension_is_refused_naming_the_dimension(
        probe: Probe) -> None:
    assert probe.ok(probe.vec("upsert", [{"id": "a", "vector": [1, 0, 0]}])) == 1
    short, long_query, mixed, hits = probe.run(
        probe.vec("upsert", [{"id": "b", "vector": [1, 0]}]),
        probe.vec("query", [1, 0, 0, 0]),
        probe.vec("upsert", [{"id": "c", "vector": [0, 1, 0]}, {"id": "d", "vector": [1]}]),
        probe.vec("query", [1, 0, 0], k=10))
    assert short["error"] == f"index '{probe.index}' has dimension 3, got a vector of 2"
    assert long_query["error"] == f"index '{probe.index}' has dimension 3, got a vector of 4"
    assert mixed["error"] == f"index '{probe.index}' has dimension 3, got a vector of 1"
    assert [m["id"] for m in hits["ok"]] == ["a"]  # a refused batch writes nothing

    # not caught by the function: a 500 naming the binding failure and the dimension
    status, headers, body = probe.raw({**probe.vec("query", [1, 0]), "uncaught": True})
    assert (status, headers["x-edgefn-error"]) == (500, "binding"), body
    message = json.loads(body)["error"]["message"]
    assert f"index '{probe.index}' has dimension 3, got a vector of 2" in message
    # the operator's path (admin API, CLI): a 400 invalid_value
    with pytest.raises(AdminError) as e:
        probe.pop.admin.request("POST", f"/v1/vectors/{probe.index}/query",
                                json.dumps({"vector": [1, 0]}).encode())
    assert (e.value.status, e.value.code) == (400, "invalid_value")
    assert "has dimension 3, got a vector of 2" in str(e.value)


def test_a_refused_first_upsert_leaves_no_index_behind(probe: Probe) -> None:
    """A string vector's first upsert created the index with dimension 11 (the
    string's length): every later upsert of 3 numbers was refused for good."""
    text, empty, ok = probe.run(
        probe.vec("upsert", [{"id": "a", "vector": "hello world"}]),
        probe.vec("upsert", [{"id": "a", "vector": []}]),
        probe.vec("upsert", [{"id": "a", "vector": [1, 2, 3]}]))
    assert text["error"] == f"index '{probe.index}': vector is not a list of numbers, got a " \
        "string"
    assert empty["error"] == f"index '{probe.index}': the vector is empty"
    assert ok == {"ok": 1}


@pytest.mark.parametrize("refused", [
    [{"id": "a", "vector": [1, 2]}, {"id": "b", "vector": [1, 2, 3]}],  # the second item's
    [{"id": "a", "vector": [70000.0, 1, 2]}],  # past the default f16's range
    [{"id": "a", "vector": [1, 2]}, {"id": "", "vector": [1, 2]}],  # an empty id
    [{"id": "a", "vector": [1, 2], "metadata": 5}],
])
def test_a_first_upsert_refused_for_any_item_leaves_no_index(probe: Probe,
                                                             refused: list[Any]) -> None:
    """The first item's dimension made the index before the rest were checked: a
    refused upsert fixed it for good (`index 'v4' has dimension 2`), and a function
    cannot delete an index."""
    first, ok = probe.run(probe.vec("upsert", refused),
                          probe.vec("upsert", [{"id": "b", "vector": [1, 2, 3, 4]}]))
    assert "error" in first, first
    assert ok == {"ok": 1}


def test_vector_arguments_are_checked_and_named(probe: Probe) -> None:
    """A misspelt `filter` was dropped and the query answered unfiltered (another
    user's documents, where the filter chose a user's); nested lists were flattened
    into one longer vector, `true` read as 1, `null` as NaN."""
    probe.ok(probe.vec("upsert", [{"id": "a", "vector": [1, 0], "metadata": {"u": "a"}},
                                  {"id": "b", "vector": [0, 1], "metadata": {"u": "b"}}]))
    ix = probe.index
    results = probe.run(*({"op": "call", "name": name, "args": args} for name, args in [
        ("vectors.query", {"index": ix, "vector": [1, 0], "filtr": {"u": "b"}}),
        ("vectors.query", {"index": ix, "vector": [1, 0], "top_k": 1}),
        ("vectors.upsert", {"index": ix, "items": [{"id": "c", "vector": [1, 1], "meta": {}}]}),
        ("vectors.delete", {"index": ix, "items": ["a"]}),
        ("vectors.query", {"index": [ix], "vector": [1, 0]}),
        ("vectors.query", {"index": ix, "vector": [[1, 0]]}),
        ("vectors.query", {"index": ix, "vector": [True, 0]}),
        ("vectors.query", {"index": ix, "vector": [None, 0]}),
        ("vectors.query", {"index": ix, "vector": 5}),
        ("vectors.query", {"index": ix, "vector": [1, 0], "filter": {"u": "b"}}),
    ]))
    assert [r.get("error") for r in results[:9]] == [
        "bad arguments to vectors.query: vectors.query takes no argument 'filtr' (it takes "
        "filter, index, k, vector)",
        "bad arguments to vectors.query: vectors.query takes no argument 'top_k' (it takes "
        "filter, index, k, vector)",
        "bad arguments to vectors.upsert: a vectors.upsert item takes no argument 'meta' (it "
        "takes id, metadata, vector)",
        "bad arguments to vectors.delete: vectors.delete takes no argument 'items' (it takes "
        "ids, index)",
        "bad arguments to vectors.query: index must be a string, got an array",
        f"index '{ix}': vector is not a list of numbers (item 0 is a list)",
        f"index '{ix}': vector is not a list of numbers (item 0 is a boolean)",
        f"index '{ix}': vector is not a list of numbers (item 0 is null)",
        f"index '{ix}': vector is not a list of numbers, got a number"]
    assert [m["id"] for m in results[9]["ok"]] == ["b"]


def test_a_key_that_is_not_utf8_is_listed_so_that_it_can_be_named(probe: Probe) -> None:
    """A WASM guest's raw key came from `kv.list` as U+FFFD text that named no key."""
    raw = b"\xff\x00bin\xfe"
    probe.pop.pop.stores.kv.put(probe.ns, raw, b"v1")
    probe.pop.pop.stores.kv.put(probe.ns, b"plain", b"v2")
    call = lambda name, **args: {"op": "call", "name": name,  # noqa: E731
                                 "args": {"namespace": probe.ns, **args}}
    listed, got, gone, after = probe.run(
        call("kv.list"), call("kv.get", key_b64=base64.b64encode(raw).decode()),
        call("kv.delete", key_b64=base64.b64encode(raw).decode()), call("kv.list"))
    keys = listed["ok"]["keys"]
    assert [(k["key"], k.get("key_b64")) for k in keys] == [
        ("plain", None), ("\ufffd\x00bin\ufffd", base64.b64encode(raw).decode())]
    assert got["ok"]["value"] == "v1" and gone == {"ok": True}  # raw (the probe decodes it)
    assert [k["key"] for k in after["ok"]["keys"]] == ["plain"]


SDK_KEYS_AND_CAS = '''
import base64, json
from edgefn import BindingError, Response


def handle(request, env):
    kv = env.kv(request.query["ns"])
    raw = b"\\xff\\x00bin\\xfe"
    listed = [k for k in kv.list()["keys"] if "key_b64" in k]
    named = base64.b64decode(listed[0]["key_b64"])
    out = {"got": kv.get(named).decode(), "put": kv.put(raw, b"v2") > 0,
           "again": kv.get(raw).decode(), "deleted": kv.delete(raw), "gone": kv.get(raw)}
    version = kv.put("sess", b"v1", ttl=60, metadata={"user": "u1"})
    kv.cas("sess", version, b"v2", ttl=600, metadata={"user": "u2"})
    entry = kv.get_with_metadata("sess")
    out["cas"] = [entry["value"].decode(), entry["metadata"], round(entry["expires_at"])]
    try:
        kv.get(5)
    except BindingError as e:
        out["bad"] = str(e)
    return Response.json(out)
'''


def test_the_python_sdk_names_any_key_and_its_cas_takes_ttl_and_metadata(
        probe: Probe, tmp_path: Path) -> None:
    """A WASM function's key that is not UTF-8 was listed (with `key_b64`) but no
    SDK call could name it; the SDK's cas took no ttl or metadata (a WASM guest's
    `call` did), so a session key swapped by it lost its expiry for good."""
    raw = b"\xff\x00bin\xfe"
    probe.pop.pop.stores.kv.put(probe.ns, raw, b"v1")
    d = python_function(tmp_path, "sdk-keys", SDK_KEYS_AND_CAS,
                        extra=f'owner = "{probe.name}"\n[bindings]\nkv = ["{probe.ns}"]\n')
    probe.pop.deploy(d)
    started = time.time()
    status, _, body = probe.pop.get(f"/sdk-keys?ns={probe.ns}")
    assert status == 200, body
    out = json.loads(body)
    assert {k: out[k] for k in ("got", "put", "again", "deleted", "gone")} == {
        "got": "v1", "put": True, "again": "v2", "deleted": True, "gone": None}
    value, metadata, expires = out["cas"]
    assert (value, metadata) == ("v2", {"user": "u2"})
    assert started + 600 - 2 <= expires <= time.time() + 600 + 2
    assert out["bad"] == "bad arguments to kv.get: key must be a string, got a number"
    # both key and key_b64: refused (key_b64 was ignored)
    both = probe.run({"op": "call", "name": "kv.get", "args": {
        "namespace": probe.ns, "key": "sess", "key_b64": "c2Vzcw=="}})
    assert both == [{"error": "bad arguments to kv.get: give key or key_b64, not both"}]


def test_integer_arguments_are_json_integers(probe: Probe) -> None:
    """`delta: 1.9` added 1, `k: "2"` asked for 2, `limit: true` listed 1."""
    call = lambda name, **args: {"op": "call", "name": name, "args": {  # noqa: E731
        "namespace" if name.startswith("kv.") else "index":
            probe.ns if name.startswith("kv.") else probe.index, **args}}
    results = probe.run(call("kv.increment", key="n", delta=1.9),
                        call("kv.increment", key="n", delta="2"),
                        call("kv.list", limit=True),
                        call("vectors.query", vector=[1, 0], k="2"),
                        call("kv.increment", key="n", delta=2))
    assert [r.get("error") for r in results[:4]] == [
        "bad arguments to kv.increment: delta must be an integer, got 1.9",
        "bad arguments to kv.increment: delta must be an integer, got '2'",
        "bad arguments to kv.list: limit must be an integer, got True",
        "bad arguments to vectors.query: k must be an integer, got '2'"]
    assert results[4] == {"ok": 2}


def test_a_missing_argument_is_named_not_a_python_repr(probe: Probe) -> None:
    (missing,) = probe.run({"op": "call", "name": "kv.get", "args": {"namespace": probe.ns}})
    assert missing["error"] == "bad arguments to kv.get: missing argument 'key'"


def test_arguments_of_the_wrong_json_kind_are_named_not_python_errors(probe: Probe) -> None:
    """A WASM guest's `call` arguments are any JSON: `[1, 2]` said "list indices must be
    integers or slices, not str", `{"key": 5}` "'int' object has no attribute 'encode'"."""
    array, number = probe.run(
        {"op": "call", "name": "kv.get", "args": [1, 2]},
        {"op": "call", "name": "kv.get", "args": {"namespace": probe.ns, "key": 5}})
    assert array["error"] == "arguments to kv.get must be a JSON object, got an array"
    assert number["error"] == "bad arguments to kv.get: key must be a string, got a number"


def test_kv_and_fetch_arguments_are_checked_and_named(probe: Probe) -> None:
    """Each said a Python error ("'NoneType' object has no attribute 'encode'",
    "Incorrect padding", "'<' not supported between ..."), or nothing: a misspelt
    argument was dropped; `"value": "test"` (valid base64) stored 3 bytes."""
    ns = probe.ns
    results = probe.run(*({"op": "call", "name": name, "args": args} for name, args in [
        ("kv.get", {"namespace": ns, "key": None}),
        ("kv.put", {"namespace": ns, "key": "k", "value": "abc"}),
        ("kv.put", {"namespace": ns, "key": "k", "value": "YQ==", "ttl": "soon"}),
        ("kv.put", {"namespace": ns, "key": "k", "value": "YQ==", "tll": 5}),
        ("kv.list", {"namespace": ns, "prefix": 7}),
        ("fetch", {"url": "http://127.0.0.1:1/", "tiemout_ms": 5}),
        ("fetch", {"url": "http://127.0.0.1:1/", "timeout_ms": "x"}),
        ("fetch", {"url": "http://127.0.0.1:1/", "timeout_ms": 0.5}),
        ("fetch", {"url": "http://127.0.0.1:1/", "timeout_ms": float("inf")}),
        ("fetch", {"url": "http://127.0.0.1:1/", "body": "abc"}),
        ("fetch", {"url": "http://127.0.0.1:1/", "body": 5}),
        ("kv.cas", {"namespace": ns, "key": "k", "expected_version": "1", "value": "YQ=="}),
        ("kv.list", {"namespace": ns, "cursor": 5}),
        ("vectors.upsert", {"index": probe.index, "items": {"id": "x"}}),
        ("vectors.upsert", {"index": probe.index, "items": [{"id": 5, "vector": [1, 0]}]}),
        ("kv.put", {"namespace": ns, "key": "k", "value": "YQ==", "ttl": 60}),
    ]))
    assert [r.get("error") for r in results[:15]] == [
        "bad arguments to kv.get: key must be a string, got null",
        "bad arguments to kv.put: value must be base64 (the bytes, base64-encoded), got 'abc'",
        "bad arguments to kv.put: ttl must be a number of seconds, got a string",
        "bad arguments to kv.put: kv.put takes no argument 'tll' (it takes key, key_b64, "
        "metadata, namespace, ttl, value)",
        "bad arguments to kv.list: prefix must be a string, got a number",
        "bad arguments to fetch: fetch takes no argument 'tiemout_ms' (it takes body, "
        "headers, method, timeout_ms, url)",
        "bad arguments to fetch: timeout_ms must be a number of milliseconds, at least 1, got "
        "'x'",
        "bad arguments to fetch: timeout_ms must be a number of milliseconds, at least 1, got "
        "0.5",
        "fetch: its arguments hold NaN or Infinity, which JSON cannot carry",  # the SDK's
        "bad arguments to fetch: body must be base64 (the bytes, base64-encoded), got 'abc'",
        "bad arguments to fetch: body must be a string, got a number",
        "bad arguments to kv.cas: expected_version must be an integer or null, got '1'",
        "bad arguments to kv.list: cursor must be a string, got a number",
        "bad arguments to vectors.upsert: items must be an array of objects {\"id\", "
        "\"vector\", \"metadata\"}",
        "bad arguments to vectors.upsert: each item's id must be a string"]
    assert "ok" in results[15], results[15]


def test_an_operator_write_the_store_cannot_take_is_named(tmp_path: Path) -> None:
    """A full store answered the operator "internal server error" (the function path
    named it)."""
    from edgefn_core.errors import Failure
    from kv import KVStore
    from runtime.bindings import Stores, operate

    stores = Stores(tmp_path)
    stores._kv = KVStore(tmp_path / "kv", map_size=1 << 20)  # a 1 MiB map fills at once
    try:
        operate(stores, "kv", "ns", "create", {})
        with pytest.raises(Failure) as err:
            operate(stores, "kv", "ns", "put", {"key": "k", "value": "x" * (2 << 20)})
        assert (err.value.status, err.value.code) == (507, "store_unwritable")
        assert "the kv store could not do put: mdb_put: MDB_MAP_FULL" in str(err.value)
    finally:
        stores.close()


def test_a_value_in_another_base64_alphabet_is_refused_not_stored_as_other_bytes(
        probe: Probe) -> None:
    """URL-safe base64 ("-_") is not base64: decoded leniently, its "-" and "_" were
    dropped and "-_-_" stored an empty value."""
    (put,) = probe.run({"op": "call", "name": "kv.put",
                        "args": {"namespace": probe.ns, "key": "k", "value": "-_-_"}})
    assert put["error"] == ("bad arguments to kv.put: value must be base64 (the bytes, "
                            "base64-encoded), got '-_-_'")


@pytest.mark.parametrize(("given", "kind"), [({}, "an object"), ([], "an array"),
                                             (True, "a boolean"), (1.5, "a number")])
def test_an_argument_of_the_wrong_json_kind_is_named_in_json_s_words(
        probe: Probe, given: Any, kind: str) -> None:
    key, ttl = probe.run(
        {"op": "call", "name": "kv.get", "args": {"namespace": probe.ns, "key": given}},
        {"op": "call", "name": "kv.put",
         "args": {"namespace": probe.ns, "key": "k", "value": "YQ==", "ttl": given}})
    assert key["error"] == f"bad arguments to kv.get: key must be a string, got {kind}"
    if kind != "a number":  # a number is a number of seconds
        assert ttl["error"] == (f"bad arguments to kv.put: ttl must be a number of seconds, "
                                f"got {kind}")
