"""Make the request pipeline a `PopConfig` describes, from the PoP's parts."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from runtime import config as c
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context, Stage, Target
from runtime.pipeline.targets import Targets

if TYPE_CHECKING:
    from runtime.pop import PoP
    from runtime.security.ratelimit.admission import TokenBudgets

log = logging.getLogger("edgefn.pop")


def build(pop: PoP) -> Chain:
    """The chain of `pop.config.pipeline`, in order. A stage whose part this PoP
    does not run (``openai`` without a model worker) is left out."""
    targets = _targets(pop)
    configs = pop.config.pipeline
    tracing = pop.config.tracing.enabled
    if tracing and not any(isinstance(s, c.TracingStage) for s in configs):
        configs = [c.TracingStage(), *configs]  # first: its span covers the whole request
    stages = [s for s in (_make(cfg, pop, targets) for cfg in configs) if s is not None]
    _wire_refusals_to_limits(stages)
    _drop_cache_tags(stages)
    timed = tracing or _keep_timings(pop.config)
    return Chain(stages, timed, targets)


def _wire_refusals_to_limits(stages: list[Stage]) -> None:
    """A request `auth`, `waf` or `bots` refuses still counts against the ``by =
    "ip"`` rate limits of a ``ratelimit`` stage after it (`stages.refusals`: a
    credential-guessing flood, or one of attack payloads, was never counted); and
    that stage knows for which targets `auth` may set a principal (what its plan
    depends on)."""
    from runtime.pipeline.stages.auth import Auth
    from runtime.pipeline.stages.bots import Bots
    from runtime.pipeline.stages.ratelimit import RateLimit
    from runtime.pipeline.stages.waf import Waf

    at = next((i for i, s in enumerate(stages) if isinstance(s, RateLimit)), None)
    if at is None:
        return
    limits = stages[at]
    assert isinstance(limits, RateLimit)
    for stage in stages[:at]:
        if isinstance(stage, Auth | Waf | Bots):
            stage.on_refused = limits.refused
        if isinstance(stage, Auth):
            limits.identifies = stage.identifies


def _drop_cache_tags(stages: list[Stage]) -> None:
    """Without an ``http_cache`` stage (or with ``[http_cache] enabled = false``), the
    function's ``Cache-Tag`` is dropped by dispatch: it is the cache's whether or not
    one runs (a function's own ``[cache.http] enabled = false`` drops it too), never
    the client's."""
    from runtime.pipeline.stages.dispatch import Dispatch
    from runtime.pipeline.stages.http_cache import HttpCacheStage

    if any(isinstance(s, HttpCacheStage) and s.settings.enabled for s in stages):
        return
    for i, stage in enumerate(stages):
        if isinstance(stage, Dispatch):
            stages[i] = Dispatch(drops_cache_tag=True)


def _keep_timings(config: c.PopConfig) -> bool:
    """Whether something wants every request's stage timings (the tracer wants only
    the sampled requests')."""
    return any((isinstance(s, c.AccessLogStage) and s.format == "json" and s.stage_timings)
               or (isinstance(s, c.EventsStage) and config.events.stage_timings)
               for s in config.pipeline)


def reserved_paths(config: c.PopConfig) -> frozenset[bytes]:
    """Paths built-in stages answer, which no function route may cover."""
    reserved: set[bytes] = set()
    if config.ai.enabled and any(isinstance(s, c.OpenAIStage) for s in config.pipeline):
        from runtime.ai.openai_api import PATHS

        reserved |= PATHS
    if any(isinstance(s, c.HealthStage) for s in config.pipeline):
        from runtime.pipeline.stages.health import paths

        reserved |= paths(config)
    return frozenset(reserved)


def shared_table(config: c.PopConfig) -> str | None:
    """The table of shared memory in which the PoP processes of ``workers = N`` count
    together (rate limits and token budgets stored in ``memory://``, bots'
    `abusive_rate`; `runtime.workers.primary` makes it before it starts them and
    names it to each: `native.inherit_table`), or None: one process, or no such
    table (logged: each worker then counts alone)."""
    if not wants_shared_table(config):
        return None
    from runtime.security.ratelimit.native import inherited_table

    path = inherited_table()
    if path is None:
        log.warning("no shared rate-limit table from the workers' parent: this worker "
                    "counts its rate limits alone")
    return path


def wants_shared_table(config: c.PopConfig) -> bool:
    """Whether the PoP's workers count in a shared table: several of them, and a
    ``ratelimit`` stage storing in memory or a ``bots`` stage."""
    if config.worker_count() <= 1:
        return False
    memory = config.ratelimit.storage.startswith("memory://")
    return any(isinstance(s, c.BotsStage) or (memory and isinstance(s, c.RateLimitStage))
               for s in config.pipeline)


def token_budgets(config: c.PopConfig) -> TokenBudgets | None:
    """The token budgets AI calls are charged to (the OpenAI API's and functions'
    ``ai`` binding's, one store for both): with a model worker and a
    ``ratelimit`` stage only."""
    if not config.ai.enabled or not any(isinstance(s, c.RateLimitStage)
                                        for s in config.pipeline):
        return None
    from runtime.security.ratelimit.admission import TokenBudgets
    from runtime.security.ratelimit.native import inherited_worker

    table = shared_table(config)
    return TokenBudgets(config.ratelimit, table=table,
                        worker=inherited_worker() if table is not None else None)


def _targets(pop: PoP) -> Targets:
    """With an ``openai`` stage, ``/v1/`` paths no function serves are the OpenAI
    API's (its 404 in OpenAI's shape; with no model worker, its "API is off");
    with a worker, its endpoints and ``/v1/models/{id}`` come before functions."""
    if not any(isinstance(s, c.OpenAIStage) for s in pop.config.pipeline):
        return Targets(pop.registry)
    from runtime.ai.openai_api import MODELS, PATHS, PREFIX, OpenAITarget

    target = OpenAITarget()
    if pop.ai is None:
        return Targets(pop.registry, after=((PREFIX, target),))
    builtin: dict[bytes, Target] = dict.fromkeys(PATHS, target)
    return Targets(pop.registry, builtin, ((MODELS, target),), ((PREFIX, target),))


def _make(cfg: c.Stage, pop: PoP, targets: Targets) -> Stage | None:
    match cfg:
        case c.RequestIdStage():
            from runtime.pipeline.stages.request_id import RequestId

            return RequestId(cfg)
        case c.HealthStage():
            from runtime.pipeline.stages.health import Health

            return Health.for_pop(pop)
        case c.TracingStage():
            if not pop.config.tracing.enabled:
                return None
            from runtime.pipeline.stages.tracing import Tracing

            return Tracing(pop.config.tracing, keep_timings=_keep_timings(pop.config))
        case c.EventsStage():
            from runtime.pipeline.stages.events import Events

            return Events(pop.config, pop.observers)
        case c.AccessLogStage():
            from runtime.pipeline.stages.access_log import AccessLog

            log = AccessLog(cfg)
            if any(isinstance(s, c.EventsStage) for s in pop.config.pipeline):
                pop.observers.add(log)  # each line from the request's event: no stage
                return None
            return log
        case c.OpenAIStage():
            return _openai(pop, targets)
        case c.RouteStage():
            from runtime.pipeline.stages.route import Route

            return Route(targets)
        case c.AuthStage():
            return _auth(pop, targets)
        case c.CorsStage():
            from runtime.pipeline.stages.cors import Cors

            return Cors(cfg)
        case c.WafStage():
            from runtime.pipeline.stages.waf import Waf

            return Waf(pop.config.waf, targets)
        case c.BotsStage():
            from runtime.pipeline.stages.bots import Bots

            return Bots.from_settings(pop.config.bots, targets, pop.config.data_dir,
                                      pop.config.worker_count(), shared_table(pop.config))
        case c.ResidencyStage():
            return _residency(pop)
        case c.RateLimitStage():
            from runtime.pipeline.stages.ratelimit import RateLimit

            return RateLimit(pop.config.ratelimit, targets, where="pop.toml",
                             table=shared_table(pop.config))
        case c.HttpCacheStage():
            return _http_cache(pop, targets)
        case c.AICacheStage():
            return _ai_cache(pop, targets)
        case c.DispatchStage():
            from runtime.pipeline.stages.dispatch import Dispatch

            return Dispatch()
    raise AssertionError(f"no stage for {cfg!r}")


def _auth(pop: PoP, targets: Targets) -> Stage:
    from runtime.pipeline.stages.auth import Auth
    from runtime.security.jwt_auth import JwtVerifier

    settings = pop.config.auth
    jwt = JwtVerifier(settings.jwt) if settings.jwt is not None else None
    return Auth(settings, pop.keys, targets, jwt, pop.config.residency.secret)


def _residency(pop: PoP) -> Stage:
    from runtime.observe.samples import Ingest
    from runtime.pipeline.stages.residency import Residency

    cfg = pop.config
    ingest = Ingest(cfg.residency.secret, cfg.data_dir / "samples" / "in") \
        if cfg.residency.samples.ingest else None
    return Residency(cfg.residency, cfg.name, cfg.region, ingest)


def _http_cache(pop: PoP, targets: Targets) -> Stage | None:
    if pop.http_cache is None:
        log.info("stage http_cache: inactive, [http_cache] enabled = false")
        return None
    from runtime.pipeline.stages.http_cache import HttpCacheStage

    return HttpCacheStage(pop.http_cache, targets, pop.stores.cache_stats)


def _openai(pop: PoP, targets: Targets) -> Stage:
    from runtime.pipeline.stages.openai import OpenAI

    if pop.ai is None:
        log.info("stage openai: /v1/ answers that the API is off, this PoP runs no model "
                 "worker")
        return OpenAI(None, targets)
    from runtime.ai.openai_api import OpenAIApi

    return OpenAI(OpenAIApi(pop.ai, pop.stores.budgets, pop.stores.egress), targets)


def _ai_cache(pop: PoP, targets: Targets) -> Stage | None:
    cache = pop.stores.ai_cache
    if cache is None or not pop.config.ai_cache.enabled:
        log.info("stage ai_cache: inactive (%s)", "[ai_cache] enabled = false" if cache
                 else "this PoP runs no model worker")
        return None
    from runtime.ai.openai_api import count_text
    from runtime.pipeline.stages.ai_cache import AICacheStage

    ai, egress = pop.ai, pop.stores.egress

    async def count(model: str, messages: list[Any], ctx: Context) -> int:
        assert ai is not None  # an AI cache exists where a model worker does
        text = count_text(egress, ctx, model, {"messages": messages})  # as the call leaves
        return await ai.client.count_tokens(model, client=ctx.model_client(), **text)

    return AICacheStage(cache, targets, pop.config.residency.secret, count)
