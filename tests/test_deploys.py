"""The deploy store without sockets: the package unpacker's limits and refusals, what a
failed write leaves behind (nothing), and the hash check of stored versions."""

from __future__ import annotations

import functools
import io
import os
import tarfile
import time
import zlib
from pathlib import Path

import pytest

from edgefn_core.errors import DeployError, NotFound, VersionTampered
from runtime.functions import deploys
from runtime.functions.deploys import DeployStore

MANIFEST = b'name = "f"\nruntime = "wasm"\nentry = "main.wat"\nroutes = ["/f"]\n'
FILES = {"edgefn.toml": MANIFEST, "main.wat": b"(module)", "lib/util.txt": b"u"}


def tar(*entries: tarfile.TarInfo | tuple[str, bytes]) -> bytes:
    """A tar.gz of `entries`: (name, data) plain files, or TarInfos as they are."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
        for e in entries:
            if isinstance(e, tuple):
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                t.addfile(info, io.BytesIO(e[1]))
            else:
                t.addfile(e)
    return buf.getvalue()


def info(name: str, kind: bytes, **attrs: object) -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type = kind
    for k, v in attrs.items():
        setattr(i, k, v)
    return i


@functools.cache
def many_dirs(n: int) -> bytes:
    """A tar.gz of `n` folder entries (one header repeated), compressed as it is
    made: 1.5M entries are 7 MB like the package of the issue, in about a second."""
    header = info("d/", tarfile.DIRTYPE).tobuf()
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk, out = header * 10_000, []
    for _ in range(n // 10_000):
        out.append(z.compress(chunk))
    out.append(z.compress(b"\0" * 1024) + z.flush())
    return b"".join(out)


def test_a_package_round_trips_through_tar() -> None:
    assert deploys.from_tar(deploys.to_tar(FILES)) == FILES


def test_folders_and_a_leading_dot_slash_are_accepted() -> None:
    blob = tar(info("./lib/", tarfile.DIRTYPE), ("./lib/a.txt", b"a"), ("b", b""))
    assert deploys.from_tar(blob) == {"lib/a.txt": b"a", "b": b""}


@pytest.mark.parametrize(("entry", "message"), [
    (("/etc/passwd", b"x"), "package entry '/etc/passwd' is not a plain relative path"),
    (("a/../../x", b"x"), "package entry 'a/../../x' is not a plain relative path"),
    (("a//b", b"x"), "package entry 'a//b' is not a plain relative path"),
    (("a/./b", b"x"), "package entry 'a/./b' is not a plain relative path"),
    (info("ln", tarfile.SYMTYPE, linkname="/etc/shadow"),
     "package entry 'ln' is not a plain file or folder (links, devices and sparse files are "
     "refused)"),
    (info("hard", tarfile.LNKTYPE, linkname="edgefn.toml"),
     "package entry 'hard' is not a plain file or folder"),
    (info("dev", tarfile.CHRTYPE, devmajor=1, devminor=3),
     "package entry 'dev' is not a plain file or folder"),
    (info("fifo", tarfile.FIFOTYPE), "package entry 'fifo' is not a plain file or folder"),
    (("a\\b", b"x"), "package entry 'a\\\\b' has a backslash or control character"),
    (("a\nb", b"x"), "package entry 'a\\nb' has a backslash or control character"),
    (("x" * 129, b""), f"package entry {'x' * 60!r} has a name longer than 128 bytes"),
    (("/".join(["d"] * 17), b""), "names deep; the limit is 16"),
    (("/".join(["d" * 100] * 3), b""), "... is 302 bytes long; the limit is 256"),
])
def test_a_bad_entry_is_refused_with_its_name(entry: tarfile.TarInfo | tuple[str, bytes],
                                              message: str) -> None:
    with pytest.raises(DeployError) as err:
        deploys.from_tar(tar(("edgefn.toml", MANIFEST), entry))
    assert message in str(err.value)


def test_paths_at_the_limits_are_accepted() -> None:
    deep = "/".join(["d"] * 15) + "/f"  # 16 names
    long = "/".join(["x" * 128, "y" * 127])  # 256 bytes
    assert set(deploys.from_tar(tar((deep, b""), (long, b""), ("é" * 64, b"")))) == {
        deep, long, "é" * 64}


def test_a_name_that_is_not_utf8_is_refused() -> None:
    i = tarfile.TarInfo("x")
    raw = bytearray(i.tobuf(format=tarfile.GNU_FORMAT))
    raw[0:2] = b"\xff\xfe"
    raw[148:156] = b"        "
    raw[148:155] = f"{sum(raw):06o}\0".encode()
    blob = bytes(raw) + b"\0" * 1024
    with pytest.raises(DeployError) as err:
        deploys.from_tar(blob)
    assert "is not valid UTF-8" in str(err.value)


def test_a_name_given_twice_or_as_file_and_folder_is_refused() -> None:
    with pytest.raises(DeployError) as err:
        deploys.from_tar(tar(("a", b"1"), ("a", b"2")))
    assert str(err.value) == "package entry 'a' appears twice"
    with pytest.raises(DeployError) as err:
        deploys.from_tar(tar(("lib", b"file"), ("lib/x/y.py", b"")))
    assert str(err.value) == "package entry 'lib' is both a file and a folder"
    with pytest.raises(DeployError) as err:
        deploys.check_package({"a/b": b"", "a/b/c": b""})
    assert str(err.value) == "package entry 'a/b' is both a file and a folder"


def test_size_and_count_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploys, "MAX_PACKAGE_BYTES", 100)
    deploys.from_tar(tar(("a", b"x" * 60), ("b", b"x" * 40)))
    with pytest.raises(DeployError) as err:
        deploys.from_tar(tar(("a", b"x" * 60), ("b", b"x" * 41)))
    assert str(err.value) == ("package holds more than 100 bytes (0 MiB, the limit) by 'b' "
                              "(41 bytes)")  # it said "exceeds 64 MiB or 2000 files"
    monkeypatch.setattr(deploys, "MAX_PACKAGE_FILES", 3)
    deploys.from_tar(tar(("a", b""), ("b", b""), ("c", b"")))
    with pytest.raises(DeployError) as err:
        deploys.from_tar(tar(("a", b""), ("b", b""), ("c", b""), ("d", b"")))
    assert str(err.value) == "package has more than 3 files (the limit), at 'd'"
    with pytest.raises(DeployError) as err:
        deploys.check_package({"a": b"", "b": b"", "c": b"", "d": b""})
    assert str(err.value) == "package has 4 files; the limit is 3"
    with pytest.raises(DeployError) as err:
        deploys.check_package({"a": b"x" * 101})
    assert str(err.value) == "package holds 101 bytes; the limit is 100 (0 MiB)"


def test_a_folder_past_the_limits_is_refused_naming_the_limit_and_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploys, "MAX_PACKAGE_BYTES", 100)
    monkeypatch.setattr(deploys, "MAX_PACKAGE_FILES", 2)
    (tmp_path / "a").write_bytes(b"x" * 60)
    (tmp_path / "b").write_bytes(b"x" * 41)
    with pytest.raises(DeployError, match="holds more than 0 MiB \\(the limit\\) by b "
                                          "\\(41 bytes\\)"):
        deploys.pack_dir(tmp_path)
    (tmp_path / "b").write_bytes(b"")
    (tmp_path / "c").write_bytes(b"")
    with pytest.raises(DeployError, match="has more than 2 files \\(the limit\\), at c"):
        deploys.pack_dir(tmp_path)


def test_a_package_of_millions_of_folders_stops_at_the_entry_limit() -> None:
    blob = many_dirs(1_500_000)
    assert len(blob) < 16 << 20  # fits in a request body
    t = time.perf_counter()
    with pytest.raises(DeployError) as err:
        deploys.from_tar(blob)
    took = time.perf_counter() - t
    assert str(err.value) == "package has more than 4000 entries (files and folders)"
    assert took < 1.0, took  # reading every header took 58 s
    at_limit = tar(*[info(f"d{i}/", tarfile.DIRTYPE) for i in range(4000)])
    assert deploys.from_tar(at_limit) == {}


def test_garbage_is_not_a_tar_archive() -> None:
    for blob in (b"", b"not a tar", deploys.to_tar(FILES)[:40]):
        with pytest.raises(DeployError) as err:
            deploys.from_tar(blob)
        assert str(err.value).startswith("package is not a valid tar archive")


# -- the store ------------------------------------------------------------------------------
def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_write_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    store = DeployStore(tmp_path)
    before = listing(tmp_path)
    with pytest.raises(DeployError) as err:  # a clash that skipped check_package
        store.write_version("f", "v1", {"a": b"", "a/b": b""})
    assert str(err.value).startswith("cannot store the package: ")
    assert listing(tmp_path) == before
    store.write_version("f", "v2", FILES)
    with pytest.raises(DeployError):
        store.write_version("f", "v3", {"x" * 300: b""})  # too long for the file system
    assert listing(tmp_path) == [*before, "versions/f", "versions/f/v2",
                                 "versions/f/v2.files", *(f"versions/f/v2/{p}" for p in
                                                          ("edgefn.toml", "lib", "lib/util.txt",
                                                           "main.wat"))]
    store.remove_version("f", "v2")
    assert listing(tmp_path) == before


def stored(tmp_path: Path) -> tuple[DeployStore, str]:
    store = DeployStore(tmp_path)
    version = deploys.version_of(FILES)
    assert store.write_version("f", version, FILES) is True
    store.verify("f", version)
    return store, version


@pytest.mark.parametrize(("tamper", "message"), [
    (lambda d: (d / "main.wat").write_bytes(b"(module (start 0))"),
     "stored file 'main.wat' was changed after the deploy (sha256 "),
    (lambda d: (d / "lib" / "evil.py").write_bytes(b""),
     "stored file 'lib/evil.py' was added after the deploy"),
    (lambda d: (d / "lib" / "util.txt").unlink(),
     "stored file 'lib/util.txt' was removed after the deploy"),
    (lambda d: ((d / "lib" / "util.txt").unlink(), (d / "lib" / "util.txt").symlink_to(
        "/etc/passwd")), "stored file 'lib/util.txt' is not a plain file or folder"),
    (lambda d: os.mkfifo(d / "pipe"), "stored file 'pipe' is not a plain file or folder"),
])
def test_a_tampered_version_is_refused_naming_the_file(tmp_path: Path, tamper: object,
                                                       message: str) -> None:
    store, version = stored(tmp_path)
    tamper(store.version_dir("f", version))  # type: ignore[operator]
    with pytest.raises(VersionTampered) as err:
        store.verify("f", version)
    assert str(err.value).startswith(message), str(err.value)
    assert (err.value.code, err.value.status) == ("version_tampered", 500)


def test_hashes_edited_to_match_a_changed_file_do_not_pass(tmp_path: Path) -> None:
    store, version = stored(tmp_path)
    (store.version_dir("f", version) / "main.wat").write_bytes(b"evil")
    sums = deploys.sums_of({**FILES, "main.wat": b"evil"})
    store.sums_path("f", version).write_bytes(repr(sums).replace("'", '"').encode())
    with pytest.raises(VersionTampered) as err:
        store.verify("f", version)
    assert str(err.value) == f"its list of file hashes (f/{version}.files) was edited"
    store.sums_path("f", version).write_bytes(b"{not json")
    with pytest.raises(VersionTampered) as err:
        store.verify("f", version)
    assert str(err.value).startswith("its list of file hashes is unreadable: ")


def test_a_version_stored_without_hashes_is_checked_whole(tmp_path: Path) -> None:
    store, version = stored(tmp_path)
    store.sums_path("f", version).unlink()
    store.verify("f", version)
    (store.version_dir("f", version) / "main.wat").write_bytes(b"x")
    with pytest.raises(VersionTampered) as err:
        store.verify("f", version)
    assert str(err.value) == ("the stored files no longer hash to their version (changed "
                              "after the deploy)")
    with pytest.raises(NotFound):
        store.verify("f", "0" * 16)


def test_storing_a_tampered_version_again_replaces_it(tmp_path: Path) -> None:
    store, version = stored(tmp_path)
    assert store.write_version("f", version, FILES) is False  # intact: kept
    (store.version_dir("f", version) / "main.wat").write_bytes(b"evil")
    assert store.write_version("f", version, FILES) is True
    store.verify("f", version)
    assert (store.version_dir("f", version) / "main.wat").read_bytes() == b"(module)"


def test_what_a_killed_deploy_left_is_swept_at_start(tmp_path: Path) -> None:
    """A kill -9 mid-deploy left .staging-* folders and a version no record names;
    nothing ever removed them."""
    from runtime.functions.deploys import FunctionRecord, VersionInfo

    store = DeployStore(tmp_path)
    files = {"edgefn.toml": b"x", "a.bin": b"1" * 100}
    other = {"edgefn.toml": b"y"}
    kept, orphan = deploys.version_of(files), deploys.version_of(other)
    assert store.write_version("f", kept, files)
    assert store.write_version("f", orphan, other)  # stored, never committed
    store.save(FunctionRecord("f", kept, [VersionInfo(kept, time.time())]))
    dead = (tmp_path / "versions" / "f" / ".staging-v9-999999999")
    dead.mkdir()
    (dead / "part").write_bytes(b"half")
    live = tmp_path / "versions" / "f" / f".staging-v8-{os.getpid()}"  # a deploy running
    live.mkdir()
    assert store.write_version("ghost", kept, files)  # a function never committed
    removed = sorted(str(Path(p).relative_to(tmp_path / "versions")) for p in store.sweep())
    assert removed == sorted(["f/.staging-v9-999999999", f"f/{orphan}", f"ghost/{kept}"])
    assert store.version_dir("f", kept).is_dir() and live.is_dir()
    assert not store.sums_path("f", orphan).exists()
    assert not (tmp_path / "versions" / "ghost").exists()
    store.verify("f", kept)  # what is recorded is whole
