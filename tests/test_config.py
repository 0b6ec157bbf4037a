"""`pop.toml`: every field optional, flags override, errors name the file and field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pop.toml"
    path.write_text(text)
    return path


def test_the_threads_guest_memory_is_half_the_machines_unless_set(tmp_path: Path) -> None:
    machine_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    assert config.load(None).wasm.thread_memory_mb() == machine_mb // 2
    cfg = config.load(write(tmp_path, "[wasm]\nmax_thread_memory_mb = 4096\n"))
    assert cfg.wasm.thread_memory_mb() == 4096


def test_python_frames_memory_is_a_quarter_of_the_machines_unless_set(tmp_path: Path) -> None:
    machine_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    assert config.load(None).python.frame_memory_mb() == machine_mb // 4
    cfg = config.load(write(tmp_path, "[python]\nmax_frame_memory_mb = 512\n"))
    assert cfg.python.frame_memory_mb() == 512


def test_defaults_build_the_default_pipeline() -> None:
    cfg = config.load(None)
    assert (cfg.name, cfg.tier, cfg.public.port, cfg.admin.port) == ("edge-local", "edge",
                                                                       8080, 0)
    assert cfg.stage_names() == ["health", "request_id", "events", "access_log", "waf", "bots",
                                 "auth", "residency", "ratelimit", "http_cache", "ai_cache", "openai", "route", "dispatch"]
    assert cfg.ai.enabled and cfg.http.max_body_bytes == 16 << 20


def test_a_file_sets_fields_and_paths_are_relative_to_it(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "par-1"\ntier = "regional"\ndata = "state"\n'
                           '[public]\nport = 9000\n[http]\nmax_body_bytes = 1024\n'
                           '[ai]\nworker_config = "models.toml"\n'
                           '[[pipeline]]\nstage = "route"\n[[pipeline]]\nstage = "dispatch"\n')
    (tmp_path / "models.toml").write_text("")  # a worker config must exist
    cfg = config.load(path)
    assert (cfg.name, cfg.tier, cfg.public.port, cfg.http.max_body_bytes) == (
        "par-1", "regional", 9000, 1024)
    assert cfg.data == str(tmp_path / "state")
    assert cfg.ai.worker_config == str(tmp_path / "models.toml")
    assert cfg.stage_names() == ["route", "dispatch"]


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[public]\nport = 9000\nhost = "127.0.0.2"\n')
    cfg = config.load(path, **{"public.port": 9100, "ai.enabled": False, "data": "/x"})
    assert (cfg.public.host, cfg.public.port, cfg.ai.enabled, cfg.data) == (
        "127.0.0.2", 9100, False, "/x")
    assert config.load(path, **{"public.port": None}).public.port == 9000  # None: not given


def test_under_sets_what_the_file_does_not(tmp_path: Path) -> None:
    """The CLI's $EDGEFN_DATA: under the file's `data`, over the default."""
    bare, own = write(tmp_path, 'name = "a"\n'), tmp_path / "own.toml"
    own.write_text('data = "d"\n')
    assert config.load(bare, under={"data": "/env"}).data == "/env"
    assert config.load(own, under={"data": "/env"}).data == str(tmp_path / "d")
    assert config.load(own, under={"data": "/env"}, data="/flag").data == "/flag"
    assert config.load(bare, under={"data": None}).data == ".edgefn"  # None: not given


def test_an_empty_socket_or_worker_config_is_not_set(tmp_path: Path) -> None:
    """As README's sample pop.toml writes them; `socket = ""` had named a socket to
    wait on, and the PoP waited for it forever."""
    cfg = config.load(write(tmp_path, '[ai]\nsocket = ""\nworker_config = ""\n'))
    assert (cfg.ai.socket, cfg.ai.worker_config) == (None, None)


@pytest.mark.parametrize(("text", "field", "message"), [
    ('[ai]\nworker_config = "nope.toml"\n', "ai.worker_config", "no such file: "),
    ('[auth]\nopenai = "jwt"\n', "auth.openai", "needs an [auth.jwt] table"),
    ('[auth]\nopenai = "jwtx"\n', "auth.openai", "(expected one of: 'jwt', 'key', 'none', "
                                                   "'auto')"),
    ('[[pipeline]]\nstage = "rout"\n', "pipeline[0].stage", "'route', 'dispatch')"),
    ('[auth]\nfunctions = "jwt"\n', "auth.functions", "needs an [auth.jwt] table"),
    ('[http]\nmax_body_bytes = -1\n', "http.max_body_bytes", ">= 0"),
    ('[stores]\nkv_owner_quota_mb = -1\n', "stores.kv_owner_quota_mb", ">= 0"),
    ('[stores]\nkv_owner_quota_mb = "lots"\n', "stores.kv_owner_quota_mb", "expected `int`"),
    ('[stores]\nvectors_owner_quota_mb = -5\n', "stores.vectors_owner_quota_mb", ">= 0"),
    ('[stores]\nbinding_threads = 0\n', "stores.binding_threads", ">= 1"),
    ('[wasm]\nkeep_resident_kib = -4\n', "wasm.keep_resident_kib", ">= 0"),
    ('[wasm]\nkeep_resident_kib = 2097152\n', "wasm.keep_resident_kib", "<= 1048576"),
    ('[wasm]\nkeep_resident = 4\n', "wasm.keep_resident", "unknown field"),
    ('[wasm]\nmax_thread_memory_mb = 63\n', "wasm.max_thread_memory_mb", ">= 64"),
    ('[wasm]\nmax_thread_memory_mb = "half"\n', "wasm.max_thread_memory_mb", "auto"),
    ('[python]\nmax_frame_memory_mb = 63\n', "python.max_frame_memory_mb", ">= 64"),
    ('[python]\nmax_frame_memory_mb = "all"\n', "python.max_frame_memory_mb", "auto"),
    ('[fetch]\nprivate_hosts = ["db:99999"]\n', "fetch", "the port must be 1-65535"),
    ('[fetch]\nprivate_hosts = [""]\n', "fetch.private_hosts[0]", "length >= 1"),
    ('[http]\nmax_header_bytes = 0\n', "http.max_header_bytes", ">= 256"),
    ('[http]\nkeepalive_timeout = 0\n', "http.keepalive_timeout", "> 0"),
    ('[public]\nport = "80"\n', "public.port", "expected `int`, got `str`"),
    ("[public]\nport = 70000\n", "public.port", "expected `int` <= 65535"),
    ('tier = "planet"\n', "tier", "invalid enum value 'planet'"),
    ("colour = 1\n", "colour", "unknown field"),
    ('[http]\nmax_body = 1\n', "http.max_body", "unknown field"),
    ('[admin]\nhost = "0.0.0.0"\n', "admin.host", "loopback only"),
    ("[public]\nport = 9000\n[admin]\nport = 9000\n", "admin.port",
     "9000 is `public.port` too: the admin API needs a port of its own"),
    ('[public]\nhost = "0.0.0.0"\nport = 9000\n[admin]\nport = 9000\n', "admin.port",
     "`public.port` too"),
    ('[[pipeline]]\nstage = "wat"\n', "pipeline[0].stage", "invalid value 'wat'"),
    ('[[pipeline]]\nstage = "access_log"\nformat = "xml"\n', "pipeline[0].format",
     "invalid enum value 'xml'"),
    ('[[pipeline]]\nstage = "access_log"\nformat = "json"\nstage_timings = "no"\n',
     "pipeline[0].stage_timings", "expected `bool`"),
    ('[[pipeline]]\nstage = "dispatch"\n[[pipeline]]\nstage = "route"\n',
     "pipeline[0].stage", "needs a `route` stage before it"),
    ('[[pipeline]]\nstage = "route"\n[[pipeline]]\nstage = "route"\n', "pipeline[1].stage",
     "appears twice"),
    ('[ai.fallback]\nbig = "big"\n', "ai.fallback.big", "two different model names"),
    ('[ai.fallback]\nbig = 3\n', "ai.fallback[...]", "expected `str`"),
    ('[ai_cache]\nstale_if_error_s = -1\n', "ai_cache.stale_if_error_s", ">= 0"),
    # a name no tenant can have: its limit never applied
    ('[ratelimit.tenants."Bad Tenant"]\nrpm = 5\n', "ratelimit.tenants",
     "matching regex '^[a-z0-9][a-z0-9_-]{0,62}$' (in a key)"),
    ("name = \n", None, "not valid TOML"),
])
def test_bad_config_names_the_file_and_field(tmp_path: Path, text: str, field: str | None,
                                             message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidConfig) as err:
        config.load(path)
    assert err.value.file == str(path) and err.value.field == field
    assert message.lower() in str(err.value).lower()
    assert str(err.value).startswith(str(path))


def test_a_worker_config_that_cannot_start_is_named_by_its_file_and_field(
        tmp_path: Path) -> None:
    """The worker exited on it at every start and was restarted forever."""
    (tmp_path / "models.toml").write_text('[[models]]\nname = "m"\nengine = "llamacpp"\n'
                                          'path = "/nonexistent.gguf"\n')
    path = write(tmp_path, '[ai]\nworker_config = "models.toml"\n')
    with pytest.raises(InvalidConfig) as err:
        config.load(path)
    assert (err.value.file, err.value.field) == (str(tmp_path / "models.toml"),
                                                 "models[0].path")
    assert config.load(path, **{"ai.enabled": False}).ai.enabled is False  # no worker: no check


def test_the_admin_port_may_be_the_public_one_on_another_address(tmp_path: Path) -> None:
    cfg = config.load(write(tmp_path, '[public]\nhost = "192.0.2.1"\nport = 9000\n'
                                      "[admin]\nport = 9000\n"))
    assert (cfg.public.port, cfg.admin.port) == (9000, 9000)
    assert config.load(None, **{"public.port": 0, "admin.port": 0}).admin.port == 0  # any: two


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="cannot read: No such file"):
        config.load(tmp_path / "nope.toml")


def test_a_pipeline_without_dispatch_is_warned_about(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """README's CORS block alone replaced the whole pipeline: every path was a 404."""
    with caplog.at_level("WARNING", logger="edgefn.config"):
        config.load(write(tmp_path, '[[pipeline]]\nstage = "cors"\n'))
    assert "no `dispatch` stage, so no function is served" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgefn.config"):
        config.load(None)
    assert "dispatch" not in caplog.text
