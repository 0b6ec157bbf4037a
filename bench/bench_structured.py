"""Structured output and tool calls through a real PoP and the real 135M chat
model, driven with the official `openai` client over loopback:

- the share of ``json_schema`` answers that parse and validate (`jsonschema`),
  over bench/data/structured_schemas.json (20 schemas x 5 prompts);
- the share of tool calls that are well formed, name a tool and whose arguments
  validate against its parameters, streamed (deltas reassembled) and not;
- completion tokens/s with a grammar (json_object) against plain text on the
  same prompts, in the same run (the ratio is the grammar's cost).

    .venv/bin/python bench/bench_structured.py [--quick] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jsonschema
import openai

from tests.support import pop_thread

CHAT = "smollm2-135m"
DATA = Path(__file__).resolve().parent / "data" / "structured_schemas.json"
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 30},
         "unit": {"enum": ["celsius", "fahrenheit"]}},
         "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "kv_get", "description": "Read a stored value",
     "parameters": {"type": "object", "properties": {"key": {"type": "string", "maxLength": 20}},
                    "required": ["key"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
     "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                     "b": {"type": "number"}},
                    "required": ["a", "b"], "additionalProperties": False}}},
]
ASKS = ["What is the weather in Oslo?", "Look up the value stored under 'greeting'.",
        "What is 2 plus 40?", "Is it raining in Lima, in fahrenheit?", "Read key 'motd'."]


def valid_json(text: str | None, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text or ""), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def structured(c: openai.OpenAI, case: tuple[dict[str, Any], str], max_tokens: int) -> bool:
    spec, prompt = case
    kw: dict[str, Any] = dict(
        model=CHAT, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, response_format={"type": "json_schema", "json_schema": {**spec,
                                                                                "strict": True}})
    r = c.chat.completions.create(**kw)
    return valid_json(r.choices[0].message.content, spec["schema"])


def calls_valid(calls: list[dict[str, Any]]) -> bool:
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    return bool(calls) and all(c["name"] in params and valid_json(c["arguments"], params[c["name"]])
                               for c in calls)


def tool_call(c: openai.OpenAI, ask: str, stream: bool, max_tokens: int) -> bool:
    kw: dict[str, Any] = dict(model=CHAT, messages=[{"role": "user", "content": ask}],
                              tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                              max_tokens=max_tokens, temperature=0)
    if not stream:
        msg = c.chat.completions.create(**kw).choices[0].message
        return calls_valid([{"name": t.function.name, "arguments": t.function.arguments}
                            for t in msg.tool_calls or []])
    calls: dict[int, dict[str, Any]] = {}
    for chunk in c.chat.completions.create(**kw, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += (d.function.name or "") if d.function else ""
            call["arguments"] += (d.function.arguments or "") if d.function else ""
    return calls_valid(list(calls.values()))


def rate(results: list[bool]) -> str:
    return f"{sum(results)}/{len(results)} = {100 * sum(results) / len(results):.1f} %"


def throughput(c: openai.OpenAI, prompts: list[str], fmt: dict[str, Any] | None,
               max_tokens: int) -> float:
    tokens, started = 0, time.perf_counter()
    for p in prompts:
        kw: dict[str, Any] = dict(model=CHAT, messages=[{"role": "user", "content": p}],
                                  max_tokens=max_tokens, temperature=0)
        if fmt:
            kw["response_format"] = fmt
        r = c.chat.completions.create(**kw)
        assert r.usage is not None
        tokens += r.usage.completion_tokens
    return tokens / (time.perf_counter() - started)


def main(quick: bool, max_tokens: int, parallel: int) -> None:
    data = json.loads(DATA.read_text())
    schemas, prompts = data["schemas"], data["prompts"]
    if quick:
        schemas, prompts = schemas[:5], prompts[:2]
    with pop_thread(Path(tempfile.mkdtemp()), ai=True) as pop:
        c = openai.OpenAI(base_url=f"http://{pop.host}:{pop.port}/v1", api_key="-",
                          max_retries=0, timeout=600)
        with ThreadPoolExecutor(parallel) as pool:
            cases = [(s, p) for s in schemas for p in prompts]
            ok = list(pool.map(lambda case: structured(c, case, max_tokens), cases))
            print(f"json_schema parse+validate: {rate(ok)} "
                  f"({len(schemas)} schemas x {len(prompts)} prompts)")
            asks = ASKS[:2] if quick else ASKS
            for stream in (False, True):
                ok = list(pool.map(lambda a, s=stream: tool_call(c, a, s, 96), asks))
                print(f"tool calls valid ({'streamed' if stream else 'whole'}): {rate(ok)}")
        texts = prompts[:2] if quick else prompts
        plain = throughput(c, texts, None, 48)
        grammar = throughput(c, texts, {"type": "json_object"}, 48)
        print(f"tokens/s plain (baseline): {plain:.1f}")
        print(f"tokens/s json_object grammar: {grammar:.1f} (ratio {grammar / plain:.2f})")
        c.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--parallel", type=int, default=4, help="requests in flight at once")
    args = ap.parse_args()
    main(args.quick, args.max_tokens, args.parallel)
