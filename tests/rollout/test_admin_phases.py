"""The admin endpoints of two-phase deploys: the scope each needs (an ``admin:read``
key must not switch versions), a key of another tenant may not switch or drop a
staged version, and clear 4xx answers for bad bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import AdminError
from runtime.admin.api import operation, path_parts
from runtime.admin.client import AdminClient
from runtime.functions import deploys
from runtime.security.keys import KeyStore
from tests.rollout.helpers import Topology
from tests.support import function_dir, pop_thread, reactor


@pytest.mark.parametrize(("path", "scope"), [
    (b"/v1/stage", "deploy"),
    (b"/v1/functions/f/stage", "deploy"),
    (b"/v1/functions/f/activate", "deploy"),
    (b"/v1/functions/f/abort", "deploy"),
    (b"/v1/functions/f/promote", "deploy"),
    (b"/v1/functions/f/rollback", "rollback"),
    (b"/v1/functions/activate", "read"),  # a function named "activate" is only read here
    (b"/v1/%6bv/ns/get", "kv"),  # decoded as it is routed: not "read"
    (b"/v1/%64eploy", "deploy"),
    (b"/v1/functions/f/%72ollback", "rollback"),
])
def test_each_phase_needs_the_deploy_scope(path: bytes, scope: str) -> None:
    assert operation(b"POST", path_parts(path)) == scope


@pytest.mark.parametrize(("op", "body", "status", "kind", "says"), [
    ("activate", b'{"version": "0123", "canary": 150}', 400, "invalid_config",
     "strictly between 0% and 100%"),
    ("activate", b'{"version": "0123", "canary": 0}', 400, "invalid_config",
     "strictly between 0% and 100%"),
    ("activate", b'{"version": "0123", "canary": "10%"}', 400, "bad_request",
     "Expected `float | null`, got `str` - at `$.canary`"),
    ("activate", b'{"version": "0123", "share": 10}', 400, "bad_request",
     "Object contains unknown field `share`"),
    ("activate", b'{"version": "0123"}', 404, "not_found", "a0@0123 is not staged on this PoP"),
    ("abort", b"{}", 400, "bad_request", "Object missing required field `version`"),
    ("stage", b'{"version": "0123"}', 404, "not_found", "no function named 'a0' is deployed"),
    ("promote", b"", 404, "not_found", "no function named 'a0' is deployed"),
])
def test_a_bad_phase_request_gets_a_clear_4xx(topology: Topology, op: str, body: bytes,
                                              status: int, kind: str, says: str) -> None:
    with pytest.raises(AdminError) as err:
        topology.pops["edge-a"].admin.request("POST", f"/v1/functions/a0/{op}", body)
    assert (err.value.status, err.value.code) == (status, kind)
    assert says in str(err.value)


def test_a_key_switches_only_its_own_tenants_staged_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pop_thread(tmp_path / "data") as pop:
        store = KeyStore(pop.data)
        acme, _ = store.create("acme", ("admin:deploy", "admin:read"))
        beta, _ = store.create("beta", ("admin:*",))
        pop.admin.request("POST", "/v1/keys/reload")
        d = function_dir(tmp_path, "mine", reactor(""), extra='owner = "acme"')
        blob = deploys.to_tar(deploys.pack_dir(d))
        monkeypatch.setenv("EDGEFN_API_KEY", acme)
        v = AdminClient(pop.data).request("POST", "/v1/stage", blob)["version"]
        monkeypatch.setenv("EDGEFN_API_KEY", beta)
        for op in ("activate", "abort"):
            with pytest.raises(AdminError) as err:
                AdminClient(pop.data).request("POST", f"/v1/functions/mine/{op}",
                                              f'{{"version": "{v}"}}'.encode())
            assert (err.value.status, err.value.code) == (403, "not_owner")
        assert pop.get("/mine")[0] == 404
        monkeypatch.setenv("EDGEFN_API_KEY", acme)
        AdminClient(pop.data).request("POST", "/v1/functions/mine/activate",
                                      f'{{"version": "{v}"}}'.encode())
        assert pop.get("/mine")[0] == 200
