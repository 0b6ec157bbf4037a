"""The HTTP cache through a real PoP over loopback: a Python function that sets
Cache-Control and Cache-Tag, purged with the CLI and the admin API; and bad
input (purge bodies, settings) answered with errors that name the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgefn_core.errors import AdminError, InvalidConfig, ManifestError
from runtime import config
from runtime.functions.manifest import parse
from runtime.security.keys import KeyStore
from tests.support import ROOT, Running, pop_thread, python_function

COUNTING = '''
from edgefn import Response

calls = 0


def handle(request, env):
    global calls
    calls += 1
    return Response(f"{request.path} call {calls} of {env.vars.get('V', '')}\\n",
                    headers={"cache-control": "public, max-age=60", "etag": f'"{calls}"',
                             "cache-tag": "shop, " + request.path.strip("/").replace("/", "-")})
'''


def cli(*args: str, data: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "runtime.cli", *args, "--data", str(data)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_cached_purged_by_the_cli_and_keyed_by_version(pop: Running, tmp_path: Path) -> None:
    d = python_function(tmp_path, "shop", COUNTING, env='V = "one"')
    pop.deploy(d)
    status, h, body = pop.get("/shop/a")
    assert (status, h["x-edgefn-cache"], body) == (200, "MISS", b"/shop/a call 1 of one\n")
    assert "cache-tag" not in h
    status, h, body = pop.get("/shop/a")
    assert (h["x-edgefn-cache"], body, h["age"]) == ("HIT", b"/shop/a call 1 of one\n", "0")
    assert "cache-tag" not in h and h["x-edgefn-function"].startswith("shop@")
    status, h, _ = pop.get("/shop/a", headers={"if-none-match": '"1"'})
    assert (status, h["x-edgefn-cache"]) == (304, "HIT")
    pop.get("/shop/b")

    assert cli("cache", "purge", "--tag", "shop-a", data=pop.data) == "purged 1 entries\n"
    assert pop.get("/shop/a")[1]["x-edgefn-cache"] == "MISS"
    assert pop.get("/shop/b")[1]["x-edgefn-cache"] == "HIT"
    out = json.loads(cli("cache", "purge", "--prefix", "/shop/", "--json", data=pop.data))
    assert out == {"purged": 2, "prefix": "/shop/"}

    rows = json.loads(cli("cache", "stats", "--json", data=pop.data))
    row, = [r for r in rows if r["cache"] == "http"]
    assert (row["function"], row["requests"], row["hits"]) == ("shop", 6, 3)
    table = cli("cache", "stats", data=pop.data).splitlines()
    assert table[0].split()[:4] == ["CACHE", "FUNCTION", "MODEL", "TENANT"]
    assert table[1].split()[:7] == ["http", "shop", "-", "-", "6", "3", "50.0%"]

    pop.get("/shop/c")
    (d / "edgefn.toml").write_text((d / "edgefn.toml").read_text().replace('"one"', '"two"'))
    pop.deploy(d)  # a new version: never the old one's entries
    status, h, body = pop.get("/shop/c")
    assert (h["x-edgefn-cache"], body) == ("MISS", b"/shop/c call 1 of two\n")


def test_post_invalidates_and_a_function_can_turn_it_off(pop: Running, tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "shop", COUNTING))
    pop.deploy(python_function(tmp_path, "live", COUNTING, extra="[cache.http]\nenabled = false"))
    pop.get("/shop/x")
    assert pop.get("/shop/x")[1]["x-edgefn-cache"] == "HIT"
    status, h, _ = pop.request("POST", "/shop/x", b"{}")
    assert (status, h["x-edgefn-cache"]) == (200, "BYPASS")
    assert pop.get("/shop/x")[1]["x-edgefn-cache"] == "MISS"
    for n in (1, 2):
        status, h, body = pop.get("/live/x")
        assert "x-edgefn-cache" not in h and body == f"/live/x call {n} of \n".encode()


def test_a_tenants_key_purges_its_own_functions_only(pop: Running, tmp_path: Path) -> None:
    for name, owner in (("shop", "acme"), ("news", "globex")):
        pop.deploy(python_function(tmp_path, name, COUNTING, extra=f'owner = "{owner}"'))
        pop.get(f"/{name}/x")
    key, _ = KeyStore(pop.data).create("acme", ("admin:cache",))
    pop.admin.request("POST", "/v1/keys/reload")
    as_acme = {"authorization": f"Bearer {key}"}
    out = pop.admin.request("POST", "/v1/cache/purge", b'{"prefix": "/"}', as_acme)
    assert out["purged"] == 1
    assert pop.get("/shop/x")[1]["x-edgefn-cache"] == "MISS"
    assert pop.get("/news/x")[1]["x-edgefn-cache"] == "HIT"
    with pytest.raises(AdminError) as err:
        pop.admin.request("POST", "/v1/cache/purge", b'{"function": "news"}', as_acme)
    assert err.value.status == 403
    assert pop.get("/news/x")[1]["x-edgefn-cache"] == "HIT"
    # its stats are its own functions' too (every tenant's functions and names showed)
    mine = pop.admin.request("GET", "/v1/cache/stats", headers=as_acme)["stats"]
    assert {r["function"] for r in mine} == {"shop"}
    every = pop.admin.request("GET", "/v1/cache/stats")["stats"]  # the admin token: all
    assert {"shop", "news"} <= {r["function"] for r in every}
    # and its events too (with admin:read): those of its functions, not globex's
    reader, _ = KeyStore(pop.data).create("acme", ("admin:read",))
    pop.admin.request("POST", "/v1/keys/reload")
    seen = pop.admin.request("GET", "/v1/events?limit=1000",
                             headers={"authorization": f"Bearer {reader}"})["events"]
    assert seen and {e["target"].partition("@")[0] for e in seen if e.get("target")} == {"shop"}
    everyone = pop.admin.request("GET", "/v1/events?limit=1000")["events"]
    assert "news" in {e["target"].partition("@")[0] for e in everyone if e.get("target")}


def test_a_pop_can_run_without_it(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"http_cache.enabled": False}) as pop:
        assert "http_cache" not in pop.pop.pipeline.names and pop.pop.http_cache is None
        pop.deploy(python_function(tmp_path, "shop", COUNTING))
        assert [pop.get("/shop/x")[2] for _ in range(2)] == [
            b"/shop/x call 1 of \n", b"/shop/x call 2 of \n"]
        assert "x-edgefn-cache" not in pop.get("/shop/x")[1]
        out = pop.admin.request("POST", "/v1/cache/purge", b'{"tag": "shop"}')
        assert out["purged"] == 0
    assert not (tmp_path / "data" / "cache" / "http").exists()


@pytest.mark.parametrize(("body", "names"), [
    (b"{}", "got none"),
    (b'{"tag": "a", "prefix": "/a/"}', "got prefix, tag"),
    (b'{"prefix": "shop/"}', "field `prefix`"),
    (b'{"key": "shop/a"}', "field `key`"),
    (b'{"tag": " "}', "field `tag`"),
    (b'{"tag": 3}', "$.tag"),
    (b'{"url": "/a"}', "url"),
    (b"not json", "invalid request body"),
])
def test_bad_purge_bodies_are_400s_naming_the_field(pop: Running, body: bytes,
                                                   names: str) -> None:
    with pytest.raises(AdminError) as err:
        pop.admin.request("POST", "/v1/cache/purge", body)
    assert err.value.status == 400 and names in str(err.value)


@pytest.mark.parametrize(("field", "value"), [
    ("http_cache.memory_bytes", -1), ("http_cache.disk_bytes", "lots"),
    ("http_cache.max_entry_bytes", 0), ("http_cache.default_ttl", 0),
    ("http_cache.enabled", "yes"), ("http_cache.ttl", 5)])
def test_bad_pop_settings_name_the_field(tmp_path: Path, field: str, value: object) -> None:
    with pytest.raises(InvalidConfig) as err:
        config.load(None, data=str(tmp_path), **{field: value})
    assert err.value.field == field


@pytest.mark.parametrize(("table", "field"), [
    ("[cache.http]\ndefault_ttl = -5", "cache.http.default_ttl"),
    ("[cache.http]\nenabled = 1", "cache.http.enabled"),
    ("[cache.http]\nmemory_bytes = 5", "cache.http.memory_bytes")])
def test_bad_function_settings_name_the_field(table: str, field: str) -> None:
    raw = f'name = "f"\nruntime = "python"\nentry = "main.py"\nroutes = ["/f"]\n{table}\n'
    with pytest.raises(ManifestError) as err:
        parse(raw.encode(), "edgefn.toml")
    assert err.value.field == field


@pytest.mark.parametrize("args", [["--tag", "a", "--prefix", "/a/"], []])
def test_cli_purge_wants_exactly_one_target(tmp_path: Path, args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "cache", "purge", *args,
                        "--data", str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 2 and "cache purge" in r.stderr
    assert ("not allowed with" if args else "one of the arguments") in r.stderr


def test_a_clients_odd_cache_control_is_no_crash_and_a_reload_refetches(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "odd", COUNTING))
    assert pop.get("/odd/a")[1]["x-edgefn-cache"] == "MISS"
    for value in ("max-age=\u00b2", "min-fresh=" + "9" * 5000):
        status, h, body = pop.get("/odd/a", headers={"cache-control": value})
        assert status == 200 and b"call" in body, (value[:20], status, body[:200])
    # a reload (max-age=0) asks the function again: it was served the old copy as STALE
    status, h, body = pop.get("/odd/a", headers={"cache-control": "max-age=0"})
    assert h["x-edgefn-cache"] != "STALE" and body.endswith(b"of \n")
    assert body != b"/odd/a call 1 of \n"
