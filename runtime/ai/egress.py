"""What a pinned tenant's model call may take out of this PoP (``[residency]``).

A model this PoP forwards (``[residency.uplink] models``) may be served by any PoP
its uplink reaches (``uplink.pops``: the link's routes, so failover included). A
pinned tenant's call for it that could reach a PoP outside the tenant's region is
refused here, before it leaves (451 ``residency_violation`` naming the tenant's
region and the tier it would have needed); the next tier's own refusal stays, as
defence in depth. A tenant in ``allow_desensitised`` gets its call sent
de-sensitised instead (`desensitised`): no tenant, a keyed hash of the request id,
PII masked in the prompt and the messages, and the ``x-edgefn-desensitised`` mark.
Embeddings of a forwarded model follow the same rule (`inputs`): refused, or sent
with their texts PII-masked (the worker's embedding call carries no tenant or mark).
Reranks and token counts follow the same rules (`count_hop`). Every forwarded call
carries its caller's fair share of the model worker signed (`client_hop`:
``x-edgefn-client``), keyed-hashed when the call leaves de-sensitised.
"""

from __future__ import annotations

from typing import Any

from runtime.observe.redact import scrub_pii
from runtime.security.residency import (
    ResidencySettings,
    before_hop,
    hashed_id,
    sign,
    sign_client,
)

DESENSITISED_RID = "ds-"  # the prefix of a de-sensitised call's hashed request id
# what a token count takes of a generation's `hop`: the texts as they leave, and its names
COUNTED = ("request_id", "signed_client", "prompt", "messages")


class Egress:
    def __init__(self, settings: ResidencySettings, pop: str) -> None:
        """`settings`: the PoP's ``[residency]``; `pop`: its name (for the refusal)."""
        self.settings = settings
        self.pop = pop

    def hop(self, tenant: str | None, model: str, request_id: str,
            params: dict[str, Any], client: str | None = None) -> dict[str, Any]:
        """What the worker's ``generate`` gets for `tenant`'s call, over `params`:
        nothing for an anonymous call; the request id and the tenant signed for it
        for a tenant that is not pinned (the next tier scopes its caches and events
        by it: without it, tiers above stored every tenant's answers as one
        anonymous tenant's, served them across tenants and no purge by tenant
        reached them) or pinned with the call staying in its region (the next tier
        enforces the pin); the de-sensitised form when it may leave and the tenant
        allows it. Each with fair share `client` signed (`signed_client`; keyed-hashed
        when the call leaves de-sensitised). Raises `Rejected` (451
        ``residency_violation``) when it may leave otherwise."""
        s = self.settings
        if tenant is None and client is None:
            return {}
        if tenant is not None and tenant in s.tenants and self._leaves(tenant, model):
            out = desensitised(s.secret, tenant, request_id, params)
            return out | self.client_hop(client, out["request_id"], hashed=True)
        if not s.secret:
            return {}
        signed = {"tenant": sign(s.secret, tenant, request_id)} if tenant is not None else {}
        return {"request_id": request_id, **signed, **self.client_hop(client, request_id)}

    def client_hop(self, client: str | None, request_id: str, hashed: bool = False
                   ) -> dict[str, Any]:
        """The worker call's ``signed_client``: fair share `client` signed for
        `request_id` with the topology's secret (`sign_client`), for the next tier
        to share its model by; `hashed`: for a call leaving its region de-sensitised,
        the client's keyed hash (``ds:<hash>``) in its place. Empty without a
        client or a secret."""
        secret = self.settings.secret
        if client is None or not secret:
            return {}
        named = DESENSITISED_RID + hashed_id(secret, client) if hashed else client
        return {"signed_client": sign_client(secret, named, request_id)}

    def embed_hop(self, tenant: str | None, client: str | None, model: str,
                  request_id: str) -> dict[str, Any]:
        """What the worker's ``embed`` gets for `tenant`'s call of `client`: the
        request id and `client_hop` (both keyed-hashed where the texts leave the
        tenant's region de-sensitised, `inputs`); empty without a client or a secret."""
        s = self.settings
        if client is None or not s.secret:
            return {}
        home = s.tenants.get(tenant) if tenant is not None else None
        if home is not None and s.leaving(home, model) is not None:
            request_id = DESENSITISED_RID + hashed_id(s.secret, request_id)
            return {"request_id": request_id, **self.client_hop(client, request_id, True)}
        return {"request_id": request_id, **self.client_hop(client, request_id)}

    def count_hop(self, tenant: str | None, client: str | None, model: str,
                  request_id: str, text: dict[str, Any]) -> dict[str, Any]:
        """What the worker's ``count_tokens`` gets for `tenant`'s count of `text` (its
        ``prompt``, ``messages`` or ``inputs``) in fair share `client`: the text as it
        may leave this PoP, the request id and the signed client, as the generation
        (`hop`) or the embedding (`inputs`, `embed_hop`) it counts for would get them.
        Raises `Rejected` (451) where that call would be refused."""
        if "inputs" in text:
            return {"inputs": self.inputs(tenant, model, text["inputs"]),
                    "request_id": request_id,
                    **self.embed_hop(tenant, client, model, request_id)}
        over = self.hop(tenant, model, request_id, text, client)
        return {**text, "request_id": request_id,
                **{k: over[k] for k in COUNTED if k in over}}

    def inputs(self, tenant: str | None, model: str, texts: list[str]) -> list[str]:
        """The texts `tenant`'s embeddings call for `model` takes out of this PoP:
        `texts` unless it may leave the tenant's region, then PII-masked for a
        tenant that allows it. Raises `Rejected` (451) when it may leave otherwise."""
        if tenant is None or tenant not in self.settings.tenants:
            return texts
        return [scrub_pii(t) for t in texts] if self._leaves(tenant, model) else texts

    def _leaves(self, tenant: str, model: str) -> bool:
        """Whether pinned `tenant`'s call for `model` may reach a PoP outside its
        region; raises `Rejected` (451) when it may and the tenant does not allow
        it de-sensitised."""
        s = self.settings
        home = s.tenants[tenant]
        away = s.leaving(home, model)
        if away is None:
            return False
        if tenant not in s.allow_desensitised:
            raise before_hop(tenant, home, self.pop, away, model)
        return True


def named(call: dict[str, Any]) -> dict[str, Any]:
    """What names worker call `call` (its ``generate`` arguments) on the next tier:
    its request id and signed client, for the token count of its input."""
    return {k: call[k] for k in ("request_id", "signed_client") if call.get(k) is not None}


def with_embedding(call: dict[str, Any], embedding: str | None) -> dict[str, Any]:
    """`call` (the worker's ``generate`` arguments) with the AI cache's signed query
    embedding (`runtime.cache.ai.forward`) for the next tier, unless there is none or
    the call leaves de-sensitised: a vector of the unscrubbed text must not go with
    the scrubbed one."""
    if embedding is None or call.get("desensitised") is not None:
        return call
    return {**call, "embedding": embedding}


def desensitised(secret: str, tenant: str, request_id: str,
                 params: dict[str, Any]) -> dict[str, Any]:
    """The overrides that make a call leave its region de-sensitised: no tenant,
    the request id hashed, every string of `messages` (contents, text parts, tool
    call arguments) and the `prompt` PII-scrubbed (`scrub_pii`), and the mark (the
    tenant's keyed hash). Sampling, stops, tools and response formats go unchanged."""
    out: dict[str, Any] = {"tenant": None, "desensitised": hashed_id(secret, tenant),
                           "request_id": DESENSITISED_RID + hashed_id(secret, request_id)}
    if "messages" in params:
        out["messages"] = _scrubbed(params["messages"])
    if "prompt" in params:
        out["prompt"] = scrub_pii(params["prompt"])
    return out


def _scrubbed(value: Any) -> Any:
    """`value` (JSON-like) with every string PII-scrubbed; keys kept."""
    if isinstance(value, str):
        return scrub_pii(value)
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v) for k, v in value.items()}
    return value
