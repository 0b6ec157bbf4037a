"""``[[tenant]]`` and ``[samples]`` in topology.toml: the error naming the file and
field for bad ones, and what every PoP's generated pop.toml gets from them."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config
from runtime.topology import plan, spec
from tests.topologies import pop

TOPO = ('[[region]]\nname = "emea"\n[[region]]\nname = "americas"\n'
        + pop("central", "central", region="americas")
        + pop("edge", "edge", geo="eu-west", region="emea", parents=["central"]))
PIN = '[[tenant]]\nname = "acme-eu"\nresidency = "emea"\n'

BAD = [
    ("no such region", PIN.replace('"emea"', '"emae"'), "tenant[0].residency", "emae"),
    ("empty tenant", PIN.replace('"acme-eu"', '""'), "tenant[0].name", "length"),
    ("unknown field", PIN + 'region = "emea"\n', "tenant[0].region", "unknown field"),
    ("rate over 1", "[samples]\nrate = 2\n", "samples.rate", "<= 1"),
    ("zero interval", "[samples]\ninterval_s = 0\n", "samples.interval_s", "> 0"),
]


@pytest.mark.parametrize(("why", "text", "field", "word"), BAD, ids=[b[0] for b in BAD])
def test_bad_pins_and_samples_name_the_file_and_field(tmp_path: Path, why: str, text: str,
                                                      field: str, word: str) -> None:
    path = tmp_path / "topology.toml"
    path.write_text(text + TOPO)
    with pytest.raises(InvalidConfig) as caught:
        spec.load(path)
    assert (caught.value.file, caught.value.field) == (str(path), field), why
    assert word in str(caught.value)


def test_every_pop_gets_its_region_the_pins_and_one_secret(tmp_path: Path) -> None:
    (tmp_path / "topology.toml").write_text("[samples]\nrate = 0.5\n" + PIN + TOPO)
    topo = spec.load(tmp_path / "topology.toml")
    ports, _ = plan.network(topo)
    plan.write(tmp_path / "run", topo, ports)
    edge = config.load(tmp_path / "run" / "pops" / "edge" / "pop.toml")
    central = config.load(tmp_path / "run" / "pops" / "central" / "pop.toml")
    assert (edge.region, central.region) == ("emea", "americas")
    assert edge.residency.tenants == central.residency.tenants == {"acme-eu": "emea"}
    assert edge.residency.secret == central.residency.secret
    assert len(edge.residency.secret) >= 32
    mode = (tmp_path / "run" / "secret").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert (edge.residency.samples.rate, edge.residency.samples.ingest) == (0.5, False)
    assert edge.residency.samples.to == \
        f"http://127.0.0.1:{ports.public['central']}/_edgefn/samples"
    assert (central.residency.samples.rate, central.residency.samples.ingest) == (0.0, True)


def test_a_pop_knows_where_its_model_calls_go_and_who_may_leave_desensitised(
        tmp_path: Path) -> None:
    pins = PIN + '[[tenant]]\nname = "acme-ds"\nresidency = "emea"\nallow_desensitised = true\n'
    (tmp_path / "topology.toml").write_text(pins + TOPO)
    topo = spec.load(tmp_path / "topology.toml")
    ports, _ = plan.network(topo)
    plan.write(tmp_path / "run", topo, ports)
    edge = config.load(tmp_path / "run" / "pops" / "edge" / "pop.toml")
    central = config.load(tmp_path / "run" / "pops" / "central" / "pop.toml")
    assert edge.residency.allow_desensitised == central.residency.allow_desensitised == [
        "acme-ds"]
    assert edge.residency.uplink.models == plan.CHAT_MODELS
    assert [(u.pop, u.tier, u.region) for u in edge.residency.uplink.pops] == [
        ("central", "central", "americas")]
    assert edge.residency.leaving("emea", plan.CHAT_MODELS[0]) is not None
    assert central.residency.uplink == type(central.residency.uplink)()  # forwards nothing
