"""A region that asks for Redis gets a `redis-server` from the topology, and its
PoPs share rate-limit counters there: requests at one edge count at the other."""

from __future__ import annotations

from pathlib import Path

from runtime.topology import runner, spec
from runtime.topology.load import Client
from tests.support import EXAMPLES

TOPOLOGY = f"""
[[region]]
name = "r1"
redis = true
[[pop]]
name = "central"
tier = "central"
[[pop]]
name = "edge-a"
tier = "edge"
geo = "ga"
region = "r1"
parents = ["central"]
functions = ["{EXAMPLES / 'hello-wat'}"]
[pop.settings.ratelimit]
rules = [{{ by = "ip", limit = "3/minute" }}]
[[pop]]
name = "edge-b"
tier = "edge"
geo = "gb"
region = "r1"
parents = ["central"]
functions = ["{EXAMPLES / 'hello-wat'}"]
[pop.settings.ratelimit]
rules = [{{ by = "ip", limit = "3/minute" }}]
"""


def test_the_edges_of_a_region_share_rate_limit_counters(tmp_path: Path) -> None:
    (tmp_path / "topology.toml").write_text(TOPOLOGY)
    run = tmp_path / "run"
    runner.up(spec.load(tmp_path / "topology.toml"), run, "test", timeout=300)
    try:
        net = runner.read_network(run)
        assert list(net.redis) == ["r1"] and runner.alive(net.redis_pids["r1"])
        statuses = []
        for geo in ("ga", "gb", "ga", "gb"):
            with Client(geo, net.public["edge-a" if geo == "ga" else "edge-b"]) as client:
                statuses.append(client.send("fn", "GET", "/hello").status)
        assert statuses == [200, 200, 200, 429]  # 3 a minute for the region, not per edge
    finally:
        runner.down(run)
    assert not runner.alive(net.redis_pids["r1"])
