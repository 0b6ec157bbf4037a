"""topology.toml: the default file loads, and each bad file is an `InvalidConfig`
naming the file and the field."""

from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime.topology import plan, spec
from tests.support import EXAMPLES
from tests.topologies import SMALL

# (what is wrong, the file's text, the field named, a word of the message)
BAD = [
    ("unknown top-level table", SMALL + "[tiers]\n", "tiers", "unknown field"),
    ("rtt range not two numbers", "[network]\ncentral_rtt_ms = [100]\n" + SMALL,
     "network.central_rtt_ms", "length"),
    ("negative delay", "[network]\nclient_edge_rtt_ms = [-1, 5]\n" + SMALL,
     "network.client_edge_rtt_ms[0]", ">= 0"),
    ("range that goes down", "[network]\nedge_regional_rtt_ms = [40, 20]\n" + SMALL,
     "network.edge_regional_rtt_ms", "goes down"),
    ("loss of 1", "[network]\nloss = 1.0\n" + SMALL, "network.loss", "< 1"),
    ("bad tier", SMALL + '[[pop]]\nname = "x"\ntier = "satellite"\nparents = ["central"]\n',
     "pop[3].tier", "satellite"),
    ("duplicate name", SMALL + '[[pop]]\nname = "reg"\ntier = "regional"\nparents = ["central"]\n',
     "pop[3].name", "twice"),
    ("unknown parent", SMALL.replace('parents = ["central"]', 'parents = ["centrl"]'),
     "pop[1].parents[0]", "centrl"),
    ("edge as a parent", SMALL + '[[pop]]\nname = "e2"\ntier = "edge"\ngeo = "x"\n'
     'parents = ["edge"]\n', "pop[3].parents[0]", "regional or the central"),
    ("edge without parents", SMALL + '[[pop]]\nname = "e2"\ntier = "edge"\ngeo = "x"\n',
     "pop[3].parents", "at least one parent"),
    ("edge without geo", SMALL.replace('geo = "eu-west"\n', ""), "pop[2].geo", "geography"),
    ("two centrals", SMALL + '[[pop]]\nname = "c2"\ntier = "central"\n', "pop",
     "exactly one central"),
    ("unknown region", '[[region]]\nname = "emea"\n' + SMALL.replace(
        'tier = "regional"', 'tier = "regional"\nregion = "emae"'), "pop[1].region", "emae"),
    ("worker config on an edge", SMALL.replace('geo = "eu-west"', 'geo = "eu-west"\n'
     'worker_config = "m.toml"'), "pop[2].worker_config", "only the central"),
    ("bad pop.toml setting", SMALL + '[pop.settings.waf]\nmode = "sometimes"\n',
     "pop[2].settings.waf.mode", "sometimes"),
    ("bad name", SMALL.replace('name = "reg"', 'name = "re g"'), "pop[1].name", "regex"),
    ("unknown regional model", SMALL.replace('parents = ["central"]', 'parents = ["central"]\n'
     'models = ["smollm2-135"]'), "pop[1].models[0]", "no llamacpp model 'smollm2-135'"),
    ("embedding model served by a regional", SMALL.replace(
        'parents = ["central"]', 'parents = ["central"]\nmodels = ["all-minilm-l6-v2"]'),
     "pop[1].models[0]", "may serve: smollm2-135m"),
    ("regional model twice", SMALL.replace('parents = ["central"]', 'parents = ["central"]\n'
     'models = ["smollm2-135m", "smollm2-135m"]'), "pop[1].models[1]", "twice"),
    ("models on an edge", SMALL.replace('geo = "eu-west"', 'geo = "eu-west"\n'
     'models = ["smollm2-135m"]'), "pop[2].models", "only a regional PoP"),
    ("models on central", SMALL.replace('tier = "central"', 'tier = "central"\n'
     'models = ["smollm2-135m"]'), "pop[0].models", "only a regional PoP"),
    ("central's worker config unreadable", SMALL.replace(
        'tier = "central"', 'tier = "central"\nworker_config = "nowhere.toml"').replace(
        'parents = ["central"]', 'parents = ["central"]\nmodels = ["smollm2-135m"]'),
     "pop[0].worker_config", "cannot read"),
    ("central's worker config unreadable, no regional models", SMALL.replace(
        'tier = "central"', 'tier = "central"\nworker_config = "nowhere.toml"'),
     "pop[0].worker_config", "cannot read"),
    ("parents in a cycle", SMALL.replace('parents = ["central"]', 'parents = ["reg2"]')
     + '[[pop]]\nname = "reg2"\ntier = "regional"\nparents = ["reg"]\n', "pop[3].parents",
     "reg -> reg2 -> reg"),
    ("central with parents", SMALL.replace('tier = "central"', 'tier = "central"\n'
     'parents = ["reg"]'), "pop[0].parents", "no parents"),
    ("a parent twice", SMALL.replace('parents = ["reg", "central"]',
                                     'parents = ["central", "central"]'),
     "pop[2].parents[1]", "twice"),
    ("two edges of one geography", SMALL + '[[pop]]\nname = "e2"\ntier = "edge"\n'
     'geo = "eu-west"\nparents = ["reg"]\n', "pop[2].geo", "two edges"),
    ("a region twice", '[[region]]\nname = "emea"\n[[region]]\nname = "emea"\n' + SMALL,
     "region[1].name", "twice"),
    ("a tenant twice", SMALL + '[[region]]\nname = "emea"\n[[tenant]]\nname = "acme"\n'
     'residency = "emea"\n[[tenant]]\nname = "acme"\nresidency = "emea"\n',
     "tenant[1].name", "twice"),
    # keys and JWTs name tenants in lower case: such a pin was written and never applied
    ("a tenant no key or JWT can name", SMALL + '[[region]]\nname = "emea"\n[[tenant]]\n'
     'name = "Acme EU"\nresidency = "emea"\n', "tenant[0].name",
     "'Acme EU' is not a tenant name"),
    ("a tenant in upper case", SMALL + '[[region]]\nname = "emea"\n[[tenant]]\n'
     'name = "Acme-EU"\nresidency = "emea"\n', "tenant[0].name", "its pin would never apply"),
    ("a function folder that is not there", SMALL.replace(
        'geo = "eu-west"', 'geo = "eu-west"\nfunctions = ["nope-dir"]'),
     "pop[2].functions[0]", "nope-dir"),
]


@pytest.mark.parametrize(("why", "text", "field", "word"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_topology_names_the_file_and_field(tmp_path: Path, why: str, text: str,
                                                 field: str, word: str) -> None:
    path = tmp_path / "topology.toml"
    path.write_text(text)
    with pytest.raises(InvalidConfig) as caught:
        spec.load(path)
    err = caught.value
    assert (err.file, err.field) == (str(path), field), why
    assert word in str(err), str(err)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match=r"missing\.toml: cannot read"):
        spec.load(tmp_path / "missing.toml")


def test_the_default_topology_has_four_edges_two_regionals_one_central() -> None:
    topo = spec.load(EXAMPLES / "topology.toml")
    tiers = [p.tier for p in topo.pop]
    assert (tiers.count("edge"), tiers.count("regional"), tiers.count("central")) == (4, 2, 1)
    assert {p.geo for p in topo.edges()} == {"sa-east", "us-east", "eu-west", "ap-south"}
    assert all(Path(f).is_dir() for p in topo.pop for f in p.functions)


def test_link_delays_come_from_the_configured_ranges(tmp_path: Path) -> None:
    topo = spec.load(EXAMPLES / "topology.toml")
    ports, links = plan.network(topo)
    net = topo.network
    ranges = {"edge": net.edge_regional_rtt_ms, "central": net.central_rtt_ms}
    for link in links.links:
        for route in link.routes:
            tier = topo.named(route.name).tier
            if link.name.startswith("direct-"):
                low, high = net.central_rtt_ms
            elif link.name.startswith("client-"):
                home = link.routes[0] is route
                low, high = net.client_edge_rtt_ms if home else net.reroute_rtt_ms
            else:
                low, high = ranges["central" if tier == "central" else "edge"]
            assert low / 2 <= route.delay_ms <= high / 2, (link.name, route)
    # anycast: home edge first, then the others nearest first
    entry = next(li for li in links.links if li.name == "client-eu-west")
    assert entry.routes[0].name == "eu-west"
    assert [r.delay_ms for r in entry.routes[1:]] == sorted(r.delay_ms for r in entry.routes[1:])
    assert len({ports.public[p.name] for p in topo.pop}) == len(topo.pop)


def test_roles_come_from_config_only(tmp_path: Path) -> None:
    """Every PoP runs the same program; the generated pop.toml says its role, and a
    non-central PoP's worker forwards chat through its uplink."""
    topo = spec.load(EXAMPLES / "topology.toml")
    ports, _ = plan.network(topo)
    ports.redis["americas"] = 6390
    plan.write(tmp_path, topo, ports)
    from runtime import config

    edge = config.load(tmp_path / "pops" / "sa-east" / "pop.toml")
    assert (edge.tier, edge.geo, edge.public.port) == ("edge", "sa-east", ports.public["sa-east"])
    assert edge.ratelimit.storage == "redis://127.0.0.1:6390"
    models = (tmp_path / "pops" / "sa-east" / "models.toml").read_text()
    assert f"http://127.0.0.1:{ports.uplinks['sa-east']}/v1" in models
    central = config.load(tmp_path / "pops" / "central" / "pop.toml")
    assert (central.tier, central.ai.worker_config) == ("central", None)
    assert not (tmp_path / "pops" / "central" / "models.toml").exists()


def _written(tmp_path: Path, text: str) -> None:
    """Plan `text` with the regional "reg" running smollm2-135m; configs in tmp_path/run."""
    (tmp_path / "topology.toml").write_text(text.replace(
        'parents = ["central"]', 'parents = ["central"]\nmodels = ["smollm2-135m"]'))
    topo = spec.load(tmp_path / "topology.toml")
    ports, _ = plan.network(topo)
    plan.write(tmp_path / "run", topo, ports)


def test_a_regional_runs_the_models_it_names_and_forwards_the_others(tmp_path: Path) -> None:
    """Its models.toml has central's entry for each model it names and an uplink for
    the rest; its residency uplink lists only those; an edge still forwards all."""
    (tmp_path / "central.toml").write_text(
        '[[models]]\nname = "smollm2-135m"\nengine = "llamacpp"\nthreads = 1\ncontext = 2048\n'
        '[[models]]\nname = "other"\nengine = "llamacpp"\n'
        '[[models]]\nname = "all-minilm-l6-v2"\nengine = "onnx"\n'
        '[[models]]\nname = "vllm"\nengine = "openai"\nurl = "http://10.0.0.5:8000/v1"\n'
        'models = ["llama-3-70b"]\n'
        '[[loras]]\nname = "pirate"\npath = "p.gguf"\n')
    (tmp_path / "p.gguf").write_bytes(b"")  # the files a worker config names must exist
    text = SMALL.replace('tier = "central"', 'tier = "central"\nworker_config = "central.toml"')
    _written(tmp_path, text)
    from gpu_worker import config as worker
    from runtime import config

    reg = worker.load(tmp_path / "run" / "pops" / "reg" / "models.toml")
    assert [(m.name, m.engine, m.threads, m.context) for m in reg.models] == [
        ("all-minilm-l6-v2", "onnx", 1, 8192), ("smollm2-135m", "llamacpp", 1, 2048),
        ("parents", "openai", 2, 8192)]
    assert reg.models[2].models == ["other", "pirate", "llama-3-70b"]
    assert config.load(tmp_path / "run" / "pops" / "reg" / "pop.toml"
                       ).residency.uplink.models == ["other", "pirate", "llama-3-70b"]
    edge = config.load(tmp_path / "run" / "pops" / "edge" / "pop.toml")
    assert edge.residency.uplink.models == ["smollm2-135m", "other", "pirate", "llama-3-70b"]
    up = worker.load(tmp_path / "run" / "pops" / "edge" / "models.toml").models[1]
    assert (up.engine, up.models) == ("openai", ["smollm2-135m", "other", "pirate",
                                                 "llama-3-70b"])


def test_a_regional_that_serves_every_chat_model_forwards_none(tmp_path: Path) -> None:
    _written(tmp_path, SMALL)
    from gpu_worker import config as worker
    from runtime import config

    reg = worker.load(tmp_path / "run" / "pops" / "reg" / "models.toml")
    assert [(m.name, m.engine) for m in reg.models] == [
        ("all-minilm-l6-v2", "onnx"), ("smollm2-135m", "llamacpp")]
    assert config.load(tmp_path / "run" / "pops" / "reg" / "pop.toml"
                       ).residency.uplink.models == []


def test_a_pops_own_ai_settings_are_kept(tmp_path: Path) -> None:
    """`[pop.settings.ai]` was replaced by the topology's own [ai] table: an `[ai]
    fallback` for central, or a regional without models, came out as `enabled = true`
    and nothing else."""
    from runtime import config
    from tests.topologies import pop

    text = (pop("central", "central",
                settings='[pop.settings.ai]\nfallback = {"ghost-model" = "smollm2-135m"}\n')
            + pop("reg", "regional", parents=["central"],
                  settings="[pop.settings.ai]\nenabled = false\n")
            + pop("edge", "edge", geo="eu-west", parents=["reg", "central"]))
    (tmp_path / "topology.toml").write_text(text)
    topo = spec.load(tmp_path / "topology.toml")
    ports, _ = plan.network(topo)
    plan.write(tmp_path / "run", topo, ports)
    central = config.load(tmp_path / "run" / "pops" / "central" / "pop.toml")
    assert central.ai.enabled and central.ai.fallback == {"ghost-model": "smollm2-135m"}
    assert not config.load(tmp_path / "run" / "pops" / "reg" / "pop.toml").ai.enabled
    edge = config.load(tmp_path / "run" / "pops" / "edge" / "pop.toml")
    assert edge.ai.enabled and edge.ai.worker_config is not None  # the topology's


def test_a_state_file_that_is_not_one_is_named_not_a_traceback(tmp_path: Path) -> None:
    from edgefn_core.errors import Failure
    from runtime.topology.rundir import read_state

    (tmp_path / "topology.json").write_text('{"pops": [')
    with pytest.raises(Failure, match=r"topology.json is not a topology's state .*delete it"):
        read_state(tmp_path)


def test_anycast_fails_over_within_the_region_first(tmp_path: Path) -> None:
    """The eu-west entry failed over to an edge of another region before one of its
    own, sending a pinned tenant's requests out of their region (a 451)."""
    from tests.topologies import EMEA_PINNED, pop

    text = (EMEA_PINNED + pop("central", "central", region="americas")
            + "".join(pop(name, "edge", geo=geo, region=region, parents=["central"])
                      for name, geo, region in (("edge-eu", "eu-west", "emea"),
                                                ("edge-us", "us-east", "americas"),
                                                ("edge-us2", "us-west", "americas"),
                                                ("edge-ap", "ap-south", "emea"))))
    (tmp_path / "topology.toml").write_text(text)
    topo = spec.load(tmp_path / "topology.toml")
    _, links = plan.network(topo)
    entry = next(li for li in links.links if li.name == "client-eu-west")
    assert [r.name for r in entry.routes][:2] == ["edge-eu", "edge-ap"]
    rest = entry.routes[2:]
    assert {r.name for r in rest} == {"edge-us", "edge-us2"}
    assert [r.delay_ms for r in rest] == sorted(r.delay_ms for r in rest)
