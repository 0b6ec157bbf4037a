"""Hostile deploys against a real PoP over loopback: a package of millions of entries,
a package at the size limit, a file/folder clash, a namespace of another owner, a
stored file edited behind the PoP's back. Each is refused with a clear error, leaves
the data dir as it was, and another function keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgefn_core.errors import AdminError, DeployError
from runtime.functions import deploys
from tests.support import Running, function_dir, pop_thread, reactor
from tests.test_deploys import many_dirs

INCREMENT = reactor("""
  (drop (call $inc (i32.const 200) (i32.const 6) (i32.const 208) (i32.const 1) (i64.const 1)))""",
                    imports="""(import "edgefn" "kv_increment"
                         (func $inc (param i32 i32 i32 i32 i64) (result i64)))""",
                    prelude='(data (i32.const 200) "secret") (data (i32.const 208) "k")')


def listing(root: Path) -> list[str]:
    """The data dir's files, without what changes while a PoP merely runs."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if not p.name.startswith(("pop.", "lock")))


@contextmanager
def probing(pop: Running, path: str) -> Iterator[list[float]]:
    """GET `path` in a loop while the block runs; yields the latencies (s) and checks
    every answer was 200."""
    latencies: list[float] = []
    failures: list[str] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            status, _, body = pop.get(path)
            latencies.append(time.perf_counter() - t)
            if status != 200:
                failures.append(f"{status} {body[:100]!r}")

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        thread.join()
    assert failures == []


def refused(pop: Running, blob: bytes) -> AdminError:
    with pytest.raises(AdminError) as err:
        pop.admin.request("POST", "/v1/deploy", blob)
    return err.value


def test_hostile_packages_are_refused_and_leave_nothing(pop: Running, tmp_path: Path) -> None:
    pop.deploy(function_dir(tmp_path, "hello", reactor("")))
    before = listing(pop.data)
    millions = many_dirs(1_500_000)
    with probing(pop, "/hello") as latencies:
        t = time.perf_counter()
        err = refused(pop, millions)
        took = time.perf_counter() - t
        assert (err.status, err.code, str(err)) == (
            400, "deploy_rejected", "package has more than 4000 entries (files and folders)")
        assert took < 2.0, took  # it took 58 s to read every entry
        files = deploys.pack_dir(function_dir(tmp_path, "clash", reactor("nop")))
        blob = deploys.to_tar({**files, "lib": b"a file", "lib/x.py": b"and a folder"})
        err = refused(pop, blob)
        assert (err.status, str(err)) == (400, "package entry 'lib' is both a file and a folder")
        err = refused(pop, b"\x1f\x8b not really gzip")
        assert err.status == 400 and str(err).startswith("package is not a valid tar archive")
        link = tarfile.TarInfo("main.wat")
        link.type, link.linkname = tarfile.SYMTYPE, "/work/admin.token"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.addfile(link)
        assert "is not a plain file or folder" in str(refused(pop, buf.getvalue()))
        conflict = function_dir(tmp_path / "2", "other", reactor("nop nop"), routes=["/hello"])
        with pytest.raises(AdminError) as late:  # compiled, then refused: its cache goes too
            pop.deploy(conflict)
        assert (late.value.status, late.value.code) == (409, "route_conflict")
    assert len(latencies) > 0
    assert listing(pop.data) == before
    assert not list(pop.data.glob("versions/*/.staging-*"))


def on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def test_a_package_at_the_size_limit_unpacks_off_the_event_loop(
        pop: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pop.deploy(function_dir(tmp_path, "hello", reactor("")))
    files = deploys.pack_dir(function_dir(tmp_path / "2", "big", "(module (func $bad"))
    size = (deploys.MAX_PACKAGE_BYTES - sum(map(len, files.values()))) // 4
    blob = deploys.to_tar({**files, **{f"blob{i}.bin": bytes(size) for i in range(4)}})
    ran: list[tuple[str, bool]] = []  # each blocking step, and whether it ran on a loop

    def spy(owner: object, name: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args: object, **kw: object) -> object:
            ran.append((name, on_a_loop()))
            return real(*args, **kw)
        monkeypatch.setattr(owner, name, wrapper)

    for name in ("from_tar", "version_of"):
        spy(deploys, name)
    for name in ("write_version", "remove_version", "verify"):
        spy(deploys.DeployStore, name)
    before = listing(pop.data)
    gc.collect()
    gc.disable()  # a collection stops every thread of this process (the PoP's too)
    try:
        with probing(pop, "/hello") as latencies:
            t = time.perf_counter()
            err = refused(pop, blob)  # unpacked, hashed, written, compiled (fails), removed
            took = time.perf_counter() - t
    finally:
        gc.enable()
    assert (err.status, err.code) == (400, "deploy_rejected") and "main.wat" in str(err)
    assert listing(pop.data) == before
    assert sorted(set(ran)) == [("from_tar", False), ("remove_version", False),
                                ("version_of", False), ("write_version", False)]
    # meanwhile the PoP answered; the unpacking alone takes a good part of `took`
    assert len(latencies) > 10 and max(latencies) < took / 2, (took, max(latencies))


def test_a_namespace_of_another_owner_cannot_be_bound(pop: Running, tmp_path: Path) -> None:
    victim = function_dir(tmp_path, "victim", INCREMENT, extra='[bindings]\nkv = ["secret"]')
    pop.deploy(victim)
    assert pop.get("/victim")[0] == 200
    before = listing(pop.data)
    with probing(pop, "/victim"):
        thief = function_dir(tmp_path, "thief", INCREMENT, extra='[bindings]\nkv = ["secret"]')
        with pytest.raises(AdminError) as err:
            pop.deploy(thief)
        assert (err.value.status, err.value.code) == (403, "not_owner")
        assert str(err.value).startswith(
            f"{thief}/edgefn.toml: field `bindings.kv`: KV namespace 'secret' belongs to owner "
            "'victim' and is not shared with 'thief'")
        assert pop.get("/thief")[0] == 404
    assert listing(pop.data) == before
    count = pop.pop.stores.kv.get("secret", b"k")
    # shared read-only, the other owner's writes fail at run time; with `write` they work
    (victim / "edgefn.toml").write_text((victim / "edgefn.toml").read_text().replace(
        "[limits]", '[bindings.share.kv]\nsecret = { read = ["thief"] }\n[limits]'))
    pop.deploy(victim)
    pop.deploy(thief)
    status, headers, body = pop.get("/thief")
    assert (status, headers["x-edgefn-error"]) == (500, "binding")
    assert "KV namespace 'secret' of owner 'victim' is shared with 'thief' read-only" in \
           json.loads(body)["error"]["message"]
    assert pop.pop.stores.kv.get("secret", b"k") == count
    (victim / "edgefn.toml").write_text((victim / "edgefn.toml").read_text().replace(
        "read = ", "write = "))
    pop.deploy(victim)
    assert pop.get("/thief")[0] == 200  # the running version: grants are checked per call


def test_a_tampered_stored_file_is_refused_at_restart(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    good = function_dir(tmp_path, "good", reactor(""))
    target = function_dir(tmp_path, "target", reactor(""))
    with pop_thread(data) as pop:
        pop.deploy(good)
        version = pop.deploy(target)["version"]
    stored = data / "versions" / "target" / version / "main.wat"
    stored.write_text(stored.read_text().replace("ok", "no"))
    with caplog.at_level(logging.ERROR, logger="edgefn.pop"), pop_thread(data) as pop:
        assert pop.get("/good")[0] == 200
        status, headers, _ = pop.get("/target")
        assert (status, headers.get("x-edgefn-error")) == (404, "no_route")
        assert [r.getMessage() for r in caplog.records if r.name == "edgefn.pop"] == [
            f"not serving target@{version}: stored file 'main.wat' was changed after the "
            f"deploy (sha256 {deploys.sums_of({'m': stored.read_bytes()})['m'][:16]}..., "
            f"deployed as {deploys.sums_of({'m': (target / 'main.wat').read_bytes()})['m'][:16]}"
            "...)"]
        # the record still names it current; the PoP says it serves none (`versions`
        # marked it * as serving while /target was a 404)
        record = pop.admin.request("GET", "/v1/functions/target/versions")
        assert (record["current"], record["serving"]) == (version, None)
        with pytest.raises(AdminError, match=f"target@{version}: stored file 'main.wat' was"):
            pop.admin.request("POST", "/v1/functions/target/rollback",
                              json.dumps({"version": version}).encode())
        assert pop.deploy(target)["version"] == version  # a redeploy stores it afresh
        assert pop.admin.request("GET", "/v1/functions/target/versions")["serving"] == version
        assert pop.get("/target")[0] == 200


@pytest.mark.parametrize("target", ["/etc/passwd", "/etc"])
def test_pack_dir_refuses_a_symbolic_link_instead_of_sending_what_it_points_to(
        tmp_path: Path, target: str) -> None:
    d = function_dir(tmp_path, "lnk", reactor("nop"))
    (d / "passwd").symlink_to(target)
    with pytest.raises(DeployError, match="passwd is a symbolic link"):
        deploys.pack_dir(d)
    (d / "passwd").unlink()
    assert "passwd" not in deploys.pack_dir(d)


@pytest.mark.parametrize("entry", ["target/wasm32-wasip1/release/fn.wasm", ".hello.wat"])
def test_the_manifests_entry_is_packed_where_the_rest_of_its_folder_is_not(
        tmp_path: Path, entry: str) -> None:
    """Cargo builds into target/: "entry file ... is not in the package", though it
    was on disk. What else lies there (or is a dotfile) is still left out."""
    d = tmp_path / "rs"
    (d / entry).parent.mkdir(parents=True, exist_ok=True)
    d = function_dir(tmp_path, "rs", reactor("nop"), entry=entry)
    (d / "target" / "debug").mkdir(parents=True)
    (d / "target" / "debug" / "big.rlib").write_bytes(b"x" * 100)
    (d / ".env").write_text("SECRET=1")
    assert sorted(deploys.pack_dir(d)) == sorted(["edgefn.toml", entry])


def test_pack_dir_reads_every_folder_up_to_the_size_limit_and_names_what_it_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = function_dir(tmp_path, "sub", reactor("nop"))
    (d / "lib").mkdir()
    (d / "lib" / "util.txt").write_text("u")
    (d / "z.txt").write_text("z")  # sorted after the folder: still read
    files = deploys.pack_dir(d)
    assert sorted(files) == ["edgefn.toml", "lib/util.txt", "main.wat", "z.txt"]
    monkeypatch.setattr(deploys, "MAX_PACKAGE_BYTES", sum(map(len, files.values())))
    assert deploys.pack_dir(d) == files  # exactly the limit
    (d / "z.txt").write_text("zz")
    with pytest.raises(DeployError, match=r"by z\.txt \(2 bytes\)"):
        deploys.pack_dir(d)
    with pytest.raises(DeployError) as err:
        deploys.pack_dir(d / "main.wat")
    assert str(err.value) == f"{d / 'main.wat'}: not a directory"
    (d / "z.txt").unlink()
    (d / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(DeployError) as err:
        deploys.pack_dir(d)
    assert str(err.value) == (f"{d}: passwd is a symbolic link; a package holds plain files "
                              "and folders only (copy the file in)")


def test_pack_dir_refuses_a_fifo_instead_of_leaving_it_out(tmp_path: Path) -> None:
    import os

    d = function_dir(tmp_path, "fifo", reactor("nop"))
    os.mkfifo(d / "pipe")
    with pytest.raises(DeployError, match="pipe is not a plain file"):
        deploys.pack_dir(d)



def test_an_incompressible_package_under_the_limit_deploys(pop: Running, tmp_path: Path) -> None:
    """The admin listener took 32 MiB bodies: a package of 40 MiB of random bytes (64
    MiB is the limit) got a reset, and the CLI said it could not reach the PoP."""
    import os

    d = function_dir(tmp_path, "bulky", reactor(""))
    (d / "blob.bin").write_bytes(os.urandom(40 << 20))
    out = pop.deploy(d)
    assert out["name"] == "bulky" and pop.get("/bulky")[0] == 200


SHADOW = '''
import importlib.util, os, sys, sysconfig
try:  # what a hostile deployer runs: here, only a marker outside any sandbox
    with open({marker!r}, "w") as f:
        f.write(f"uid={{os.getuid()}}")
except OSError:
    pass
spec = importlib.util.spec_from_file_location(
    __name__, os.path.join(sysconfig.get_paths()["stdlib"], __name__ + ".py"))
module = importlib.util.module_from_spec(spec)
sys.modules[__name__] = module
spec.loader.exec_module(module)
'''


@pytest.mark.parametrize("module", ["random", "json", "tempfile", "shutil"])
def test_a_file_named_like_a_module_the_host_imports_does_not_run_outside_the_sandbox(
        pop: Running, tmp_path: Path, module: str) -> None:
    """The host ran `python -m` in the function's folder, which `-m` puts first on
    sys.path: its `random.py` ran as root before the sandbox (and read admin.token)."""
    from tests.support import python_function

    marker = tmp_path / f"escaped-{module}"
    d = python_function(tmp_path, f"shadow-{module}", "from edgefn import Response\n\n"
                        "def handle(request, env):\n    return Response('ok')\n")
    (d / f"{module}.py").write_text(SHADOW.format(marker=str(marker)))
    with contextlib.suppress(AdminError):  # whether it serves is not the point: what ran
        pop.deploy(d)
    assert not marker.exists(), marker.read_text()
