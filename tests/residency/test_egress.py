"""`Egress`: what a pinned tenant's model call may take out of a PoP, without
sockets: refused before the hop where the uplink may reach another region, sent
de-sensitised where the tenant allows it, signed where it stays in the region."""

from __future__ import annotations

import json

import pytest

from edgefn_core.errors import Rejected
from runtime.ai.egress import DESENSITISED_RID, Egress
from runtime.observe.redact import scrub_pii
from runtime.security import residency as r

SECRET = "0123456789abcdef0123"
REG = r.UplinkPop(pop="reg-eu", tier="regional", region="emea")
CENTRAL = r.UplinkPop(pop="central", tier="central", region="americas")
PII = "mail jane.doe@example.com or call +44 20 7946 0958, card 4111 1111 1111 1111"


def egress(*pops: r.UplinkPop, allow: tuple[str, ...] = ()) -> Egress:
    return Egress(r.ResidencySettings(
        tenants={"acme-eu": "emea", "acme-ds": "emea"}, secret=SECRET,
        uplink=r.Uplink(models=["chat-model"], pops=list(pops)),
        allow_desensitised=list(allow)), "edge-eu")


def chat(text: str) -> dict[str, object]:
    return {"max_tokens": 3, "messages": [
        {"role": "user", "content": text},
        {"role": "user", "content": [{"type": "text", "text": text}]},
        {"role": "assistant", "tool_calls": [{"function": {"arguments": json.dumps(
            {"to": "jane.doe@example.com"})}}]}]}


def test_an_unpinned_tenant_goes_as_it_came_with_its_signed_name() -> None:
    """Anywhere, unchanged, but named (signed for this request id): the tiers above
    stored every tenant's answers as one anonymous tenant's and served them across
    tenants."""
    hop = egress(CENTRAL).hop("globex", "chat-model", "rid-1", chat(PII))
    assert hop.keys() == {"request_id", "tenant"} and hop["request_id"] == "rid-1"
    assert r.verify(SECRET, hop["tenant"], "rid-1") == "globex"
    assert egress(CENTRAL).hop(None, "chat-model", "rid-1", chat(PII)) == {}
    unsigned = Egress(r.ResidencySettings(tenants={"acme-eu": "emea"}), "edge-eu")
    assert unsigned.hop("globex", "chat-model", "rid-1", chat(PII)) == {}  # no secret


@pytest.mark.parametrize("pops", [(REG,), ()], ids=["uplink in region", "no uplink"])
def test_a_call_that_stays_in_the_region_carries_the_signed_tenant(
        pops: tuple[r.UplinkPop, ...]) -> None:
    hop = egress(*pops).hop("acme-eu", "chat-model", "rid-1", chat(PII))
    assert hop.keys() == {"request_id", "tenant"} and hop["request_id"] == "rid-1"
    assert r.verify(SECRET, hop["tenant"], "rid-1") == "acme-eu"


def test_a_model_served_here_is_not_a_hop() -> None:
    hop = egress(CENTRAL).hop("acme-eu", "local-embedder", "rid-1", {"prompt": PII})
    assert r.verify(SECRET, hop["tenant"], "rid-1") == "acme-eu"


@pytest.mark.parametrize("pops", [(CENTRAL,), (REG, CENTRAL)],
                         ids=["parent abroad", "failover route abroad"])
def test_a_call_that_may_leave_is_refused_before_the_hop(pops: tuple[r.UplinkPop, ...]) -> None:
    with pytest.raises(Rejected) as e:
        egress(*pops).hop("acme-eu", "chat-model", "rid-1", chat(PII))
    assert (e.value.code, e.value.status) == ("residency_violation", 451)
    message = str(e.value)
    assert "tenant 'acme-eu' is pinned to region 'emea'" in message
    assert "central 'central' in region 'americas'" in message
    assert "PoP 'edge-eu'" in message and "not forwarded" in message
    assert e.value.detail == {"tenant_region": "emea", "needed_pop": "central",
                              "needed_tier": "central", "needed_region": "americas"}


def test_only_the_tenants_that_allow_it_leave_desensitised() -> None:
    with pytest.raises(Rejected):
        egress(CENTRAL, allow=("acme-ds",)).hop("acme-eu", "chat-model", "rid-1", chat(PII))
    hop = egress(CENTRAL, allow=("acme-ds",)).hop("acme-ds", "chat-model", "rid-1", chat(PII))
    assert hop["tenant"] is None  # the next tier does not learn who it is...
    assert hop["desensitised"] == r.hashed_id(SECRET, "acme-ds")  # ...only its keyed hash
    assert hop["request_id"] == DESENSITISED_RID + r.hashed_id(SECRET, "rid-1")
    text = json.dumps(hop)
    for leaked in ("jane.doe", "7946", "4111", "rid-1", "acme-ds"):
        assert leaked not in text, leaked
    scrubbed = scrub_pii(PII)
    assert scrubbed == "mail [email] or call [phone], card [card]"
    messages = hop["messages"]
    assert messages[0] == {"role": "user", "content": scrubbed}
    assert messages[1]["content"] == [{"type": "text", "text": scrubbed}]
    assert json.loads(messages[2]["tool_calls"][0]["function"]["arguments"]) == {"to": "[email]"}
    assert "max_tokens" not in hop  # only what it changes: sampling goes unchanged


def test_a_prompt_is_scrubbed_whole() -> None:
    prompt = "x" * 600 + " jane.doe@example.com"  # past the events' 512-character cut
    hop = egress(CENTRAL, allow=("acme-ds",)).hop("acme-ds", "chat-model", "r",
                                                  {"prompt": prompt})
    assert hop["prompt"] == "x" * 600 + " [email]"


def test_embeddings_texts_follow_the_same_rule() -> None:
    """`inputs`: unchanged unless they may leave; then refused, or PII-masked for a
    tenant that allows it."""
    texts = [PII, "plain"]
    assert egress(CENTRAL).inputs("globex", "chat-model", texts) == texts  # not pinned
    assert egress(CENTRAL).inputs(None, "chat-model", texts) == texts
    assert egress(REG).inputs("acme-eu", "chat-model", texts) == texts  # stays in region
    assert egress(CENTRAL).inputs("acme-eu", "local-embedder", texts) == texts  # served here
    with pytest.raises(Rejected) as e:
        egress(REG, CENTRAL).inputs("acme-eu", "chat-model", texts)
    assert (e.value.code, e.value.status) == ("residency_violation", 451)
    masked = egress(CENTRAL, allow=("acme-ds",)).inputs("acme-ds", "chat-model", texts)
    assert masked == ["mail [email] or call [phone], card [card]", "plain"]


def test_the_query_embedding_goes_on_only_with_the_query_as_it_came() -> None:
    from runtime.ai.egress import with_embedding

    signed = "all-minilm-l6-v2;AAAAAA==;tag"
    kept = egress(REG).hop("acme-eu", "chat-model", "rid-1", chat(PII))
    assert with_embedding(kept, signed) == {**kept, "embedding": signed}
    assert with_embedding({}, signed) == {"embedding": signed}  # an unpinned tenant's
    scrubbed = egress(CENTRAL, allow=("acme-ds",)).hop("acme-ds", "chat-model", "rid-1",
                                                       chat(PII))
    assert scrubbed["desensitised"] and "embedding" not in with_embedding(scrubbed, signed)
    assert with_embedding(kept, None) == kept


def test_the_callers_fair_share_goes_signed_for_the_request() -> None:
    """The next tier shares its model by the caller, and trusts only what the
    topology signed: for this request id, as a client (not a tenant)."""
    hop = egress(CENTRAL).hop("globex", "chat-model", "rid-1", chat(PII), "tenant:globex")
    assert hop.keys() == {"request_id", "tenant", "signed_client"}
    assert r.verify_client(SECRET, hop["signed_client"], "rid-1") == "tenant:globex"
    for wrong in (lambda v: r.verify_client(SECRET, v, "rid-2"),
                  lambda v: r.verify(SECRET, v, "rid-1"),
                  lambda v: r.verify_client("another-topology-secret", v, "rid-1")):
        with pytest.raises(Rejected):
            wrong(hop["signed_client"])
    unsigned = Egress(r.ResidencySettings(), "edge-eu")
    assert unsigned.hop("globex", "chat-model", "rid-1", {}, "tenant:globex") == {}
    assert egress(CENTRAL).hop("globex", "chat-model", "rid-1", {}, None).keys() == \
        {"request_id", "tenant"}


def test_a_desensitised_calls_fair_share_goes_as_a_keyed_hash() -> None:
    hop = egress(CENTRAL, allow=("acme-ds",)).hop("acme-ds", "chat-model", "rid-1",
                                                  chat(PII), "tenant:acme-ds")
    client = r.verify_client(SECRET, hop["signed_client"], hop["request_id"])
    assert client == DESENSITISED_RID + r.hashed_id(SECRET, "tenant:acme-ds")
    assert "acme" not in json.dumps(hop)


def test_an_embeddings_call_carries_its_request_id_and_signed_client() -> None:
    out = egress(CENTRAL).embed_hop("globex", "tenant:globex", "chat-model", "rid-1")
    assert out["request_id"] == "rid-1"
    assert r.verify_client(SECRET, out["signed_client"], "rid-1") == "tenant:globex"
    away = egress(CENTRAL, allow=("acme-ds",)).embed_hop("acme-ds", "tenant:acme-ds",
                                                         "chat-model", "rid-1")
    assert away["request_id"] == DESENSITISED_RID + r.hashed_id(SECRET, "rid-1")
    assert "acme" not in json.dumps(away)
    assert egress(CENTRAL).embed_hop("globex", None, "chat-model", "rid-1") == {}


def test_a_token_count_leaves_as_the_call_it_counts_for() -> None:
    """`count_hop`: a count's text leaves as its chat's or embedding's would (refused,
    or masked with the request id hashed), always named by request id and signed
    client: the tier above counts it in the caller's share."""
    messages = chat(PII)["messages"]
    out = egress(CENTRAL).count_hop("globex", "tenant:globex", "chat-model", "rid-1",
                                    {"messages": messages})
    assert out.keys() == {"messages", "request_id", "signed_client"}
    assert out["messages"] == messages and out["request_id"] == "rid-1"
    assert r.verify_client(SECRET, out["signed_client"], "rid-1") == "tenant:globex"
    for text in ({"messages": messages}, {"prompt": PII}, {"inputs": [PII]}):
        with pytest.raises(Rejected) as e:
            egress(CENTRAL).count_hop("acme-eu", "tenant:acme-eu", "chat-model", "rid-1", text)
        assert e.value.status == 451
        away = egress(CENTRAL, allow=("acme-ds",)).count_hop(
            "acme-ds", "tenant:acme-ds", "chat-model", "rid-1", text)
        assert away.keys() == {*text, "request_id", "signed_client"}
        assert away["request_id"] == DESENSITISED_RID + r.hashed_id(SECRET, "rid-1")
        for leaked in ("jane.doe", "7946", "4111", "acme"):
            assert leaked not in json.dumps(away), leaked
