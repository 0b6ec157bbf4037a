"""A function that asks for a credential on the native lane (lane.c `guarded`;
runtime/pipeline/lane.py `_guarded_routes`, `_guard`; `Auth.anonymous_refusal`): two
real PoPs on loopback, the lane on and off, the same functions (``auth = "key"`` and
``"jwt"``, one whose ``[bots]`` blocks automation; no ``[auth.jwt]``), the same requests. A request
without a credential is auth's 401, written by the lane as the stages answer it (the
challenge, its event's ``auth`` record and error, the metrics' auth failures); one with
a credential, any, is Python's, where auth proves it (or not)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.net.test_native_lane import Side, lane_pair, request
from tests.net.test_native_lane_ratelimit import BROWSER, sent, served
from tests.support import function_dir, reactor

PORTS = {"auto": 28030, "off": 28031}
FUNCTIONS = {"keyed": 'auth = "key"\n', "tokened": 'auth = "jwt"\n',
             "keyedbots": 'auth = "key"\n[bots]\nautomation = "block"\n'}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    root = tmp_path_factory.mktemp("guarded")
    folders = [function_dir(root / "fns", name, reactor(""), extra=extra)
               for name, extra in FUNCTIONS.items()]
    # no [auth.jwt]: a credential that is no edgefn key passes the lane's head checks
    # (where auth's mode is none it is the function's), so `guarded` is what leaves it
    with lane_pair(root, PORTS, folders) as sides:
        yield sides


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("method", ["GET", "HEAD", "POST"])
def test_a_request_without_a_credential_is_the_lanes_401(pair: tuple[Side, Side], name: str,
                                                         method: str) -> None:
    """Auth's 401 with its challenge, as the Python PoP answers it (a browser's: bots
    lets its class on), and its event and log line; the metrics' counts the same."""
    on, off = pair
    before = served(on)
    got = sent(pair, request(method, f"/{name}", BROWSER, b"x" if method == "POST" else b""),
               method.encode())
    assert got.split(b" ", 2)[1] == b"401" and served(on) - before == 1
    assert b"\r\nwww-authenticate: Bearer" in got and b"x-edgefn-error: unauthorized" in got
    assert on.metrics() == off.metrics()


@pytest.mark.parametrize("credential", [("Authorization", "Bearer efn_nope_nope"),
                                        ("x-api-key", "efn_nope_nope"),
                                        ("Authorization", "Basic dXNlcjpwYXNz"),
                                        ("Authorization", "Bearer not.a.jwt")])
def test_a_request_with_a_credential_is_pythons(pair: tuple[Side, Side],
                                                credential: tuple[str, str]) -> None:
    """Any credential, well formed or not: auth's to prove, in Python (its 401s say
    why), never the lane's."""
    on, _ = pair
    for name in FUNCTIONS:
        before = served(on)
        got = sent(pair, request("GET", f"/{name}", [*BROWSER, credential]))
        assert got.split(b" ", 2)[1] == b"401" and served(on) == before


def test_bots_answers_before_auth(pair: tuple[Side, Side]) -> None:
    """A class the function blocks is bots' 403, first (the lane's too); one it
    lets on, without a credential, is auth's 401."""
    on, off = pair
    curl = [("Host", "x"), ("User-Agent", "curl/8")]
    for headers, status in ((curl, b"403"), (BROWSER, b"401")):
        before = served(on)
        got = sent(pair, request("GET", "/keyedbots", headers))
        assert got.split(b" ", 2)[1] == status and served(on) - before == 1
    assert on.metrics() == off.metrics()


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    """The pair with a PoP rule by ip, which counts auth's refusals (`on_refused`)."""
    root = tmp_path_factory.mktemp("guarded_counted")
    folders = [function_dir(root / "fns", "keyed", reactor(""), extra=FUNCTIONS["keyed"])]
    with lane_pair(root, COUNTED_PORTS, folders,
                   **{"ratelimit.rules": [{"by": "ip", "limit": f"{RULE}/minute"}]}) as sides:
        yield sides


COUNTED_PORTS = {"auto": 28032, "off": 28033}
RULE = 3


def test_refusals_a_pop_rule_counts_are_the_lanes_then_its_429(
        counted: tuple[Side, Side]) -> None:
    """With a PoP rule by ip, auth's refusals count against it (a credential-guessing
    flood meets its 429): the lane asks the stage (`_guard_refusal`), which counts
    each; up to the rule's limit the 401, past it the 429 (Retry-After, the RateLimit
    fields, auth's and ratelimit's records), all the lane's, with the Python PoP's
    bytes, events, lines and counts."""
    on, off = counted
    statuses = []
    for _ in range(RULE + 2):
        before = served(on)
        got = sent(counted, request("GET", "/keyed", BROWSER))
        assert served(on) - before == 1
        statuses.append(got.split(b" ", 2)[1])
    assert statuses == [b"401"] * RULE + [b"429"] * 2
    assert on.metrics() == off.metrics()
