"""Load generation for the benchmark: drive ``wrk`` and parse what it prints.

``run()`` gives throughput and latency percentiles under load;
``latency_probe()`` times sequential requests on one keep-alive connection
(first request after a deploy versus warm ones).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = "wrk not found; install it with: apt-get install -y wrk"

_TIME_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}

_PERCENTILE = re.compile(r"^\s*(\d+(?:\.\d+)?)%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.M)
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)([kKMG]?)\s*$", re.M)
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")


def _ms(value: str, unit: str) -> float:
    """A wrk duration such as ``1.23`` ``ms`` in milliseconds."""
    return float(value) * _TIME_UNITS[unit]


def _number(value: str, suffix: str) -> float:
    """A wrk count such as ``25.3`` ``k`` as a plain number."""
    return float(value) * _SCALE[suffix]


def percentiles(output: str) -> dict[float, float]:
    """Latency distribution lines (``--latency``) as {percent: milliseconds}."""
    return {float(p): _ms(v, u) for p, v, u in _PERCENTILE.findall(output)}


def errors(output: str) -> int:
    """Non-2xx/3xx responses plus socket errors (connect/read/write/timeout)."""
    total = sum(int(n) for n in _NON_2XX.findall(output))
    for match in _SOCKET_ERRORS.findall(output):
        total += sum(int(n) for n in match)
    return total


def parse(output: str) -> dict:
    """wrk ``--latency`` output as {"rps", "p50_ms", "p99_ms", "errors"}.

    Raises ValueError if the requests/sec line or the 50%/99% lines are missing.
    """
    rps = _RPS.search(output)
    dist = percentiles(output)
    if rps is None or 50.0 not in dist or 99.0 not in dist:
        raise ValueError("unrecognised wrk output")
    return {
        "rps": _number(*rps.groups()),
        "p50_ms": dist[50.0],
        "p99_ms": dist[99.0],
        "errors": errors(output),
        "non_2xx": sum(int(n) for n in _NON_2XX.findall(output)),
    }


_AB_RPS = re.compile(r"^Requests per second:\s+([\d.]+)", re.M)
_AB_FAILED = re.compile(r"^(?:Failed requests|Non-2xx responses):\s+(\d+)", re.M)


def ab_run(url: str, seconds: int = 5, connections: int = 32,
           headers: dict[str, str] | None = None, keep_alive: bool = True) -> dict:
    """Load ``url`` with ApacheBench kept alive (``ab -k``: HTTP/1.0 with ``Connection:
    Keep-Alive``; without `keep_alive`, plain ``ab``: a connection a request) for
    `seconds`; returns {"rps", "errors"}. Raises RuntimeError if ab is missing
    (naming ``apt-get install -y apache2-utils``), exits non-zero, hangs or prints
    something unparseable."""
    ab = shutil.which("ab")
    if ab is None:
        raise RuntimeError("ab not found; install it with: apt-get install -y apache2-utils")
    # -n after -t: -t alone caps the run at 50000 requests
    cmd = [ab, *(["-k"] if keep_alive else []), "-q", f"-c{connections}", f"-t{seconds}",
           "-n", "100000000"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]
    cmd.append(url)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"ab hung: {' '.join(cmd)}") from None
    output = proc.stdout + proc.stderr
    rps = _AB_RPS.search(output)
    if proc.returncode != 0 or rps is None:
        raise RuntimeError(f"ab failed ({proc.returncode}): {' '.join(cmd)}\n{output}")
    return {"rps": float(rps.group(1)),
            "errors": sum(int(n) for n in _AB_FAILED.findall(output))}


SPLIT_BODY = '{"prompt":"hello there","max_tokens":8}'  # 39 bytes of JSON


def split_run(url: str, seconds: int = 5, connections: int = 32,
              headers: dict[str, str] | None = None) -> dict:
    """POST `SPLIT_BODY` to ``url`` as httpx does, each request's head and body in two
    sends (bench/_split_post.py, Python on uvloop: the client itself bounds req/s
    on a small machine); returns {"rps", "errors"}. Raises RuntimeError when it
    fails or hangs."""
    cmd = [sys.executable, str(Path(__file__).with_name("_split_post.py")), url, str(seconds),
           str(connections), SPLIT_BODY, *(f"{k}: {v}" for k, v in (headers or {}).items())]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the split-POST client hung: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the split-POST client failed ({proc.returncode}):\n{proc.stderr}")
    r = json.loads(proc.stdout)
    return {"rps": r["rps"], "errors": r["errors"]}


def ab_close_run(url: str, seconds: int = 5, connections: int = 32,
                 headers: dict[str, str] | None = None) -> dict:
    """`ab_run` without ``-k``: HTTP/1.0, not kept alive (a connection a request)."""
    return ab_run(url, seconds, connections, headers, keep_alive=False)


CLIENTS = {"ab": ab_run, "ab-close": ab_close_run, "split": split_run}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used (all its threads), in seconds
    (/proc's clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pid: int, url: str, seconds: int, headers: dict[str, str] | None = None,
             client: str = "wrk", connections: int = 32) -> dict:
    """`run` (`client` "ab": `ab_run`, "split": `split_run`) against `url` (each request
    with `headers`), with ``"cpu_us"``: the CPU microseconds per request the serving
    process `pid` used over it. Raises as `run` does."""
    before = cpu_seconds(pid)
    r = CLIENTS.get(client, run)(url, seconds=seconds, headers=headers,
                                 connections=connections)
    r["cpu_us"] = (cpu_seconds(pid) - before) / max(r["rps"] * seconds, 1) * 1e6
    return r


def rounds(targets: dict[Any, tuple[int, str]], seconds: int, n: int,
           headers: dict[str, str] | None = None, client: str = "wrk",
           connections: int = 32, refused: bool = False) -> list[dict[Any, dict]]:
    """Each of `targets` (name -> the serving process's pid, a URL) warmed for a
    second, then `n` rounds loading each in turn (a noisy machine hits each alike),
    each run `measured` (each request with `headers`, by `client` on `connections`):
    every round's runs by name. With `refused` (wrk only), the answers are to be
    refusals (a rate limit's 429s): at least 99% of them not 2xx/3xx, which are then
    no errors. Raises RuntimeError when a run had errors under load, and as `run`
    does."""
    for _, url in targets.values():
        CLIENTS.get(client, run)(url, seconds=1, headers=headers)
    out: list[dict[Any, dict]] = []
    for _ in range(n):
        this: dict[Any, dict] = {}
        for name, (pid, url) in targets.items():
            r = measured(pid, url, seconds, headers, client, connections)
            if refused and r["non_2xx"] < 0.99 * r["rps"] * seconds:
                raise RuntimeError(f"{name}: {r['non_2xx']} refusals, of ~"
                                   f"{r['rps'] * seconds:.0f} requests")
            if r["errors"] - (r["non_2xx"] if refused else 0):
                raise RuntimeError(f"{name}: {r['errors']} errors under load")
            this[name] = r
        out.append(this)
    return out


def best(runs: list[dict[Any, dict]]) -> dict[Any, dict]:
    """Of `rounds`' runs, the one with the most req/s of each name."""
    return {name: max((r[name] for r in runs), key=lambda x: x["rps"]) for name in runs[0]}


def run(url: str, seconds: int = 5, connections: int = 32, threads: int = 1,
        headers: dict[str, str] | None = None, script: str | None = None) -> dict:
    """Load ``url`` with wrk (``script``: a Lua file for ``-s``, e.g. a POST's method
    and body); returns {"rps", "p50_ms", "p99_ms", "errors"}.

    Raises RuntimeError if wrk is missing (naming ``apt-get install -y wrk``),
    exits non-zero, hangs well past ``seconds`` or prints something unparseable;
    the message carries wrk's output.
    """
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError(INSTALL_HINT)
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    for name, value in (headers or {}).items():
        cmd[1:1] = ["-H", f"{name}: {value}"]
    if script is not None:
        cmd[1:1] = ["-s", script]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    except subprocess.TimeoutExpired as exc:
        # Partial output on timeout is bytes even with text=True.
        raw = exc.stdout or b""
        partial = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        raise RuntimeError(f"wrk hung: {' '.join(cmd)}\n{partial}") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {' '.join(cmd)}\n{output}")
    try:
        return parse(output)
    except ValueError:
        raise RuntimeError(f"could not parse wrk output:\n{output}") from None


def best_of(urls: dict[str, str], seconds: int, rounds: int,
            scripts: dict[str, str] | None = None) -> dict[str, dict]:
    """Each of `urls` (name -> URL) warmed for a second, then loaded `rounds` times
    in turns (a noisy machine hits each alike), with its Lua file from `scripts`
    if named there: the best round of each, as `run` gives it. Raises RuntimeError
    as `run` does, and when a round had errors."""
    scripts = scripts or {}
    for name, url in urls.items():
        run(url, seconds=1, script=scripts.get(name))
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for name, url in urls.items():
            r = run(url, seconds=seconds, script=scripts.get(name))
            if r["errors"]:
                raise RuntimeError(f"{name}: {r['errors']} errors under load")
            if name not in best or r["rps"] > best[name]["rps"]:
                best[name] = r
    return best


def latency_probe(host: str, port: int, path: str, n: int) -> list[float]:
    """Time ``n`` sequential GETs of ``path`` over ONE keep-alive connection.

    Returns each request's latency in milliseconds, from sending the request
    to reading the whole body; the TCP connect happens before the first timer
    starts. Raises OSError / http.client.HTTPException on connection trouble,
    RuntimeError on a non-2xx/3xx status or if the server closes the
    connection before the last request (http.client would silently reconnect).
    """
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.connect()
        sock = conn.sock
        latencies = []
        for i in range(n):
            if conn.sock is not sock:
                raise RuntimeError(f"server closed the connection after {i} requests")
            latencies.append(_timed_get(conn, path))
        return latencies
    finally:
        conn.close()


def _timed_get(conn: http.client.HTTPConnection, path: str) -> float:
    """One GET on ``conn``, in milliseconds; RuntimeError on a non-2xx/3xx status."""
    start = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - start) * 1e3
    if not 200 <= response.status < 400:
        raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
    return elapsed
