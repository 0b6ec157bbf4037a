"""The canary split without sockets: the key a request is split by, the share of
keys a threshold takes, and bad shares."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgefn_core.errors import InvalidConfig
from runtime.functions import canary
from runtime.net.message import Request
from runtime.pipeline.stage import Context
from tests.support import ROOT


def request(headers: list[tuple[bytes, bytes]], client: str = "10.0.0.7:5123") -> Request:
    return Request(b"GET", b"/f", b"", headers, b"h", "1.1", True, client)


def context(client: str, request_id: bytes = b"rid-1") -> Context:
    ctx = Context(client)
    ctx.request_id = request_id
    return ctx


def test_the_key_is_the_header_else_the_client_address_else_the_request_id() -> None:
    assert canary.key_of(request([(canary.HEADER, b"user-42")]), context("10.0.0.7:1")) \
        == b"user-42"
    assert canary.key_of(request([]), context("10.0.0.7:5123")) == b"10.0.0.7"
    assert canary.key_of(request([]), context("", b"rid-9")) == b"rid-9"


def test_the_client_port_does_not_change_the_bucket() -> None:
    """Sticky across connections: a new connection has a new port, not a new key."""
    a = canary.key_of(request([]), context("192.0.2.1:40000"))
    b = canary.key_of(request([]), context("192.0.2.1:40001"))
    assert canary.bucket(a) == canary.bucket(b)


@pytest.mark.parametrize("percent", [1.0, 10.0, 50.0])
def test_a_threshold_takes_its_share_of_keys(percent: float) -> None:
    split = canary.Split(None, percent)  # type: ignore[arg-type]
    keys = [f"key-{i}".encode() for i in range(20_000)]
    share = sum(canary.bucket(k) < split.threshold for k in keys) / len(keys) * 100
    assert abs(share - percent) < 0.6


def test_another_process_puts_a_key_in_the_same_bucket() -> None:
    """No per-process seed (as `hash()` has): every PoP splits a key the same way."""
    keys = [b"a", b"user-42", b"10.0.0.7"]
    code = ("from runtime.functions.canary import bucket; "
            f"print([bucket(k) for k in {keys!r}])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "12345",
                                                    "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == str([canary.bucket(k) for k in keys])


@pytest.mark.parametrize(("text", "value"), [("10%", 10.0), ("2.5%", 2.5), ("10", 10.0),
                                             (" 99.99% ", 99.99), ("0.01", 0.01)])
def test_a_percentage_parses(text: str, value: float) -> None:
    assert canary.parse_percent(text) == value


@pytest.mark.parametrize(("text", "why"), [
    ("0%", "strictly between 0% and 100%"), ("100%", "strictly between 0% and 100%"),
    ("150%", "got 150%"), ("-5%", "got -5%"), ("abc", "such as 10%, got 'abc'"),
    ("nan", "got 'nan'"), ("", "got ''"),
    # shares finer than a bucket: 0.001% took no key, 99.996% every key
    ("0.001%", "(a share is kept to 0.01%), got 0.001%, which rounds to 0%: no request key"),
    ("99.996", "got 99.996%, which rounds to 100%: every request key would get the canary"),
])
def test_a_bad_percentage_is_refused(text: str, why: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        canary.parse_percent(text)
    assert str(err.value).startswith("--canary: field `canary`: expected")
    assert why in str(err.value)


@pytest.mark.parametrize(("percent", "ok"), [(0.004, False), (0.01, True), (99.99, True),
                                             (99.996, False)])
def test_a_share_takes_some_buckets_but_not_all(percent: float, ok: bool) -> None:
    """What an activate checks (the admin API's canary share): a share it accepts
    takes at least one bucket and leaves at least one."""
    if ok:
        split = canary.Split(None, canary.check_percent(percent))  # type: ignore[arg-type]
        assert 0 < split.threshold < canary.BUCKETS
    else:
        with pytest.raises(InvalidConfig, match=r"a share is kept to 0\.01%"):
            canary.check_percent(percent)
