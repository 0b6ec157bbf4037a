"""A Python function's ``env.kv().get`` served in its isolate host
(``EDGEFN_PYTHON_KV=local``), over a real PoP, real isolate hosts and LMDB: the
reads really stay in the host, see every write the PoP made before them (in the
same request and across requests, expiry included), obey the grants of the
moment (a withdrawn grant stops the next read), fail exactly as the socket path
does, and the switches keep the socket path. Which path served a read is seen
from the PoP: the ``kv.get`` binding calls that reached it are counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.bindings import Bindings, Stores
from tests.support import Running

# Runs the steps in the body: [op, namespace, key, value?] -> one result each.
STEPS = """import json
from edgefn import BindingError, Response

def handle(request, env):
    out = []
    try:
        for op, ns, key, *value in json.loads(request.body):
            kv = env.kv(ns)
            if op == "get":
                got = kv.get(key)
                out.append(None if got is None else got.decode())
            elif op == "put":
                kv.put(key, *value)
                out.append("ok")
            elif op == "delete":
                out.append(kv.delete(key))
    except BindingError as e:
        return Response(str(e), status=403)
    return Response.json(out)
"""


@pytest.fixture
def gets(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The arguments of every ``kv.get`` binding call that reaches the PoP (the
    real call still runs). Patched before any deploy: hosts bind `call` then."""
    seen: list[dict[str, Any]] = []
    real = Bindings.call

    def spy(self: Bindings, name: str, args: dict[str, Any], caller: str | None = None,
            raw: bool = False) -> Any:
        if name == "kv.get":
            seen.append(args)
        return real(self, name, args, caller, raw)

    monkeypatch.setattr(Bindings, "call", spy)
    return seen


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("EDGEFN_PYTHON_KV", "local")
    yield


def steps_fn(root: Path, name: str, kv: str = '["docs"]', owner: str = "me",
             share: str = "", note: str = "") -> Path:
    """`note`: a comment that makes the version new (versions are content hashes)."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.py").write_text(STEPS + f"# {note}\n")
    (d / "edgefn.toml").write_text(
        f'name = "{name}"\nowner = "{owner}"\nruntime = "python"\nentry = "main.py"\n'
        f'routes = ["/{name}"]\n[pool]\nstandby = false\n[bindings]\nkv = {kv}\n{share}')
    return d


def run(pop: Running, name: str, *steps: list[Any]) -> tuple[int, Any]:
    status, _, body = pop.request("POST", f"/{name}", json.dumps(steps).encode())
    return status, json.loads(body) if status == 200 else body.decode()


def test_reads_are_served_in_the_host(pop: Running, tmp_path: Path, gets: list[Any],
                                      local: None) -> None:
    pop.deploy(steps_fn(tmp_path, "fn"))
    pop.pop.stores.kv.put("docs", b"a", b"one")
    assert run(pop, "fn", *[["get", "docs", "a"]] * 5, ["get", "docs", "nope"]) == \
        (200, ["one"] * 5 + [None])
    assert gets == []
    # each read gave its LMDB reader slot back: only the PoP's own readers are listed
    readers = pop.pop.stores.kv.env.readers().splitlines()[1:]
    assert {line.split()[0] for line in readers} <= {str(os.getpid())}, readers


@pytest.mark.parametrize("switch", [{}, {"EDGEFN_PYTHON_KV": "pop"},
                                    {"EDGEFN_PYTHON_KV": "local", "EDGEFN_NATIVE_KV": "0"}])
def test_the_switches_keep_the_socket_path(pop: Running, tmp_path: Path, gets: list[Any],
                                           monkeypatch: pytest.MonkeyPatch,
                                           switch: dict[str, str]) -> None:
    for k, v in switch.items():
        monkeypatch.setenv(k, v)
    pop.deploy(steps_fn(tmp_path, "fn"))
    pop.pop.stores.kv.put("docs", b"a", b"one")
    assert run(pop, "fn", *[["get", "docs", "a"]] * 3) == (200, ["one"] * 3)
    assert len(gets) == 3


def test_a_read_sees_the_writes_before_it(pop: Running, tmp_path: Path, gets: list[Any],
                                          local: None) -> None:
    pop.deploy(steps_fn(tmp_path, "fn"))
    # within a request: the function's own writes, through the PoP
    assert run(pop, "fn", ["put", "docs", "k", "v1"], ["get", "docs", "k"],
               ["put", "docs", "k", "v2"], ["get", "docs", "k"],
               ["delete", "docs", "k"], ["get", "docs", "k"]) == \
        (200, ["ok", "v1", "ok", "v2", True, None])
    # across requests: a write of an earlier request, and the operator's writes
    assert run(pop, "fn", ["put", "docs", "k", "v3"]) == (200, ["ok"])
    assert run(pop, "fn", ["get", "docs", "k"]) == (200, ["v3"])
    store = pop.pop.stores.kv
    store.put("docs", b"k", b"v4")
    assert run(pop, "fn", ["get", "docs", "k"]) == (200, ["v4"])
    store.clock = lambda: time.time() - 3600  # a put that expired an hour ago
    try:
        store.put("docs", b"k", b"old", ttl=60)
    finally:
        store.clock = time.time
    assert store.get("docs", b"k") is None
    assert run(pop, "fn", ["get", "docs", "k"]) == (200, [None])
    assert gets == []


def test_a_withdrawn_grant_stops_the_next_read(pop: Running, tmp_path: Path, gets: list[Any],
                                               local: None) -> None:
    grant = '[bindings.share.kv]\nn = { read = ["them"] }'
    pop.deploy(steps_fn(tmp_path, "owner", '["n"]', "us", grant))
    pop.pop.stores.kv.put("n", b"k", b"shared")
    pop.deploy(steps_fn(tmp_path, "reader", '["n"]', "them"))
    assert run(pop, "reader", ["get", "n", "k"], ["get", "n", "k"]) == (200, ["shared"] * 2)
    assert gets == []
    pop.deploy(steps_fn(tmp_path / "2", "owner", '["n"]', "us"))  # a version without the grant
    for _ in range(3):
        assert run(pop, "reader", ["get", "n", "k"]) == (
            403, "KV namespace 'n' belongs to owner 'us' and is not shared with 'them'")
    assert len(gets) == 3  # each went to the PoP, which refused it
    pop.deploy(steps_fn(tmp_path / "3", "owner", '["n"]', "us", grant))  # granted again
    assert run(pop, "reader", ["get", "n", "k"]) == (200, ["shared"])
    assert len(gets) == 3


# Reads the host hands to the PoP, and the status the PoP answers them with.
BAD_READS: dict[str, tuple[list[Any], int]] = {
    "undeclared": (["get", "other", "k"], 403),  # a namespace the function did not declare
    "empty": (["get", "docs", ""], 403),           # an empty key
    "long": (["get", "docs", "x" * 512], 200),     # over 511 bytes: the store finds nothing
    "int": (["get", "docs", 7], 403),              # not a str
    "surrogate": (["get", "docs", "\ud800"], 403),  # not encodable as UTF-8
}


@pytest.mark.parametrize("case", BAD_READS)
def test_bad_reads_are_answered_as_over_the_socket(pop: Running, tmp_path: Path,
                                                   gets: list[Any],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   case: str) -> None:
    step, status = BAD_READS[case]
    answers = []
    for n, mode in enumerate(("pop", "local")):
        monkeypatch.setenv("EDGEFN_PYTHON_KV", mode)
        pop.deploy(steps_fn(tmp_path / str(n), "fn", note=mode))
        answers.append(run(pop, "fn", step))
    assert answers[0] == answers[1]
    assert answers[0][0] == status and answers[0][1], answers
    assert len(gets) == 2  # the local path handed its read to the PoP
    assert run(pop, "fn", ["get", "docs", "a"]) == (200, [None])
    assert len(gets) == 2  # while a plain read stays in the host: the switch is on


@pytest.mark.parametrize("mode", ["pop", "local"])
def test_a_host_maps_the_kv_store_only_when_switched_on(pop: Running, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       mode: str) -> None:
    """The default keeps every KV byte out of the function's process: no LMDB file is
    open or mapped there. Switched on, the host maps it (what README warns about)."""
    monkeypatch.setenv("EDGEFN_PYTHON_KV", mode)
    d = tmp_path / "look"
    d.mkdir()
    (d / "main.py").write_text(
        "import os\nfrom edgefn import Response\n\ndef handle(request, env):\n"
        "    fds = []\n"
        "    for n in os.listdir('/proc/self/fd'):\n"
        "        try:\n"
        "            fds.append(os.readlink(f'/proc/self/fd/{n}'))\n"
        "        except OSError:\n"
        "            pass  # the listing's own descriptor, closed by now\n"
        "    maps = open('/proc/self/maps').read()\n"
        "    return Response(repr(fds) + maps)\n")
    (d / "edgefn.toml").write_text(
        'name = "look"\nruntime = "python"\nentry = "main.py"\nroutes = ["/look"]\n'
        '[pool]\nstandby = false\n[bindings]\nkv = ["docs"]\n')
    pop.deploy(d)
    status, _, body = pop.get("/look")
    assert status == 200, body
    assert (b"kv/data.mdb" in body, b"kv/lock.mdb" in body) == ((mode == "local",) * 2)


def test_the_purge_frees_the_slot_of_a_reader_killed_mid_read(tmp_path: Path) -> None:
    """A host killed inside a read leaves its LMDB reader slot (and the pages it pins)
    taken; the PoP's periodic purge gives it back."""
    stores = Stores(tmp_path / "data")
    try:
        stores.kv.create_namespace("docs")
        reader = subprocess.Popen(
            [sys.executable, "-c", "import lmdb, sys, time\n"
             f"env = lmdb.open({str(stores.kv.env.path())!r}, readonly=True, max_dbs=4)\n"
             "txn = env.begin()\nprint('reading', flush=True)\ntime.sleep(60)\n"],
            stdout=subprocess.PIPE, text=True)
        assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
        reader.send_signal(signal.SIGKILL)
        reader.wait(10)
        reader.stdout.close()
        assert str(reader.pid) in stores.kv.env.readers()
        stores.purge_expired()
        assert str(reader.pid) not in stores.kv.env.readers()
    finally:
        stores.close()
