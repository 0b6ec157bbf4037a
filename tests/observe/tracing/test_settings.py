"""pop.toml ``[tracing]``: bad values are `InvalidConfig` naming the field; off
by default, and off leaves the pipeline exactly as without the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config
from runtime.pop import PoP


def load(tmp_path: Path, table: str | None) -> config.PopConfig:
    path = tmp_path / "pop.toml"
    text = 'data = "data"\n[ai]\nenabled = false\n'
    path.write_text(text + (f"[tracing]\n{table}\n" if table is not None else ""))
    return config.load(path)


@pytest.mark.parametrize(("table", "field", "says"), [
    ('endpoint = "127.0.0.1:4318"', "tracing.endpoint", "http(s):// URL"),
    ('endpoint = "ftp://collector/v1/traces"', "tracing.endpoint", "http(s):// URL"),
    ('endpoint = "http://127.0.0.1:99999/v1/traces"', "tracing.endpoint", "bad port"),
    ("sample = 1.5", "tracing.sample", "<= 1.0"),
    ("sample = -0.1", "tracing.sample", ">= 0.0"),
    ('service_name = ""', "tracing.service_name", "length >= 1"),
    ('headers = { "bad header" = "x" }', "tracing.headers", "matching regex"),
    ('headers = { authorization = "line\\nbreak" }', "tracing.headers", "matching regex"),
    ("timeout = 0", "tracing.timeout", "> 0"),
    ("enabled = 1", "tracing.enabled", "expected `bool`"),
    ("url = 'http://x'", "tracing.url", "unknown field"),
    ('compression = "zstd"', "tracing.compression", "expected one of: 'gzip', 'none'"),
])
def test_bad_values_name_the_field(tmp_path: Path, table: str, field: str, says: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        load(tmp_path, table)
    assert err.value.field is not None and err.value.field.startswith(field)
    assert says in str(err.value)


def test_tracing_without_the_events_stage_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pop.toml"
    path.write_text('data = "data"\n[[pipeline]]\nstage = "route"\n[[pipeline]]\n'
                    'stage = "dispatch"\n[tracing]\nenabled = true\n')
    with pytest.raises(InvalidConfig) as err:
        config.load(path)
    assert err.value.field == "tracing.enabled" and "`events` stage" in str(err.value)


def test_good_values_load(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'enabled = true\nendpoint = "https://otel.example:4318/v1/traces"\n'
               'service_name = "edge-fra"\nsample = 0.25\nheaders = { authorization = "Bearer t" }\n'
               'compression = "gzip"')
    t = cfg.tracing
    assert (t.enabled, t.service_name, t.sample, t.compression) == (True, "edge-fra", 0.25, "gzip")
    assert t.headers == {"authorization": "Bearer t"}


def test_off_leaves_the_pipeline_as_without_the_table(tmp_path: Path) -> None:
    chains = []
    for i, table in enumerate((None, "enabled = false", "enabled = true")):
        (tmp_path / str(i)).mkdir()
        pop = PoP(load(tmp_path / str(i), table))
        try:
            chains.append((pop.pipeline.names, pop.pipeline._first.__qualname__, pop.tracer))
        finally:
            pop.close()
    assert chains[0] == chains[1]
    assert chains[0][2] is None and "tracing" not in chains[0][0]
    assert chains[2][0] == ["tracing", *chains[0][0]] and chains[2][2] is not None
    assert chains[2][1] != chains[0][1]  # on: a timed chain (stage spans from its marks)
