"""The AI caches: an exact cache of deterministic model calls and a semantic
cache of prompts, scoped per tenant, model, system prompt and sampling."""
