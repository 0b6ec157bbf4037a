"""``region`` and ``[residency]`` in pop.toml: what loads, and the error that names
the file and the field for what does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config

SECRET = 'secret = "0123456789abcdef0123"'


def load(tmp_path: Path, text: str) -> config.PopConfig:
    path = tmp_path / "pop.toml"
    path.write_text(text)
    return config.load(path)


def test_a_pinned_tenant_and_samples_load(tmp_path: Path) -> None:
    cfg = load(tmp_path, f'region = "emea"\n[residency]\n{SECRET}\n'
               '[residency.tenants]\n"acme-eu" = "emea"\n'
               '[residency.samples]\nrate = 0.25\nto = "http://127.0.0.1:9/_edgefn/samples"\n')
    assert cfg.region == "emea" and cfg.residency.tenants == {"acme-eu": "emea"}
    assert cfg.residency.samples.rate == 0.25
    assert "residency" in cfg.stage_names()


@pytest.mark.parametrize(("text", "field", "says"), [
    ('[residency.tenants]\n"acme" = "e u"\n', "residency.tenants.acme", "not a region name"),
    ('[residency.tenants]\n" " = "emea"\n', "residency.tenants", "empty"),
    ('[residency.tenants]\n"Acme EU" = "emea"\n', "residency.tenants.Acme EU",
     "'Acme EU' is not a tenant name (API keys, JWTs and manifests name tenants as ^[a-z0-9]"),
    ('[residency.tenants]\n"acme" = 3\n', "residency.tenants", "expected `str`"),
    ('[residency]\nsecret = "short"\n', "residency.secret", "at least 16"),
    ('[residency.samples]\nrate = 0.5\nto = "http://x/"\n', "residency.samples", "secret"),
    (f'[residency]\n{SECRET}\n[residency.samples]\nrate = 0.5\nto = "ftp://x/"\n',
     "residency.samples.to", "http(s)://"),
    (f'[residency]\n{SECRET}\n[residency.samples]\nrate = 1.5\n', "residency.samples.rate",
     "<= 1"),
    (f'[residency]\n{SECRET}\n[residency.samples]\nbatch = 0\n', "residency.samples.batch",
     ">= 1"),
    ('[residency]\ntenant = {}\n', "residency", "unknown field"),
    (f'[residency]\n{SECRET}\nallow_desensitised = ["nobody"]\n',
     "residency.allow_desensitised[0]", "'nobody' is not a pinned tenant"),
    ('[residency]\nallow_desensitised = ["acme"]\n[residency.tenants]\n"acme" = "emea"\n',
     "residency.allow_desensitised", "hashed with `secret`"),
    ('[residency.uplink]\npops = [{ pop = "c", where = "x" }]\n', "residency.uplink.pops",
     "unknown field"),
    ("region = 7\n", "region", "expected `str`"),
    ('[ai_cache]\nembedding_model = "far"\n[residency.tenants]\n"acme" = "emea"\n'
     '[residency.uplink]\nmodels = ["far"]\n', "ai_cache.embedding_model",
     "prompts would leave the PoP"),
])
def test_bad_values_name_the_file_and_the_field(tmp_path: Path, text: str, field: str,
                                                says: str) -> None:
    with pytest.raises(InvalidConfig) as e:
        load(tmp_path, text)
    assert str(tmp_path / "pop.toml") in str(e.value)
    assert e.value.field is not None and e.value.field.startswith(field), e.value.field
    assert says in str(e.value)


def test_a_forwarded_cache_embedder_is_fine_with_no_tenant_pinned(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[ai_cache]\nembedding_model = "far"\n'
               '[residency.uplink]\nmodels = ["far"]\n')
    assert cfg.ai_cache.embedding_model == "far"
