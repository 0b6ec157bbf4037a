"""A region that asks for Redis gets a `redis-server` from the topology, and its
PoPs share rate-limit counters there: requests at one edge count at the other."""

from __future__ import annotations

from pathlib import Path

from runtime.topology import runner
from runtime.topology.load import Client
from tests.topologies import HELLO, pop, running

LIMITED = '[pop.settings.ratelimit]\nrules = [{ by = "ip", limit = "3/minute" }]\n'
TOPOLOGY = ('[[region]]\nname = "r1"\nredis = true\n' + pop("central", "central")
            + "".join(pop(f"edge-{x}", "edge", geo=f"g{x}", region="r1", parents=["central"],
                          functions=[HELLO], settings=LIMITED) for x in "ab"))


def test_the_edges_of_a_region_share_rate_limit_counters(tmp_path: Path) -> None:
    with running(tmp_path, TOPOLOGY) as run:
        net = runner.read_network(run)
        assert list(net.redis) == ["r1"] and runner.alive(net.redis_pids["r1"])
        statuses = []
        for geo in ("ga", "gb", "ga", "gb"):
            with Client(geo, net.public["edge-a" if geo == "ga" else "edge-b"]) as client:
                statuses.append(client.send("fn", "GET", "/hello").status)
        assert statuses == [200, 200, 200, 429]  # 3 a minute for the region, not per edge
    assert not runner.alive(net.redis_pids["r1"])
