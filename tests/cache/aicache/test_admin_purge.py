"""`POST /v1/cache/ai/purge` and `edgefn cache purge --ai` on a real PoP: what a
body may say, what a tenant's key may purge, and bad input answered with errors
that name what is wrong. (What a purge drops: test_purge.py; across the tiers of
a topology: tests/topology/test_ai_purge.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgefn_core.errors import AdminError
from runtime.security.keys import KeyStore
from tests.support import ROOT, Running

PURGE = "/v1/cache/ai/purge"


def cli(*args: str, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "cache", "purge", *args,
                           "--data", str(data)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


@pytest.mark.parametrize(("body", "answer"), [
    (b'{"all": true}', {"purged": 0, "model": None, "tenant": None}),
    (b'{"model": "smollm2-135m"}', {"purged": 0, "model": "smollm2-135m", "tenant": None}),
    (b'{"tenant": ""}', {"purged": 0, "model": None, "tenant": ""}),
    (b'{"model": "m", "tenant": "acme"}', {"purged": 0, "model": "m", "tenant": "acme"}),
])
def test_a_purge_names_what_it_purged(pop: Running, body: bytes, answer: dict) -> None:
    assert pop.admin.request("POST", PURGE, body) == answer


@pytest.mark.parametrize(("body", "names"), [
    (b"{}", 'give "all": true'),
    (b'{"all": false}', 'give "all": true'),
    (b'{"all": true, "model": "m"}', "leave out model"),
    (b'{"model": ""}', "field `model`"),
    (b'{"tenant": 3}', "$.tenant"),
    (b'{"prefix": "/"}', "prefix"),
    (b"not json", "invalid request body"),
])
def test_bad_ai_purge_bodies_are_400s_naming_the_field(pop: Running, body: bytes,
                                                      names: str) -> None:
    with pytest.raises(AdminError) as err:
        pop.admin.request("POST", PURGE, body)
    assert err.value.status == 400 and names in str(err.value)


def test_a_tenants_key_purges_its_own_entries_only(pop: Running) -> None:
    key, _ = KeyStore(pop.data).create("acme", ("admin:cache",))
    pop.admin.request("POST", "/v1/keys/reload")
    as_acme = {"authorization": f"Bearer {key}"}
    out = pop.admin.request("POST", PURGE, b'{"all": true}', as_acme)
    assert out == {"purged": 0, "model": None, "tenant": "acme"}
    out = pop.admin.request("POST", PURGE, b'{"model": "m"}', as_acme)
    assert out == {"purged": 0, "model": "m", "tenant": "acme"}
    with pytest.raises(AdminError) as err:
        pop.admin.request("POST", PURGE, b'{"tenant": "globex"}', as_acme)
    assert err.value.status == 403 and "globex" in str(err.value)


def test_the_cli_purges_the_ai_cache(pop: Running) -> None:
    out = cli("--ai", "--model", "smollm2-135m", "--json", data=pop.data)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"purged": 0, "model": "smollm2-135m", "tenant": None}
    out = cli("--ai", data=pop.data)
    assert (out.returncode, out.stdout) == (0, "purged 0 entries\n")


@pytest.mark.parametrize(("args", "says"), [
    (["--prefix", "/a/", "--model", "m"], "add --ai"),
    (["--tenant", "acme"], "one of the arguments"),
    (["--ai", "--tag", "t"], "not allowed with"),
])
def test_cli_ai_options_need_ai(tmp_path: Path, args: list[str], says: str) -> None:
    out = cli(*args, data=tmp_path)
    assert out.returncode in (1, 2) and says in out.stderr, out.stderr
