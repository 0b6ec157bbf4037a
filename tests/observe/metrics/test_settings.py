"""pop.toml ``[metrics]``: bad values are `InvalidConfig` naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config
from runtime.pop import PoP


def load(tmp_path: Path, table: str) -> config.PopConfig:
    path = tmp_path / "pop.toml"
    path.write_text(f'data = "data"\n[ai]\nenabled = false\n[metrics]\n{table}\n')
    return config.load(path)


@pytest.mark.parametrize(("table", "field", "says"), [
    ('token = "short"', "metrics.token", "length >= 16"),
    ('token = "has spaces in it, sixteen+"', "metrics.token", "matching regex"),
    ('listen = "127.0.0.1"', "metrics.listen", "HOST:PORT"),
    ('listen = "127.0.0.1:70000"', "metrics.listen", "1..65535"),
    ('listen = "metrics.example:9464"', "metrics.listen", "not an IP address"),
    ('token = "0123456789abcdef"\ntoken_file = "t"', "metrics.token_file", "not both"),
    ("max_series = 0", "metrics.max_series", ">= 10"),
    ("worker_timeout = 0", "metrics.worker_timeout", "> 0"),
    ("enabled = 1", "metrics.enabled", "expected `bool`"),
    ("port = 9464", "metrics.port", "unknown field"),
])
def test_bad_values_name_the_field(tmp_path, table, field, says):
    with pytest.raises(InvalidConfig) as err:
        load(tmp_path, table)
    assert err.value.field == field
    assert says in str(err.value)


def test_good_values_load(tmp_path):
    cfg = load(tmp_path, 'token_file = "metrics.token"\nlisten = "[::1]:9464"\n'
                         "max_series = 100")
    assert cfg.metrics.token_file == str(tmp_path / "metrics.token")  # relative to pop.toml
    assert cfg.metrics.address() == ("::1", 9464)
    assert config.load(None).metrics.enabled  # on by default


@pytest.mark.parametrize("content", [None, "", "too-short"])
def test_a_token_file_that_cannot_be_used_names_it(tmp_path, content):
    if content is not None:
        (tmp_path / "metrics.token").write_text(content)
    cfg = load(tmp_path, 'token_file = "metrics.token"')
    with pytest.raises(InvalidConfig) as err:
        PoP(cfg)
    assert err.value.field == "metrics.token_file"


def test_off_builds_no_metrics(tmp_path):
    pop = PoP(load(tmp_path, "enabled = false"))
    try:
        assert pop.metrics is None
        assert [type(o).__name__ for o in pop.observers] == ["Ring", "AccessLog"]  # no metrics
    finally:
        pop.close()
