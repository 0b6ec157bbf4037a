"""KV and vector bindings from WASM and Python functions, over a real PoP."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

from tests.support import EXAMPLES, Running, function_dir, reactor

DOCS = [{"id": "d1", "vector": [1, 0, 0], "text": "about cats"},
        {"id": "d2", "vector": [0, 1, 0], "text": "about dogs"},
        {"id": "d3", "vector": [0.9, 0.2, 0], "text": "kittens"}]


def test_counters_in_wasm_and_python_count_every_concurrent_hit(pop: Running) -> None:
    pop.deploy(EXAMPLES / "counter-c")
    pop.deploy(EXAMPLES / "counter-py")
    pop.deploy(EXAMPLES / "counter-as")
    errors: list[str] = []

    def hit(path: str, n: int) -> None:
        for _ in range(n):
            status, _, body = pop.get(path)
            if status != 200:
                errors.append(f"{path} {status} {body[:200]!r}")

    threads = [threading.Thread(target=hit, args=(p, 25))
               for p in ("/counter-c/x", "/counter-py/x", "/counter-as/x") for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(pop.get("/counter-c/x")[2]) == {"count": 101}
    assert json.loads(pop.get("/counter-py/x")[2]) == {"count": 101}
    assert json.loads(pop.get("/counter-as/x")[2]) == {"count": 101}
    assert pop.pop.stores.kv.get("counters", b"/counter-c/x") == b"101"


def test_retrieval_in_python_and_c_share_the_stores(pop: Running) -> None:
    pop.deploy(EXAMPLES / "retrieval-py")
    pop.deploy(EXAMPLES / "retrieval-c")
    assert pop.request("POST", "/retrieval-py/docs", json.dumps(DOCS).encode())[0] == 201
    for path in ("/retrieval-py", "/retrieval-c"):
        status, _, body = pop.request("POST", path, b"[1, 0, 0]")
        assert status == 200, body
        results = json.loads(body)["results"]
        assert [(r["id"], r["text"]) for r in results] == [
            ("d1", "about cats"), ("d3", "kittens"), ("d2", "about dogs")]
    status, headers, body = pop.request("POST", "/retrieval-py", b"[1, 0]")
    assert (status, headers["x-edgefn-error"]) == (500, "binding"), body
    assert "index 'docs' has dimension 3, got a vector of 2" in json.loads(body)["error"]["message"]


UNDECLARED_C = reactor("""
  (drop (call $inc (i32.const 200) (i32.const 6) (i32.const 200) (i32.const 6) (i64.const 1)))""",
                       imports="""(import "edgefn" "kv_increment"
                            (func $inc (param i32 i32 i32 i32 i64) (result i64)))""",
                       prelude='(data (i32.const 200) "secret")')


def test_undeclared_bindings_are_denied_with_a_clear_error(pop: Running, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "sneaky", UNDECLARED_C, extra='[bindings]\nkv = ["mine"]')
    pop.deploy(d)
    status, headers, body = pop.get("/sneaky")
    assert (status, headers["x-edgefn-error"]) == (500, "binding")
    assert b"did not declare KV namespace 'secret'" in body
    py = tmp_path / "sneaky-py"
    py.mkdir()
    (py / "main.py").write_text(
        "from edgefn import Response\n\ndef handle(request, env):\n"
        "    try:\n        env.kv('secret').get('k')\n"
        "    except RuntimeError as e:\n        return Response(str(e), status=403)\n")
    (py / "edgefn.toml").write_text('name = "sneaky-py"\nruntime = "python"\nentry = "main.py"\n'
                                    'routes = ["/sneaky-py"]\n[pool]\nstandby = false\n')
    pop.deploy(py)
    status, _, body = pop.get("/sneaky-py")
    assert status == 403 and b"did not declare KV namespace 'secret'" in body


def test_unknown_host_import_is_rejected_at_deploy(pop: Running, tmp_path: Path) -> None:
    from runtime.admin.client import AdminError

    src = reactor("", imports='(import "edgefn" "teleport" (func))')
    try:
        pop.deploy(function_dir(tmp_path, "tele", src))
    except AdminError as e:
        assert "`edgefn.teleport` is not a host function edgefn provides" in str(e)
    else:
        raise AssertionError("deploy should have been rejected")


# Each odd request asks for `kv.get` with a buffer too small for the result and gives up;
# each even one asks again with room and answers what it got. The host keeps an
# oversized result only for the retry inside the same request.
GET_TWICE = reactor("""
  (local $turn i64) (local $len i64)
  (local.set $turn (call $inc (i32.const 200) (i32.const 1) (i32.const 210) (i32.const 4)
                             (i64.const 1)))
  (if (i64.eqz (i64.rem_u (local.get $turn) (i64.const 2)))
    (then
      (local.set $len (call $call (i32.const 300) (i32.const 6) (i32.const 400)
                                  (i32.const 27) (i32.const 2060) (i32.const 1024)))
      (i32.store (i32.const 2048) (i32.const 200))
      (i32.store (i32.const 2052) (i32.const 0))
      (i32.store (i32.const 2056) (i32.wrap_i64 (local.get $len)))
      (return (i64.or (i64.shl (i64.const 2048) (i64.const 32))
                      (i64.add (i64.const 12) (local.get $len)))))
    (else
      (drop (call $call (i32.const 300) (i32.const 6) (i32.const 400) (i32.const 27)
                        (i32.const 2060) (i32.const 0)))))""",
                    imports="""(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32)
                                                              (result i64)))
                            (import "edgefn" "kv_increment"
                              (func $inc (param i32 i32 i32 i32 i64) (result i64)))""",
                    prelude="""(data (i32.const 200) "n") (data (i32.const 210) "turn")
                               (data (i32.const 300) "kv.get")
                               (data (i32.const 400) "{\\"namespace\\":\\"n\\",\\"key\\":\\"k\\"}")""")


def test_a_call_result_kept_for_a_retry_never_reaches_a_later_request(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(function_dir(tmp_path, "get-twice", GET_TWICE, extra='[bindings]\nkv = ["n"]'))
    kv = pop.pop.stores.kv
    for n in range(6):
        kv.put("n", b"k", f"value {n}".encode())
        assert pop.get("/get-twice")[2] == b"ok"  # asked with no room: the result is kept
        kv.put("n", b"k", f"newer {n}".encode())
        status, _, body = pop.get("/get-twice")
        assert status == 200, body
        assert base64.b64decode(json.loads(body)["value"]) == f"newer {n}".encode()


# Ten `kv.increment` calls with no room for the result (cap 0: "run it, the result is
# not needed"), then: put "before", `kv.get` with no room, put "after!", `kv.get` with
# room, whose result it answers.
CALLS_AGAIN = reactor("""
  (local $i i32) (local $len i64)
  (loop $again
    (drop (call $call (i32.const 300) (i32.const 12) (i32.const 400) (i32.const 29)
                      (i32.const 4096) (i32.const 0)))
    (local.set $i (i32.add (local.get $i) (i32.const 1)))
    (br_if $again (i32.lt_u (local.get $i) (i32.const 10))))
  (drop (call $put (i32.const 200) (i32.const 1) (i32.const 210) (i32.const 2)
                   (i32.const 220) (i32.const 6)))
  (drop (call $call (i32.const 320) (i32.const 6) (i32.const 500) (i32.const 28)
                    (i32.const 4096) (i32.const 0)))
  (drop (call $put (i32.const 200) (i32.const 1) (i32.const 210) (i32.const 2)
                   (i32.const 230) (i32.const 6)))
  (local.set $len (call $call (i32.const 320) (i32.const 6) (i32.const 500) (i32.const 28)
                              (i32.const 2060) (i32.const 1024)))
  (i32.store (i32.const 2048) (i32.const 200))
  (i32.store (i32.const 2052) (i32.const 0))
  (i32.store (i32.const 2056) (i32.wrap_i64 (local.get $len)))
  (return (i64.or (i64.shl (i64.const 2048) (i64.const 32))
                  (i64.add (i64.const 12) (local.get $len))))""",
                      imports="""(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32)
                                                                (result i64)))
                              (import "edgefn" "kv_put"
                                (func $put (param i32 i32 i32 i32 i32 i32) (result i64)))""",
                      prelude="""(data (i32.const 200) "n") (data (i32.const 210) "st")
                                 (data (i32.const 220) "before") (data (i32.const 230) "after!")
                                 (data (i32.const 300) "kv.increment") (data (i32.const 320) "kv.get")
                                 (data (i32.const 400) "{\\"namespace\\":\\"n\\",\\"key\\":\\"ci0\\"}")
                                 (data (i32.const 500) "{\\"namespace\\":\\"n\\",\\"key\\":\\"st\\"}")""")


def test_only_a_retry_with_room_takes_a_kept_call_result(pop: Running, tmp_path: Path) -> None:
    """The same call again with no room ran nothing (a loop of increments lost every
    other one), and a kept `kv.get` outlived the write after it (the read after the
    write saw the value before it)."""
    pop.deploy(function_dir(tmp_path, "calls-again", CALLS_AGAIN, extra='[bindings]\nkv = ["n"]'))
    status, _, body = pop.get("/calls-again")
    assert status == 200, body
    assert base64.b64decode(json.loads(body)["value"]) == b"after!"
    assert pop.pop.stores.kv.get("n", b"ci0") == b"10"
