"""The `waf` stage without sockets: a plain Request and Context through the
stage, with the real engine and CRS, over a router with one function."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgefn_core.errors import EdgefnError, FunctionError, InvalidConfig, Rejected
from runtime.ai.openai_api import OpenAITarget
from runtime.functions.manifest import Route
from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.waf import Waf
from runtime.pipeline.targets import Targets
from runtime.security.settings import TargetPolicy, WafOverride, WafSettings

SQLI = b"q=1%27%20OR%20%271%27%3D%271"
CLEAN = b"q=running%20shoes"


class Function:
    """A function target as the registry's deployments are one."""

    label, kind, name, tenant = "shop@v1", "function", "shop", None

    def __init__(self, waf: WafOverride | None) -> None:
        self.policy = TargetPolicy(waf=waf)

    def error_response(self, err: EdgefnError) -> Response:
        return Response(err.status)

    def crashed(self, exc: Exception) -> EdgefnError:
        return FunctionError("crash", 502, repr(exc))


def stage(pop: WafSettings, fn: WafOverride | None = None) -> Waf:
    router = Router([(Route("/shop"), "shop", Function(fn))])
    targets = Targets(SimpleNamespace(router=router, canaries={}),  # type: ignore[arg-type]
                      {b"/v1/chat/completions": OpenAITarget()})
    return Waf(pop, targets)


def request(path: bytes, query: bytes = b"", body: bytes = b"",
            content_type: bytes = b"application/json") -> Request:
    headers = [(b"host", b"example.com"), (b"user-agent", b"curl/8.5.0"), (b"accept", b"*/*")]
    if body:
        headers += [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    r = Request(b"POST" if body else b"GET", path, query, headers, b"example.com", "1.1", True,
                "192.0.2.7:50000")
    r.body = body
    return r


def ok(req: Request, ctx: Context) -> Response:
    return Response(200, [], b"served")


def call(waf: Waf, req: Request) -> tuple[Response, Context]:
    ctx = Context(req.client)
    ctx.request_id = b"req-1"
    result: Any = waf(req, ctx, ok)
    if not isinstance(result, Response):
        result = asyncio.run(_wait(result))
    return result, ctx


async def _wait(result: Awaitable[Response]) -> Response:
    return await result


def test_off_goes_on_at_once_and_builds_nothing() -> None:
    waf = stage(WafSettings(mode="off"))
    ctx = Context("192.0.2.7:50000")
    result = waf(request(b"/shop", SQLI), ctx, ok)
    assert type(result) is Response and result.body == b"served"
    assert ctx.decisions is None and waf.engines._built == {}


def test_detect_records_and_passes() -> None:
    waf = stage(WafSettings(mode="detect"))
    response, ctx = call(waf, request(b"/shop", SQLI))
    assert response.body == b"served"
    record = ctx.decisions["waf"]  # type: ignore[index]
    assert {k: record[k] for k in ("mode", "rules", "score", "blocked", "would_block")} == {
        "mode": "detect", "rules": [942100, 949110], "score": 5, "blocked": False,
        "would_block": True}
    assert 0 < record["ms"] < 100


def test_block_refuses_with_request_id_and_rules() -> None:
    waf = stage(WafSettings(mode="block"))
    ctx = Context("192.0.2.7:50000")
    ctx.request_id = b"req-9"
    with pytest.raises(Rejected) as e:
        waf(request(b"/shop", SQLI), ctx, ok)
    assert (e.value.code, e.value.status) == ("waf_blocked", 403)
    assert e.value.detail == {"request_id": "req-9", "rules": [942100, 949110]}
    assert ctx.decisions["waf"]["blocked"] is True  # type: ignore[index]
    response, ctx = call(waf, request(b"/shop", CLEAN))
    assert response.body == b"served"
    assert ctx.decisions["waf"]["rules"] == [] and not ctx.decisions["waf"]["blocked"]  # type: ignore[index]


def test_a_function_turns_it_on_and_its_engine_is_built_once() -> None:
    waf = stage(WafSettings(mode="off"), WafOverride(mode="block"))
    first: Any = waf(request(b"/shop", CLEAN), Context("192.0.2.7:1"), ok)
    assert not isinstance(first, Response)  # compiled in a worker thread, this once
    assert asyncio.run(_wait(first)).body == b"served"
    with pytest.raises(Rejected):  # now synchronous: the engine is kept
        waf(request(b"/shop", SQLI), Context("192.0.2.7:1"), ok)
    assert len(waf.engines._built) == 1
    response, ctx = call(waf, request(b"/elsewhere", SQLI))  # the PoP's setting: off
    assert response.body == b"served" and ctx.decisions is None


def test_function_exclusions_merge_over_the_pops_settings() -> None:
    waf = stage(WafSettings(mode="block"), WafOverride(exclude_rules=[942100]))
    response, ctx = call(waf, request(b"/shop", SQLI))
    assert response.body == b"served" and ctx.decisions["waf"]["mode"] == "block"  # type: ignore[index]
    with pytest.raises(Rejected):
        call(waf, request(b"/elsewhere", SQLI))


def test_detect_in_a_function_over_a_blocking_pop() -> None:
    waf = stage(WafSettings(mode="block"), WafOverride(mode="detect"))
    response, ctx = call(waf, request(b"/shop", SQLI))
    assert response.body == b"served" and ctx.decisions["waf"]["would_block"] is True  # type: ignore[index]


def test_the_openai_api_uses_the_pops_settings_without_its_prompts() -> None:
    waf = stage(WafSettings(mode="block"))
    prompt = (b'{"model": "m", "messages": [{"role": "user", "content": '
              b'"SELECT name FROM users WHERE id = 1 OR 1=1; -- why is this slow?"}]}')
    response, _ = call(waf, request(b"/v1/chat/completions", body=prompt))
    assert response.body == b"served"
    with pytest.raises(Rejected):  # the same text, sent to a function
        call(waf, request(b"/shop", body=prompt))
    with pytest.raises(Rejected):  # the OpenAI API's other fields are inspected
        call(waf, request(b"/v1/chat/completions",
                          body=b'{"model": "x\' UNION SELECT password FROM users--"}'))


def test_block_without_rules_refuses_to_start(tmp_path: Path) -> None:
    settings = WafSettings(mode="block", crs_rules=str(tmp_path))
    with pytest.raises(InvalidConfig) as e:
        stage(settings)
    assert e.value.field == "waf.mode" and str(tmp_path) in str(e.value)


def test_detect_without_rules_records_the_error(tmp_path: Path) -> None:
    waf = stage(WafSettings(mode="detect", crs_rules=str(tmp_path)),
                WafOverride(mode="block"))
    response, ctx = call(waf, request(b"/elsewhere", SQLI))
    assert response.body == b"served" and "no CRS rules" in ctx.decisions["waf"]["error"]  # type: ignore[index]
    with pytest.raises(Rejected) as e:  # a function that asks to block fails closed
        call(waf, request(b"/shop", SQLI))
    assert (e.value.code, e.value.status) == ("waf_unavailable", 503)
