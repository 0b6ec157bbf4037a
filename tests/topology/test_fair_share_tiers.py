"""The model worker's fair share follows the tenant across tiers: two real PoPs on
loopback sharing a topology secret, an edge whose model worker forwards every model
(an ``openai`` engine) to a regional PoP that runs the packaged models in its real
worker. A tenant's chat and embeddings through the edge count in that tenant's share
of the regional's worker (its ``calls_by_client``), not the edge's or the anonymous
one, the regional's AI cache included (a semantic hit's token count), and so do an
edge function's ``ai`` binding calls in its owner's; a client header from a caller
the topology did not sign for picks no share. With three tiers (edge -> regional ->
central), the regional passes on the share it verified."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from runtime.security.keys import KeyStore
from runtime.security.residency import sign, sign_client
from tests.support import Running, pop_thread, python_function
from tests.topology.tiers import three_tiers

SECRET = "0123456789abcdef0123"
CHAT, EMBED = "smollm2-135m", "all-minilm-l6-v2"
REGIONAL_PORT, EDGE_PORT = 27210, 27211  # this suite's range: 27200-27399
CENTRAL_PORT = 27212  # and the next two: the three tiers
CHATTY = f"""from edgefn import Response


def handle(request, env):
    env.ai().chat([{{"role": "user", "content": request.query["q"]}}], model="{CHAT}",
                  max_tokens=2)
    return Response("chatted")
"""


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running,
                                                                      dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("fair-tiers")
    with pop_thread(tmp / "reg", REGIONAL_PORT, ai=True, name="reg", tier="regional",
                    residency={"secret": SECRET}) as reg:
        worker = tmp / "edge-worker.toml"
        worker.write_text(f'[[models]]\nname = "reg"\nengine = "openai"\n'
                          f'url = "http://{reg.host}:{reg.port}/v1"\n'
                          f'models = ["{CHAT}", "{EMBED}"]\n')
        with pop_thread(tmp / "edge", EDGE_PORT, ai=True, ai_config=str(worker), name="edge",
                        residency={"secret": SECRET}, **{"ai_cache.enabled": False}) as edge:
            store = KeyStore(edge.data)
            keys = {t: store.create(t, ("*",))[0] for t in ("acme", "globex")}
            edge.admin.request("POST", "/v1/keys/reload")
            edge.deploy(python_function(tmp / "fns", "chatty", CHATTY,
                                        extra='owner = "initech"\n[bindings]\nai = true'))
            yield reg, edge, keys


def calls(pop: Running) -> dict[str, int]:
    """Model calls per client its worker counted ("" the anonymous share)."""
    return dict(pop.admin.request("GET", "/v1/ai/metrics")["calls_by_client"])


def post(pop: Running, path: str, body: dict[str, object], headers: dict[str, str]
         ) -> tuple[int, bytes]:
    status, _, out = pop.request("POST", path, json.dumps(body).encode(), {
        "content-type": "application/json", **headers}, timeout=60)
    return status, out


def chat(pop: Running, text: str, headers: dict[str, str]) -> tuple[int, bytes]:
    return post(pop, "/v1/chat/completions", {
        "model": CHAT, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": text}]}, headers)


def cache_outcome(pop: Running, rid: str) -> str | None:
    """What `pop`'s AI cache decided for request `rid` (its event)."""
    pop.delivered()
    events = pop.admin.request("GET", "/v1/events?path=/v1/chat/completions&limit=1000")
    return next((e.get("decisions", {}).get("ai_cache", {}).get("outcome")
                 for e in events["events"] if e["rid"] == rid), None)


def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {c: n - before.get(c, 0) for c, n in after.items() if n != before.get(c, 0)}


def test_a_tenants_calls_through_the_edge_count_in_its_share_upstream(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    reg, edge, keys = tiers
    before = calls(reg)
    status, out = chat(edge, f"Name a colour. {uuid.uuid4().hex[:6]}",
                       {"authorization": f"Bearer {keys['acme']}"})
    assert status == 200, out
    status, out = post(edge, "/v1/embeddings", {"model": EMBED, "input": ["a red apple"]},
                       {"authorization": f"Bearer {keys['globex']}"})
    assert status == 200, out
    changed = grew(before, calls(reg))
    # the regional's AI cache embeds the chat's query in acme's share too
    assert changed.get("tenant:acme", 0) >= 1 and changed.get("tenant:globex") == 1, changed
    assert set(changed) == {"tenant:acme", "tenant:globex"}, changed  # none anonymous


def test_a_functions_model_calls_count_in_its_owners_share_upstream(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    reg, edge, _ = tiers
    before = calls(reg)
    status, _, out = edge.get(f"/chatty?q=Name+a+bird+{uuid.uuid4().hex[:6]}", timeout=60)
    assert (status, out) == (200, b"chatted")
    changed = grew(before, calls(reg))
    assert changed.get("tenant:initech", 0) >= 1 and set(changed) == {"tenant:initech"}, \
        changed


def test_a_semantic_hit_upstream_counts_its_tokens_in_the_callers_share(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    """The regional's AI cache counts a semantic hit's prompt with the worker."""
    reg, edge, keys = tiers
    acme = {"authorization": f"Bearer {keys['acme']}"}
    assert chat(edge, "How do I reverse a list in Python?", acme)[0] == 200
    before = calls(reg)
    rid = f"para-{uuid.uuid4().hex[:8]}"
    status, out = chat(edge, "How can I reverse a list in Python, please?",
                       {**acme, "x-request-id": rid})
    assert status == 200, out
    assert cache_outcome(reg, rid) == "hit-semantic", "the premise"
    changed = grew(before, calls(reg))
    assert changed == {"tenant:acme": 2}, changed  # the query's embedding, the count


@pytest.mark.parametrize("forged", [
    "tenant:acme",  # named, not signed
    sign_client("another-topologys-secret", "tenant:acme", "{rid}"),
    sign_client(SECRET, "tenant:acme", "another-request"),  # signed for another request
])
def test_a_client_header_the_topology_did_not_sign_picks_no_share(
        tiers: tuple[Running, Running, dict[str, str]], forged: str) -> None:
    reg, _, _ = tiers
    rid = f"forged-{uuid.uuid4().hex[:8]}"
    before = calls(reg)
    status, out = chat(reg, f"Name a fruit. {rid}", {
        "x-request-id": rid, "x-edgefn-client": forged.replace("{rid}", rid)})
    assert status == 200, out  # ignored, not refused
    changed = grew(before, calls(reg))
    assert "tenant:acme" not in changed and changed.get("", 0) >= 1, changed


def test_a_signed_tenant_does_not_pass_for_a_signed_client(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    reg, _, _ = tiers
    rid = f"swap-{uuid.uuid4().hex[:8]}"
    before = calls(reg)
    status, out = chat(reg, f"Name a tree. {rid}", {
        "x-request-id": rid, "x-edgefn-client": sign(SECRET, "tenant:acme", rid)})
    assert status == 200, out
    assert "tenant:acme" not in grew(before, calls(reg))


def test_the_premise_a_signed_client_from_a_plain_caller_is_honoured(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    """What the tests above forge is the only thing missing: the same call signed."""
    reg, _, _ = tiers
    rid = f"signed-{uuid.uuid4().hex[:8]}"
    before = calls(reg)
    status, out = chat(reg, f"Name a river. {rid}", {
        "x-request-id": rid, "x-edgefn-client": sign_client(SECRET, "tenant:acme", rid)})
    assert status == 200, out
    changed = grew(before, calls(reg))
    assert changed.get("tenant:acme", 0) >= 1 and "" not in changed, changed


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running,
                                                                      dict[str, str]]]:
    """central (the real worker), a regional and an edge each forwarding to the next."""
    with three_tiers(tmp_path_factory.mktemp("fair-three"), CENTRAL_PORT, SECRET,
                     CHAT) as chain:
        yield chain


def test_a_middle_tier_passes_the_share_it_verified_on(
        three: tuple[Running, Running, dict[str, str]]) -> None:
    """edge -> regional -> central: central's worker counts acme's chat as acme's."""
    central, edge, keys = three
    before = calls(central)
    status, out = chat(edge, f"Name a city. {uuid.uuid4().hex[:6]}",
                       {"authorization": f"Bearer {keys['acme']}"})
    assert status == 200, out
    assert grew(before, calls(central)) == {"tenant:acme": 1}
