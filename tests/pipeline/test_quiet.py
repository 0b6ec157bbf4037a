"""Quiet warm-up requests (`runtime.pipeline.warm`): each deploy sends one through the
whole pipeline, and nothing a client or an operator sees counts it; a client cannot
send one."""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.config import AccessLogStage
from runtime.functions import deploys
from runtime.functions.registry import Deployment
from runtime.net.message import Request, Response
from runtime.pipeline import warm
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.access_log import AccessLog
from runtime.security.keys import KeyStore
from tests.support import EXAMPLES, Running, pop_thread, python_function

# Counts its calls; answers how many it had, and whether the warm-up header came.
COUNTED = """\
from edgefn import Response

calls = []

def handle(request, env):
    calls.append(request.headers.get("x-edgefn-warmup", "-"))
    return Response(" ".join(calls))
"""


@pytest.fixture
def quiet_statuses(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Function label -> the status its quiet request got (so a test knows it ran)."""
    seen: dict[str, int] = {}
    real = warm.quiet_request

    async def spy(chain: Chain, fn: Deployment, pin: bool = False) -> int:
        seen[fn.label] = status = await real(chain, fn, pin)
        return status

    monkeypatch.setattr(warm, "quiet_request", spy)
    return seen


@pytest.fixture
def hello(tmp_path: Path, quiet_statuses: dict[str, int], request: pytest.FixtureRequest
          ) -> Iterator[Running]:
    """A PoP with `hello-wat` deployed (its quiet request answered 200); pop.toml
    overrides from an indirect parameter."""
    with pop_thread(tmp_path / "data", **getattr(request, "param", {})) as pop:
        pop.deploy(EXAMPLES / "hello-wat")
        assert list(quiet_statuses.values()) == [200], "the quiet request ran the function"
        yield pop


def overrides(fields: dict[str, Any]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("hello", [fields], indirect=True, ids=list(fields))


LOOPING = """(module (memory (export "memory") 1)
 (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 0))
 (func (export "edgefn_handle") (param i32 i32) (result i64) (loop $l (br $l)) (i64.const 0)))"""


def test_a_looping_pure_reactors_quiet_request_ends_at_its_slice(
        tmp_path: Path, quiet_statuses: dict[str, int]) -> None:
    """A pure reactor's quiet request cut at the inline slice ran again on a thread
    to its own limits: `edgefn deploy` took 30 s (the warm-up's timeout), the guest
    ran on after it, and a boot waited as long for each such function."""
    import time

    from tests.support import function_dir

    with pop_thread(tmp_path / "data") as pop:
        started = time.monotonic()
        pop.deploy(function_dir(tmp_path / "fns", "looping", LOOPING,
                                limits="cpu_ms = 60000\nwall_ms = 300000"))
        assert time.monotonic() - started < 5
        assert list(quiet_statuses.values()) == [503]  # cut at the slice, not run again
        fn = pop.pop.registry.functions["looping"].executor
        assert not getattr(fn, "verdict_pending", True)  # its state untouched


def test_no_event_metric_or_log_line_sees_it(hello: Running) -> None:
    hello.delivered()
    assert list(hello.pop.ring.events) == []
    metrics = hello.admin.metrics().splitlines()
    assert [m for m in metrics if m.startswith("edgefn_requests_total{")] == []
    instantiated = [m for m in metrics if m.startswith("edgefn_wasm_instantiate_seconds_count")]
    assert [m.rsplit(" ", 1)[1] for m in instantiated] == ["0.0"], instantiated
    assert hello.get("/hello")[0] == 200
    hello.delivered()
    assert [e.path for e in hello.pop.ring.events] == ["/hello"]


def test_it_takes_no_request_id(hello: Running) -> None:
    assert hello.get("/hello")[1]["x-request-id"].endswith("-1")


@overrides({"ratelimit.rules": [{"by": "ip", "limit": "2/minute"}]})
def test_it_is_not_rate_limited_or_counted(hello: Running) -> None:
    assert [hello.get("/hello")[0] for _ in range(3)] == [200, 200, 429]


@overrides({"bots.abusive_rate": "2/minute"})
def test_the_bot_manager_does_not_count_it(hello: Running) -> None:
    assert [hello.get("/hello")[0] for _ in range(3)] == [200, 200, 403]


@overrides({"http_cache.default_ttl": 60})
def test_the_http_cache_neither_stores_nor_counts_it(hello: Running) -> None:
    cache = hello.pop.http_cache
    assert cache is not None
    assert (list(cache.store.items()), hello.pop.stores.cache_stats.snapshot()) == ([], [])
    first, second = hello.get("/hello"), hello.get("/hello")
    assert (first[1]["x-edgefn-cache"], second[1]["x-edgefn-cache"]) == ("MISS", "HIT")


@overrides({"auth.functions": "key"})
def test_auth_lets_it_through_but_not_a_client_without_a_key(hello: Running) -> None:
    assert hello.get("/hello")[0] == 401


def test_a_python_function_gets_it_with_the_header_and_undeclared_ones_a_dry_one(
        tmp_path: Path, quiet_statuses: dict[str, int]) -> None:
    declared = python_function(tmp_path, "declared", COUNTED, extra='warmup = "/declared"')
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(declared)
        pop.deploy(python_function(tmp_path, "undeclared", COUNTED))
        assert sorted(quiet_statuses.values()) == [200, 204]
        # one isolate: its executor warm-up, then the quiet request, then the client
        assert pop.get("/declared")[2] == b"1 1 -"
        assert pop.get("/undeclared")[2] == b"-"  # the dry request never reached it


def test_a_canary_gets_its_own_quiet_request(tmp_path: Path,
                                            quiet_statuses: dict[str, int]) -> None:
    with pop_thread(tmp_path / "data") as pop:
        v1 = pop.deploy(python_function(tmp_path / "v1", "c", COUNTED, extra='warmup = "/c"'))
        v2 = pop.admin.request("POST", "/v1/stage", deploys.to_tar(deploys.pack_dir(
            python_function(tmp_path / "v2", "c", COUNTED + "# v2\n", extra='warmup = "/c"'))))
        pop.admin.request("POST", "/v1/functions/c/activate",
                          f'{{"version": "{v2['version']}", "canary": 10}}'.encode())
        # each version's quiet request reached that version: the canary's is pinned to
        # it (the router would send most keys, this one's too, to the live version)
        assert quiet_statuses == {f"c@{v1['version']}": 200, f"c@{v2['version']}": 200}
        canary = pop.pop.registry.canaries["c"].fn.executor
        live = pop.pop.registry.functions["c"].executor
        assert _served(canary) == _served(live) == 2  # executor warm-up + quiet request


# Answers the bot class of each call's caller: "-" for none (the executor's warm-up).
CLASSES = """\
from edgefn import Response

seen = []

def handle(request, env):
    seen.append(request.bot or "-")
    return Response(" ".join(seen))
"""


def test_the_function_gets_the_caller_a_client_of_its_class_gets_made_once(
        tmp_path: Path, quiet_statuses: dict[str, int]) -> None:
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(python_function(tmp_path, "classes", CLASSES, extra='warmup = "/classes"'))
        assert list(quiet_statuses.values()) == [200]
        dispatch = next(s for s in pop.pop.pipeline.stages if s.name == "dispatch")
        # the quiet request carries no credential: its caller is that of an anonymous
        # client of its bot class, encoded once and then found by that client
        assert [(k, dict(c)) for k, c in dispatch.callers.items()] == [
            ((None, "automation", None), {"bot": "automation"})]
        made = next(iter(dispatch.callers.values()))
        # executor warm-up (no caller), quiet request, client: the same principal section
        assert pop.get("/classes")[2] == b"- automation automation"
        assert list(dispatch.callers.values()) == [made]
        assert next(iter(dispatch.callers.values())) is made


def test_a_public_function_s_quiet_request_takes_a_client_s_way_through_auth(
        hello: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """While no key exists no credential proves anyone, so a client's plan and a
    quiet request's skip `auth` (`runtime.pipeline.plan`); once one does, both look
    for a credential, and the quiet request proves nobody."""
    auth = next(s for s in hello.pop.pipeline.stages if s.name == "auth")
    scanned: list[object] = []
    real = auth._optional

    def spy(request: Request) -> Any:
        scanned.append(principal := real(request))
        return principal

    monkeypatch.setattr(auth, "_optional", spy)
    assert hello.loop is not None

    def warm() -> None:
        asyncio.run_coroutine_threadsafe(hello.pop.warm(hello.pop.registry.functions["hello"]),
                                         hello.loop).result(30)

    warm()
    assert hello.get("/hello", headers={"authorization": "Bearer efn_x_y"})[0] == 200
    assert scanned == []
    KeyStore(hello.data).create("t1", ("*",))
    hello.pop.keys.reload()  # as `edgefn keys create` asks the PoP to
    warm()
    assert scanned == [None]  # the path a client without a key takes, run
    hello.delivered()
    assert [e.path for e in hello.pop.ring.events] == ["/hello"]  # the client's alone


def _served(executor: Any) -> int:
    """Jobs the single isolate of a Python executor ran."""
    return sum(i.uses for i in executor.pool.scheduler.isolates)


def test_a_client_cannot_send_the_warm_up_header(hello: Running) -> None:
    with socket.create_connection((hello.host, hello.port), timeout=10) as s:
        s.sendall(b"GET /hello HTTP/1.1\r\nhost: x\r\nx-edgefn-warmup: 1\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"header x-edgefn-warmup is reserved" in answer
    hello.delivered()
    assert list(hello.pop.ring.events) == []  # refused before the pipeline: nothing ran


def test_the_access_log_stage_writes_no_line_for_it() -> None:
    stream = io.BytesIO()
    log = AccessLog(AccessLogStage(), stream)

    def handler(request: Request, ctx: Context, call_next: Any) -> Response:
        return Response(200, [], b"ok")

    chain = Chain([log, _Named(handler)])
    request = Request(b"GET", b"/x", b"", [], b"h", "1.1", True, "127.0.0.1:1")
    quiet = Context("127.0.0.1:1")
    quiet.quiet = True
    chain.run(request, quiet)
    log.flush()
    assert stream.getvalue() == b""
    chain(request)
    log.flush()
    assert b"path=/x status=200" in stream.getvalue()


class _Named:
    name = "answer"

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, request: Request, ctx: Context, call_next: Any) -> Any:
        return self.fn(request, ctx, call_next)
