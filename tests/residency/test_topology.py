"""Data residency on a small topology of real processes: two regions, a pinned
tenant (``acme-eu`` -> emea) whose requests carry a unique marker, an unpinned one
(``globex``) beside it; then every file of every out-of-region PoP (LMDB, events,
caches, spools, logs) is searched for the marker. A model call of the pinned
tenant is refused at the edge, before it leaves (central never hears of it); one
of ``acme-ds`` (pinned, ``allow_desensitised``) leaves de-sensitised and is answered.

    emea:     edge-eu (eu-west) -> reg-eu -> central
    americas: edge-us (us-east) -> central (the model)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.client import AdminClient
from runtime.ai.egress import DESENSITISED_RID
from runtime.security.keys import KeyStore
from runtime.security.residency import hashed_id
from runtime.topology import runner
from runtime.topology.load import Client, Sample
from runtime.topology.rundir import pop_dir, read_state, write_state
from tests.support import EXAMPLES, ROOT
from tests.topologies import EMEA_PINNED, network, pop, running

MARK = f"RESMARK{uuid.uuid4().hex[:12]}"  # in paths, bodies, prompts and KV of acme-eu
DSMARK = f"dsmark{uuid.uuid4().hex[:12]}"  # in the e-mail address acme-ds's prompt holds
FUNCTIONS = [EXAMPLES / "counter-py", EXAMPLES / "retrieval-py"]
SETTINGS = """[pop.settings.events]
file = "events.jsonl"
prompts = true
[pop.settings.http_cache]
default_ttl = 600
"""
PINS = """[samples]
rate = 1.0
interval_s = 0.3
""" + EMEA_PINNED + """
[[tenant]]
name = "acme-ds"
residency = "emea"
allow_desensitised = true
"""
TOPOLOGY = (network(4, 10, 20) + PINS
            + pop("central", "central", region="americas", settings=SETTINGS)
            + pop("reg-eu", "regional", region="emea", parents=["central"], settings=SETTINGS)
            + pop("edge-eu", "edge", geo="eu-west", region="emea", parents=["reg-eu", "central"],
                  functions=[*FUNCTIONS, "ai-acme"], settings=SETTINGS)  # acme-eu's own
            + pop("edge-us", "edge", geo="us-east", region="americas", parents=["central"],
                  functions=FUNCTIONS, settings=SETTINGS))


RESTARTED: list[subprocess.Popen[bytes]] = []  # PoPs a test started again
STOPPED: list[int] = []  # pids of PoPs `up` started that a test stopped


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("residency")
    shutil.copytree(EXAMPLES / "ai-py", folder / "ai-acme")
    manifest = (folder / "ai-acme" / "edgefn.toml").read_text()
    (folder / "ai-acme" / "edgefn.toml").write_text(manifest.replace(
        'name = "ai-py"', 'name = "ai-acme"\nowner = "acme-eu"').replace(
        'routes = ["/ai-py", "/ai-py/rank"]', 'routes = ["/ai-acme"]'))
    try:
        with running(folder, TOPOLOGY) as run:
            yield run
    finally:
        for proc in RESTARTED:  # stopped by `down` (the run's state names them)
            proc.wait(30)
    # the PoP a test stopped (and replaced) was collected too
    assert set(STOPPED).isdisjoint(runner.unreaped()), STOPPED


@pytest.fixture(scope="module")
def keys(run: Path) -> dict[tuple[str, str], str]:
    """(edge, tenant) -> an API key of that tenant on that edge."""
    made = {}
    for edge in ("edge-eu", "edge-us"):
        for tenant in ("acme-eu", "acme-ds", "globex"):
            made[edge, tenant] = KeyStore(pop_dir(run, edge)).create(tenant, ("*",))[0]
        AdminClient(pop_dir(run, edge), timeout=30).request("POST", "/v1/keys/reload")
    return made


def send(run: Path, geo: str, key: str, method: str, path: str,
         body: object = None, rid: str = "") -> Sample:
    raw = json.dumps(body).encode() if body is not None else None
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json",
               **({"x-request-id": rid} if rid else {})}
    with Client(geo, runner.read_network(run).entries[geo]) as client:
        return client.send("r", method, path, raw, headers)


def chat(text: str) -> dict[str, object]:
    return {"model": "smollm2-135m", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": text}]}


def workload(run: Path, keys: dict[tuple[str, str], str]) -> dict[str, list[int]]:
    """The mixed workload; returns the statuses per kind."""
    eu, us = keys["edge-eu", "acme-eu"], keys["edge-us", "globex"]
    doc = [{"id": f"doc-{MARK}", "vector": [0.1, 0.2, 0.3], "text": f"contract {MARK}"}]
    out: dict[str, list[int]] = {}
    for kind, geo, key, method, path, body in [
        ("pinned", "eu-west", eu, "GET", f"/counter-py/{MARK}", None),
        ("pinned", "eu-west", eu, "POST", "/retrieval-py/docs", doc),
        ("pinned", "eu-west", eu, "POST", "/retrieval-py?k=1", [0.1, 0.2, 0.3]),
        ("pinned_chat", "eu-west", eu, "POST", "/v1/chat/completions", chat(f"Hi {MARK}")),
        ("pinned_fn_ai", "eu-west", eu, "GET", f"/ai-acme?q=Hi+{MARK}&stream=0&max_tokens=3",
         None),
        ("pinned_abroad", "us-east", keys["edge-us", "acme-eu"], "GET",
         f"/counter-py/{MARK}?q={MARK}", None),
        ("other", "us-east", us, "GET", "/counter-py/globex", None),
        ("other", "eu-west", keys["edge-eu", "globex"], "GET", "/counter-py/globex", None),
        ("other_chat", "us-east", us, "POST", "/v1/chat/completions", chat("Say hi.")),
    ]:
        s = send(run, geo, key, method, path, body)
        out.setdefault(kind, []).append(s.status)
        if kind in ("pinned_chat", "pinned_abroad", "pinned_fn_ai"):
            out.setdefault(kind + "_error", []).append(s.error)  # type: ignore[arg-type]
    return out


def files_with(root: Path, needle: bytes) -> list[str]:
    """Every file under `root` (binary included) that holds `needle`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(str(path.relative_to(root)))
            except OSError:
                pass
    return found


def test_a_pinned_tenants_data_stays_in_its_region(run: Path,
                                                   keys: dict[tuple[str, str], str]) -> None:
    before = _events(run, "edge-us")
    chats = _chats(run, "central")
    out = workload(run, keys)
    assert out["pinned"] == [200, 201, 200] and out["other"] == [200, 200]
    assert out["other_chat"] == [200], "unpinned traffic crosses regions as before"
    assert out["pinned_abroad"] == [451], out
    assert "residency_violation" in out["pinned_abroad_error"][0]  # type: ignore[operator]
    # a miss at edge-eu could reach central (americas), its failover parent: edge-eu
    # refuses before the hop, naming the tier it would have needed
    assert out["pinned_chat"] == [451], out
    error = out["pinned_chat_error"][0]  # OpenAI's shape, cut to 200 characters
    assert error.startswith('{"error":{"message":"tenant \'acme-eu\' ')  # type: ignore[union-attr]
    assert "is pinned to region 'emea': model 'smollm2-135m' would need central 'central' " \
        "in region 'americas'; not forwarded by PoP 'edge-eu'" in error  # type: ignore[operator]
    # acme-eu's function calls the model through the same path: refused at edge-eu too
    # (its message is cut before the PoP's name: the chat counts below show where)
    assert out["pinned_fn_ai"] != [200], out
    assert "ai.chat: tenant 'acme-eu' is pinned" in out["pinned_fn_ai_error"][0]  # type: ignore[operator]
    needle = MARK.encode()
    inside = _wait_for(lambda: files_with(pop_dir(run, "edge-eu"), needle), "events.jsonl")
    # the out-of-region event files hold these requests' events (3 at edge-us; at
    # central globex's chat, sent after the pinned ones: its own event, as central's
    # samples ingest writes events all along) before they are searched
    _wait_for(lambda: (["edge-us"] if _events(run, "edge-us") >= before + 3 else []) +
              (["central"] if _chats(run, "central") > chats else []),
              "central", "edge-us")
    # neither pinned model call left edge-eu: central got globex's chat, and no PoP
    # above edge-eu has a chat event holding the marker (they record prompts). Counts
    # of all chats there would not do: another test's forwarded chat (acme-ds's) can
    # reach reg-eu's event file only after this test began (seen under a loaded run)
    assert _chats(run, "central") == chats + 1
    assert {p: _chats(run, p, MARK) for p in ("reg-eu", "central")} == {
        "reg-eu": 0, "central": 0}
    everywhere = files_with(run, needle)  # every PoP's data dir and log, the links' log
    outside = [f for f in everywhere if not f.startswith(("pops/edge-eu/", "pops/reg-eu/"))]
    assert outside == [], outside
    # the search sees what it looks for: emea holds the marker in KV, vectors' docs, events
    assert any(f.endswith(".mdb") for f in inside), inside
    assert "events.jsonl" in inside and "pop.toml" not in inside


def _wait_for(find: Callable[[], list[str]], *names: str) -> list[str]:
    """`find()` once it lists every one of `names` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        found = find()
        if set(names) <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _sample_rows(run: Path) -> list[dict[str, object]]:
    folder = pop_dir(run, "central") / "samples" / "in"
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def _event_rows(run: Path, name: str) -> list[dict[str, Any]]:
    path = pop_dir(run, name) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _chats(run: Path, name: str, holding: str = "") -> int:
    """Chat completions `name` has an event of (served or refused); with `holding`,
    those whose event holds that text (its prompt, its path...)."""
    return sum(e["path"] == "/v1/chat/completions" and holding in json.dumps(e)
               for e in _event_rows(run, name))


def test_a_tenant_that_allows_it_leaves_the_region_desensitised(
        run: Path, keys: dict[tuple[str, str], str]) -> None:
    rid = f"ds-test-{uuid.uuid4().hex[:8]}"
    prompt = f"Reply to {DSMARK}@example.com or +44 20 7946 0958. Say ok."
    s = send(run, "eu-west", keys["edge-eu", "acme-ds"], "POST", "/v1/chat/completions",
             chat(prompt), rid)
    assert s.status == 200, s.error
    # central served a call marked de-sensitised, under a hashed request id, its
    # prompt scrubbed (central records prompts)
    hashed = DESENSITISED_RID + hashed_id((run / "secret").read_text().strip(), rid)
    found = _wait_for(lambda: [e["rid"] for e in _event_rows(run, "central")], hashed)
    assert hashed in found
    event = next(e for e in _event_rows(run, "central") if e["rid"] == hashed)
    assert event["status"] == 200 and event.get("tenant") is None, event
    assert event.get("decisions", {}).get("residency") == {
        "result": "desensitised",
        "tenant": hashed_id((run / "secret").read_text().strip(), "acme-ds")}, event
    assert "[email]" in event["ai"]["prompt"] and "[phone]" in event["ai"]["prompt"]
    outside = [f for f in files_with(run, DSMARK.encode())
               if not f.startswith(("pops/edge-eu/", "pops/reg-eu/"))]
    assert outside == [], outside
    assert all(rid not in json.dumps(e) for e in _event_rows(run, "central"))


def _events(run: Path, name: str) -> int:
    path = pop_dir(run, name) / "events.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _settled(run: Path, least: int, deadline: float) -> tuple[int, int]:
    """(sample rows at central, events at the non-central PoPs) once they agree
    and there are at least `least` events."""
    while True:
        rows = len(_sample_rows(run))
        events = sum(_events(run, p) for p in ("edge-eu", "edge-us", "reg-eu"))
        if (rows == events >= least) or time.monotonic() > deadline:
            return rows, events
        time.sleep(0.1)


def test_samples_reach_central_scrubbed_and_survive_its_outage(
        run: Path, keys: dict[tuple[str, str], str]) -> None:
    eu, us = keys["edge-eu", "acme-eu"], keys["edge-us", "globex"]
    first = sum(_events(run, p) for p in ("edge-eu", "edge-us", "reg-eu")) + 1
    assert send(run, "eu-west", eu, "GET", f"/counter-py/{MARK}").status == 200
    rows, events = _settled(run, first, time.monotonic() + 30)
    assert rows == events > 0, "every event of the edges and regionals is sampled once"
    text = json.dumps(_sample_rows(run))
    assert MARK not in text and "acme-eu" not in text and "globex" not in text
    state = read_state(run)
    assert state is not None
    central = next(p for p in state.pops if p.name == "central")
    os.kill(central.pid, signal.SIGTERM)
    STOPPED.append(central.pid)
    _wait_gone(central.pid, time.monotonic() + 30)
    for i in range(6):
        assert send(run, "eu-west", eu, "GET", f"/counter-py/{MARK}-{i}").status == 200
        assert send(run, "us-east", us, "GET", f"/counter-py/x{i}").status == 200
    spooled = _spooled(run)
    deadline = time.monotonic() + 10
    while not spooled and time.monotonic() < deadline:
        time.sleep(0.1)
        spooled = _spooled(run)
    assert spooled, "with central down the batches wait on disk"
    pid = _restart(run, central.public)
    write_state(run, type(state)(source=state.source, pops=[
        type(p)(**{**{f: getattr(p, f) for f in p.__struct_fields__},
                   "pid": pid if p.name == "central" else p.pid}) for p in state.pops]))
    rows, events = _settled(run, first + 12, time.monotonic() + 60)
    assert rows == events, "none lost, none twice"
    arrived = {f.stem for f in (pop_dir(run, "central") / "samples" / "in").glob("*.jsonl")}
    assert spooled <= arrived and _spooled(run) == set()


def _spooled(run: Path) -> set[str]:
    return {f.stem for p in ("edge-eu", "edge-us", "reg-eu")
            for f in (pop_dir(run, p) / "samples" / "out").glob("*.jsonl")}


def _wait_gone(pid: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # runner started it from this process
                return
        except ChildProcessError:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still runs")


def _restart(run: Path, public: str) -> int:
    log = open(pop_dir(run, "central") / "pop.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                             str(pop_dir(run, "central") / "pop.toml")], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    log.close()
    RESTARTED.append(proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{public}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return proc.pid
        except OSError:
            time.sleep(0.2)
    raise AssertionError("central did not come back")


def test_the_tiers_above_tell_unpinned_tenants_apart(run: Path,
                                                     keys: dict[tuple[str, str], str]) -> None:
    """Unpinned tenants' calls reached central anonymous: one tenant's cached answer
    was served to another's question there (hit-exact), and a purge by tenant never
    reached it. They now carry their signed tenant."""
    store = KeyStore(pop_dir(run, "edge-us"))
    initech = store.create("initech", ("*",))[0]
    AdminClient(pop_dir(run, "edge-us"), timeout=30).request("POST", "/v1/keys/reload")
    text = f"Say the word {uuid.uuid4().hex[:6]}."
    rids = {}
    for tenant, key in (("globex", keys["edge-us", "globex"]), ("initech", initech)):
        rids[tenant] = f"tenants-{tenant}-{uuid.uuid4().hex[:8]}"
        sample = send(run, "us-east", key, "POST", "/v1/chat/completions", chat(text),
                      rids[tenant])
        assert sample.status == 200, sample.error

    def seen() -> list[str]:
        return [e["rid"] for e in _event_rows(run, "central") if e["rid"] in rids.values()]

    _wait_for(seen, *rids.values())
    at_central = {e["rid"]: (e.get("tenant"), e["decisions"]["ai_cache"]["outcome"])
                  for e in _event_rows(run, "central") if e["rid"] in rids.values()}
    assert at_central == {rids["globex"]: ("globex", "miss"),
                          rids["initech"]: ("initech", "miss")}, at_central


def test_a_tier_above_with_api_keys_answers_what_edges_forward(
        run: Path, keys: dict[tuple[str, str], str]) -> None:
    """Once central had an API key of its own, its OpenAI API asked every call for
    one: what the edges forwarded for their callers was refused (401). The signed
    tenant the call carries admits it; central's event names that tenant."""
    central = pop_dir(run, "central")
    kept = (central / "keys.json").read_bytes() if (central / "keys.json").exists() else None
    KeyStore(central).create("ops", ("*",))
    AdminClient(central, timeout=30).request("POST", "/v1/keys/reload")
    rid = f"keyed-{uuid.uuid4().hex[:8]}"
    text = f"Say the word {uuid.uuid4().hex[:6]}."
    try:
        sample = send(run, "us-east", keys["edge-us", "globex"], "POST",
                      "/v1/chat/completions", chat(text), rid)
    finally:  # central asks for a key from now on: the other tests' topology is as it was
        if kept is None:
            (central / "keys.json").unlink()
        else:
            (central / "keys.json").write_bytes(kept)
        AdminClient(central, timeout=30).request("POST", "/v1/keys/reload")
    assert sample.status == 200, sample.error

    def seen() -> list[str]:
        return [e["rid"] for e in _event_rows(run, "central") if e["rid"] == rid]

    _wait_for(seen, rid)
    at_central = [(e["status"], e.get("tenant"), e["decisions"].get("auth"))
                  for e in _event_rows(run, "central") if e["rid"] == rid]
    assert at_central == [(200, "globex", {"mode": "key", "result": "forwarded",
                                           "tenant": "globex"})], at_central
