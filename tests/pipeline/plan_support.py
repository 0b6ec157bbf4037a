"""Two PoPs with one config, one serving through per-target plans and one through
its full chain, fed the same requests: what each answered and observed."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from runtime import config as c
from runtime.functions import deploys
from runtime.net.message import Request, Response
from runtime.observe.event import Event
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context
from runtime.pop import PoP
from runtime.security.keys import KeyStore
from tests.support import function_dir, reactor

CLOCKED = [re.compile(p) for p in (r"(retry after )\d+", r'("retry-after", ")\d+',
                                   r'(;t=)\d+')]


class Seen:
    """An observer: the events a PoP handed its observers."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def observe(self, event: Event) -> None:
        self.events.append(event)


def make_keys(data: Path) -> list[str]:
    """Keys in `data`'s key file: all scopes, one function's with a 2 rpm limit, and a
    revoked one."""
    store = KeyStore(data)
    everything = store.create("t1", ("*",))[0]
    limited = store.create("t2", ("fn:f1",), rpm=2)[0]
    revoked, record = store.create("t3", ("*",))
    store.revoke(record.id)
    return [everything, limited, revoked]


class Pair:
    """`planned` serves through its plans, `full` through every stage."""

    def __init__(self, root: Path, keys: bool, **overrides: Any) -> None:
        self.root = root
        (root / "a").mkdir(parents=True)
        self.keys = make_keys(root / "a") if keys else []
        shutil.copytree(root / "a", root / "b")
        self.pops = [PoP(c.load(None, data=str(root / d), **{"ai.enabled": False, **overrides}))
                     for d in ("a", "b")]
        self.planned, self.full = self.pops
        self.full.pipeline = Chain(self.full.pipeline.stages)  # no targets: never planned
        self.seen = [Seen(), Seen()]
        for pop, seen in zip(self.pops, self.seen, strict=True):
            pop.observers.add(seen)
        self.deployed = 0

    async def deploy(self, name: str, policy: str) -> None:
        """`name` (route /name) with `policy` (edgefn.toml lines), on both."""
        self.deployed += 1
        folder = function_dir(self.root / "fns" / str(self.deployed), name, reactor(""),
                              routes=[f"/{name}"], extra=policy)
        for pop in self.pops:
            await pop.registry.deploy(deploys.pack_dir(folder))

    async def both(self, make: Any) -> tuple[Any, Any]:
        """What each PoP made of ``make()`` (a fresh request each): the response, the
        context's decisions and principal, and the events, request ids blanked."""
        return (await _served(self.planned, make(), self.seen[0]),
                await _served(self.full, make(), self.seen[1]))

    def close(self) -> None:
        for pop in self.pops:
            pop.close()


async def _served(pop: PoP, request: Request, seen: Seen) -> Any:
    ctx = Context(request.client)
    result = pop.pipeline.run(request, ctx)
    response = result if isinstance(result, Response) else await result
    body = response.body if isinstance(response.body, bytes) else \
        b"".join([chunk async for chunk in response.body])
    pop.observers.flush()
    events, seen.events = seen.events, []
    principal = ctx.principal
    out = {"status": response.status, "headers": response.headers, "body": body,
           "decisions": ctx.decisions, "bot": ctx.bot, "agent": ctx.agent,
           "principal": None if principal is None else (principal.key_id, principal.tenant),
           "target": None if ctx.target is None else ctx.target.label,
           "events": [_event(e) for e in events]}
    nonces = [v.decode() for n, v in response.headers if n == b"x-edgefn-challenge"]
    return _blank(out, [ctx.request_id.decode(), *nonces])


def _event(event: Event) -> dict[str, Any]:
    fields = {f: getattr(event, f) for f in event.__struct_fields__}
    del fields["ts"], fields["duration_ms"]  # clocks
    return fields


def _blank(value: Any, unique: list[str]) -> Any:
    """`value` as JSON, with what is one PoP's own (the request id, a challenge's
    nonce) and the WAF's own time blanked."""
    text = json.dumps(value, default=_encode, sort_keys=True)
    for i, own in enumerate(u for u in unique if u):
        text = text.replace(own, f"<own {i}>")
    for clocked in CLOCKED:  # seconds to a window's end: the two PoPs ask a µs apart
        text = clocked.sub(lambda m: m.group(1) + "<s>", text)
    data = json.loads(text)
    if "<s>" in str(data.get("body")):  # its size too: "retry after 9 s" or "10 s"
        for event in data["events"]:
            event["bytes_out"] = "<n>"
    waf = (data.get("decisions") or {}).get("waf")
    for record in [waf, *[(e.get("decisions") or {}).get("waf") for e in data["events"]]]:
        if isinstance(record, dict):
            record.pop("ms", None)
    return data


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return repr(value)
