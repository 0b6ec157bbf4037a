"""``[ai_cache]`` in pop.toml and a request's cache headers: bad values are
`InvalidConfig` / a 400 naming the field or header (a function's ``[cache.ai]``
cases are folders under tests/manifest_cases/cache-ai-*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import ApiError, InvalidConfig
from runtime import config
from runtime.cache.ai import control, guards
from runtime.cache.ai.cache import AICache
from runtime.cache.settings import AICacheOverride, AICacheSettings
from runtime.net.message import Request


@pytest.mark.parametrize(("text", "field", "message"), [
    ("threshold = 1.01", "ai_cache.threshold", "<= 1.0"),
    ("threshold = 0", "ai_cache.threshold", "> 0.0"),
    ('threshold = "high"', "ai_cache.threshold", "expected `float | null`, got `str`"),
    ("ttl_seconds = 0", "ai_cache.ttl_seconds", "> 0.0"),
    ("ttl_seconds = -5", "ai_cache.ttl_seconds", "> 0.0"),
    ("max_entries_per_scope = 0", "ai_cache.max_entries_per_scope", ">= 1"),
    ("max_scopes = 0", "ai_cache.max_scopes", ">= 1"),
    ('embedding_model = ""', "ai_cache.embedding_model", "length >= 1"),
    ('semantic = "yes"', "ai_cache.semantic", "expected `bool`"),
    ("max_entries = 3", "ai_cache.max_entries", "unknown field"),
])
def test_bad_ai_cache_settings_name_the_field(tmp_path: Path, text: str, field: str,
                                              message: str) -> None:
    path = tmp_path / "pop.toml"
    path.write_text(f"[ai_cache]\n{text}\n")
    with pytest.raises(InvalidConfig) as err:
        config.load(path)
    assert err.value.field == field and message in str(err.value)


def test_settings_load_and_merge_with_a_functions_override(tmp_path: Path) -> None:
    path = tmp_path / "pop.toml"
    path.write_text("[ai_cache]\nthreshold = 0.95\nttl_seconds = 60\nsemantic = false\n")
    s = config.load(path).ai_cache
    assert (s.threshold, s.ttl_seconds, s.semantic, s.deterministic_only) == (0.95, 60, False,
                                                                              True)
    cache = AICache(s, None)
    p = cache.policy(AICacheOverride(semantic=True, ttl_seconds=5))
    assert (p.threshold, p.ttl, p.semantic, p.enabled) == (0.95, 5, True, True)
    assert AICache(AICacheSettings(), None).policy().threshold == guards.DEFAULT_THRESHOLD


def request(*headers: tuple[bytes, bytes]) -> Request:
    return Request(b"POST", b"/v1/chat/completions", b"", list(headers), b"h", "1.1", True,
                   "1.2.3.4:5")


@pytest.mark.parametrize(("headers", "wishes"), [
    ((), control.Wishes(True, True, None)),
    (((b"cache-control", b"no-cache"),), control.Wishes(False, True, None)),
    (((b"cache-control", b"max-age=0, No-Store"),), control.Wishes(False, False, None)),
    (((b"x-edgefn-cache", b"Bypass"),), control.Wishes(False, True, None)),
    (((b"x-edgefn-cache-ttl", b"30"),), control.Wishes(True, True, 30.0)),
    (((b"x-edgefn-cache-ttl", b" 0.5 "), (b"cache-control", b"public")),
     control.Wishes(True, True, 0.5)),
])
def test_request_headers_say_what_the_cache_may_do(headers: tuple[tuple[bytes, bytes], ...],
                                                   wishes: control.Wishes) -> None:
    assert control.wishes(request(*headers)) == wishes


@pytest.mark.parametrize(("name", "value"), [
    (b"x-edgefn-cache-ttl", b"abc"), (b"x-edgefn-cache-ttl", b"0"),
    (b"x-edgefn-cache-ttl", b"-1"), (b"x-edgefn-cache-ttl", b"nan"),
    (b"x-edgefn-cache-ttl", b"inf"), (b"x-edgefn-cache-ttl", b"31536001"),
    (b"x-edgefn-cache-ttl", b""), (b"x-edgefn-cache-ttl", b"\xff"),
    (b"x-edgefn-cache", b"hit-exact"), (b"x-edgefn-cache", b""),
])
def test_a_bad_cache_header_is_a_400_naming_it(name: bytes, value: bytes) -> None:
    with pytest.raises(ApiError) as err:
        control.wishes(request((name, value)))
    assert err.value.status == 400 and err.value.param == name.decode()
    assert name.decode() in str(err.value)
