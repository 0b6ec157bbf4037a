"""`edgefn tail` (follow a running PoP's events live, like ``wrangler tail``) and
`edgefn events` (query its ring of recent events), through the admin API.

One line per event by default:

    12:00:01.234 200 GET /hello hello@1a2b3c4d 0.41ms cache=hit waf=pass rl=ok
    12:00:02.001 200 POST /v1/chat/completions openai 812.3ms ai=smollm2-135m 12+40tok ttft=95ms
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any
from urllib.parse import urlencode


def tail_command(args: argparse.Namespace) -> None:
    """Follow until Ctrl-C (the CLI exits 130 without a traceback). Raises
    `AdminError` for a bad filter, `Failure` when no PoP runs on ``--data`` or when
    the PoP ends the stream (it stopped)."""
    from runtime.admin.client import AdminClient

    client = AdminClient(args.data)
    dropped = False
    for raw in client.stream("/v1/events/stream" + _query(args)):
        line = raw.rstrip(b"\r\n")
        if line == b"event: dropped":
            dropped = True
        elif line.startswith(b"data: "):
            data = json.loads(line[6:])
            if dropped:
                print(f"... {data['dropped']} events dropped (this terminal is too slow)",
                      file=sys.stderr, flush=True)
                dropped = False
            else:
                print(json.dumps(data) if args.json else format_event(data), flush=True)
    # the stream ended without Ctrl-C: the PoP stopped (it exited 0, saying nothing)
    from edgefn_core.errors import Failure

    raise Failure("stream_ended", 503, "the PoP closed the event stream (it stopped or "
                  "restarted); run `edgefn tail` again once it runs")


def events_command(args: argparse.Namespace) -> None:
    """Raises `AdminError` for a bad filter, `Failure` when no PoP runs on ``--data``."""
    from runtime.admin.client import AdminClient

    params = _query(args, since=args.since, limit=str(args.limit))
    events = AdminClient(args.data, timeout=30).request("GET", "/v1/events" + params)["events"]
    for e in events:
        print(json.dumps(e) if args.json else format_event(e))


def format_event(e: dict[str, Any]) -> str:
    """One readable line: time, status, method, path, target, duration, then what
    the stages decided and the AI call's tokens."""
    ts = e["ts"]
    stamp = time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"
    parts = [stamp, str(e["status"]), e["method"], e["path"], e.get("target") or "-",
             f"{e.get('duration_ms', 0.0):.2f}ms"]
    parts += _outcomes(e.get("decisions") or {})
    ai = e.get("ai")
    if ai:
        parts.append(f"ai={ai['model']} {ai.get('prompt_tokens', 0)}+"
                     f"{ai.get('completion_tokens', 0)}tok")
        if ai.get("cached_tokens"):
            parts.append(f"cached={ai['cached_tokens']}")
        if ai.get("ttft_ms") is not None:
            parts.append(f"ttft={ai['ttft_ms']:.0f}ms")
    if e.get("error"):
        parts.append(f"error={e['error']}")
    return " ".join(parts)


def _outcomes(d: dict[str, Any]) -> list[str]:
    """``cache=HIT``, ``ai_cache=hit-exact``, ``waf=blocked:942100``, ``rl=limited:per_ip``,
    ``auth=invalid_key``: the stages' decisions worth a glance."""
    out = []
    for stage, label in (("http_cache", "cache"), ("ai_cache", "ai_cache")):
        if isinstance(r := d.get(stage), dict) and r.get("outcome"):
            out.append(f"{label}={r['outcome']}")
    if isinstance(r := d.get("waf"), dict) and r.get("rules"):
        rules = ",".join(str(x) for x in r["rules"][:3])
        out.append(f"waf={'blocked' if r.get('blocked') else 'matched'}:{rules}")
    if isinstance(r := d.get("ratelimit"), dict) and r.get("limited"):
        out.append(f"rl=limited:{r['limited']}")
    if isinstance(r := d.get("auth"), dict) and r.get("result") not in (None, "ok"):
        out.append(f"auth={r['result']}")
    return out


def _query(args: argparse.Namespace, **extra: str | None) -> str:
    given = {"function": args.function, "status": args.status, "tenant": args.tenant,
             "path": args.path, **extra}
    params = {k: v for k, v in given.items() if v}
    return "?" + urlencode(params) if params else ""
