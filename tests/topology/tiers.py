"""Chains of real in-process PoPs whose model workers forward to the next tier (an
``openai`` engine pointed at the upstream PoP), shared by the tier tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.security.keys import KeyStore
from tests.support import Running, pop_thread


def forwarding(path: Path, to: Running | int, models: list[str]) -> str:
    """A worker config forwarding `models` to PoP `to` (or to a port); its path."""
    where = f"{to.host}:{to.port}" if isinstance(to, Running) else f"127.0.0.1:{to}"
    path.write_text(f'[[models]]\nname = "up"\nengine = "openai"\nurl = "http://{where}/v1"\n'
                    f"models = {json.dumps(models)}\ntimeout = 30\n")
    return str(path)


@contextmanager
def three_tiers(tmp: Path, port: int, secret: str, chat: str) -> Iterator[
        tuple[Running, Running, dict[str, str]]]:
    """central (the real worker running `chat`) on `port`, a regional on `port + 1` and an
    edge on `port + 2`, each forwarding `chat` to the next, all sharing the topology
    `secret`, AI caches off. Yields central, the edge and the edge's key for tenant
    "acme" (all scopes)."""
    (tmp / "central.toml").write_text(f'[[models]]\nname = "{chat}"\nengine = "llamacpp"\n'
                                      f"threads = 1\ncontext = 1024\n")
    off = {"ai_cache.enabled": False}
    with pop_thread(tmp / "central", port, ai=True, ai_config=str(tmp / "central.toml"),
                    name="central", tier="central", residency={"secret": secret},
                    **off) as central, \
            pop_thread(tmp / "reg", port + 1, ai=True, ai_config=forwarding(
                tmp / "reg.toml", central, [chat]), name="reg", tier="regional",
                residency={"secret": secret}, **off) as reg, \
            pop_thread(tmp / "edge", port + 2, ai=True, ai_config=forwarding(
                tmp / "edge.toml", reg, [chat]), name="edge", residency={"secret": secret},
                **off) as edge:
        store = KeyStore(edge.data)
        keys = {"acme": store.create("acme", ("*",))[0]}
        edge.admin.request("POST", "/v1/keys/reload")
        yield central, edge, keys
