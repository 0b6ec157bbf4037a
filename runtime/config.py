"""`PopConfig`: one typed description that builds a whole PoP (see `runtime.pop`).

Loaded from a ``pop.toml`` (every field is optional; README "PoP config" lists
them) and overridden by CLI flags:

    name = "edge-local"
    tier = "edge"                 # edge | regional | central
    geo = "fra"                   # a label on events and metrics
    data = ".edgefn"
    workers = 1                   # PoP processes on the public port; "auto": one a core

    [public]                      # the listener functions and the OpenAI API answer on
    host = "127.0.0.1"
    port = 8080

    [admin]                       # the admin API: loopback only
    port = 0                      # 0: any free port (written to DATA/pop.json)

    [http]                        # limits of both listeners
    max_body_bytes = 16777216

    [ai]
    enabled = true
    worker_config = "models.toml" # model worker config; default: the packaged models
    socket = ""                   # use a worker already listening here instead

    [auth]                        # the security stages' settings (runtime.security.settings)
    openai = "auto"
    [waf]
    mode = "off"
    [bots]
    [ratelimit]
    storage = "memory://"

    [[pipeline]]                  # the request pipeline, in order (default: below)
    stage = "request_id"
    [[pipeline]]
    stage = "access_log"
    format = "text"
    ...

Errors are `InvalidConfig` naming the file and the field.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct, field

from edgefn_core import tomlconf
from edgefn_core.errors import InvalidConfig
from gpu_worker import config as worker
from runtime.cache.settings import AICacheSettings, HttpCacheSettings
from runtime.net.server import ServerConfig
from runtime.observe.dashboard.settings import DashboardSettings
from runtime.observe.settings import EventsSettings, HealthSettings
from runtime.observe.settings_metrics import MetricsSettings
from runtime.observe.settings_tracing import TracingSettings
from runtime.security import residency
from runtime.security.residency import ResidencySettings
from runtime.security.settings import AuthSettings, BotSettings, RateLimitSettings, WafSettings

log = logging.getLogger("edgefn.config")

Port = Annotated[int, Meta(ge=0, le=65535)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class Listener(Struct, forbid_unknown_fields=True, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8080


class AdminListener(Struct, forbid_unknown_fields=True, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 0


class AIConfig(Struct, forbid_unknown_fields=True, frozen=True):
    """The model worker: started and supervised by the PoP unless `socket` names
    one already running."""

    enabled: bool = True
    worker_config: str | None = None
    socket: str | None = None
    # model -> the model that answers instead when its origin fails (overloaded, down,
    # silent) before any output; one hop, marked `x-edgefn-fallback` (runtime.ai.fallback)
    fallback: dict[str, str] = {}


class StoresConfig(Struct, forbid_unknown_fields=True, frozen=True):
    purge_interval: Annotated[float, Meta(gt=0)] = 60.0  # seconds between expired-key sweeps
    # MiB the KV namespaces of one owner may hold through its functions' writes (0: no
    # quota); the KV store (1 GiB) is shared, so one tenant cannot fill it for all
    kv_owner_quota_mb: Annotated[int, Meta(ge=0, le=1 << 20)] = 256
    # MiB of vectors (4 bytes a dimension) one owner's indexes may hold through its
    # functions' upserts (0: no quota): every index lives in the PoP's memory
    vectors_owner_quota_mb: Annotated[int, Meta(ge=0, le=1 << 20)] = 512
    # threads each owner's blocking binding calls (KV writes and lists, vector queries
    # and writes) run on, its own: one owner's backlog queued every other's calls
    binding_threads: Annotated[int, Meta(ge=1, le=64)] = 2


class FetchConfig(Struct, forbid_unknown_fields=True, frozen=True):
    """What functions' ``fetch`` may reach (`runtime.bindings.fetch`)."""

    # hosts ("localhost", "10.0.0.7", "*.internal", "db.internal:5432": shell wildcards,
    # lower case; with a port, that port only) functions may reach at a loopback,
    # private, link-local or reserved address, where their manifest's pattern names
    # the host literally: ["*"] (the default, for local mocks) any such host; [] none,
    # for a PoP whose tenants must reach nothing but the public internet (its own
    # ports and services on the box included)
    private_hosts: list[Annotated[str, Meta(min_length=1, max_length=260)]] = field(
        default_factory=lambda: ["*"])

    def __post_init__(self) -> None:
        for entry in self.private_hosts:
            private_host(entry)

    def hosts(self) -> tuple[tuple[str, int | None], ...]:
        """`private_hosts` as (host pattern in lower case, port or None: any)."""
        return tuple(private_host(entry) for entry in self.private_hosts)


def private_host(entry: str) -> tuple[str, int | None]:
    """A ``[fetch] private_hosts`` entry as (host pattern in lower case, port or None):
    ``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address. Raises
    ValueError (a ValidationError when decoded) for anything else."""
    host, port = entry.lower(), ""
    if host.startswith("["):
        host, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"private_hosts: {entry!r} is not [IPv6] or [IPv6]:port")
        port = rest[1:] if rest else ""
        if rest and not port:
            raise ValueError(f"private_hosts: {entry!r} has an empty port")
    elif host.count(":") == 1:
        host, port = host.split(":")
        if not port:
            raise ValueError(f"private_hosts: {entry!r} has an empty port")
    if not host or any(c.isspace() or c in "/@[]" for c in host):
        raise ValueError(f"private_hosts: {entry!r} is not a host, host:port or [IPv6]:port "
                         "(shell wildcards allowed in the host)")
    if port and not (port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise ValueError(f"private_hosts: {entry!r}: the port must be 1-65535")
    return host, int(port) if port else None


class WasmConfig(Struct, forbid_unknown_fields=True, frozen=True):
    """The WASM engine (`runtime.executors.wasm.engine`)."""

    # KiB at the start of each instance's linear memory that its reset (a fresh instance
    # per request) zeroes with memset, rounded up to 4 KiB pages; the rest is decommitted
    # (madvise), and pages a guest touched there fault in again at its next request. It
    # is the trade-off of the README's "Memory after a request" (bench/bench_reset.py)
    keep_resident_kib: Annotated[int, Meta(ge=0, le=1 << 20)] = 128
    # MiB of guest memory the requests on the worker threads (WASI commands, reactors
    # with bindings or long runs) may count together, each its function's
    # limits.memory_mb; past it a request waits for one to end (an owner counts at
    # most 3/8 of it). "auto": half of the machine's memory. PoP-wide: with `workers`
    # = N, each worker process holds 1/N of it (64 MiB at least)
    max_thread_memory_mb: Annotated[int, Meta(ge=64, le=1 << 24)] | Literal["auto"] = "auto"

    def thread_memory_mb(self) -> int:
        """`max_thread_memory_mb`, with "auto" half of the machine's memory."""
        if isinstance(self.max_thread_memory_mb, int):
            return self.max_thread_memory_mb
        return max(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 21, 64)


class PythonConfig(Struct, forbid_unknown_fields=True, frozen=True):
    """Python functions' isolates (`runtime.executors.python`)."""

    # MiB of the PoP's memory that Python isolates' large frames (1 MiB or more: whole
    # responses, KV values) may hold together while they arrive; past it a frame waits,
    # its isolate's socket unread, until one ends (an owner counts at most 3/8 of it).
    # "auto": a quarter of the machine's memory. PoP-wide: with `workers` = N, each
    # worker process holds 1/N of it (64 MiB at least)
    max_frame_memory_mb: Annotated[int, Meta(ge=64, le=1 << 24)] | Literal["auto"] = "auto"

    def frame_memory_mb(self) -> int:
        """`max_frame_memory_mb`, with "auto" a quarter of the machine's memory."""
        if isinstance(self.max_frame_memory_mb, int):
            return self.max_frame_memory_mb
        return max(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 22, 64)


# -- pipeline stages: a tagged union on `stage`, each with its own settings -----------------
class StageConfig(Struct, forbid_unknown_fields=True, frozen=True, tag_field="stage"):
    """One stage of the request pipeline."""


class RequestIdStage(StageConfig, frozen=True, tag="request_id"):
    """Every response carries `header`; a well-formed incoming one is kept."""

    header: str = "x-request-id"
    trust_incoming: bool = True


class HealthStage(StageConfig, frozen=True, tag="health"):
    """``[health]`` live/ready paths (and the OpenAI API's ``/health``), answered
    before everything else: probes make no event and no metric."""


class EventsStage(StageConfig, frozen=True, tag="events"):
    """One `Event` per request to the PoP's observers (ring, JSONL file, metrics);
    settings in ``[events]``."""


class TracingStage(StageConfig, frozen=True, tag="tracing"):
    """W3C ``traceparent`` in and out, and the request's trace ids for its spans;
    settings in ``[tracing]``. Put first by `runtime.pipeline.build` when tracing
    is on and the pipeline does not name it; left out when tracing is off."""


class AccessLogStage(StageConfig, frozen=True, tag="access_log"):
    """One line per request on stderr: ``text`` (key=value) or ``json``. A JSON line
    carries each stage's timing (``stages``) unless `stage_timings` is false: timing
    every stage times every request in Python, so a PoP that does leaves its native
    lane; without them (``"stages": {}``) the lane serves what it would."""

    format: Literal["text", "json"] = "text"
    stage_timings: bool = True


Origin = Annotated[str, Meta(pattern=r"^(\*|https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?)$")]
Token = Annotated[str, Meta(pattern=r"^(\*|[!#$%&'*+.^_`|~0-9A-Za-z-]+)$")]  # RFC 9110 token


class CorsStage(StageConfig, frozen=True, tag="cors"):
    """CORS for browsers (vLLM's ``--allowed-origins`` and its defaults), on the
    paths starting with one of `paths`: preflight ``OPTIONS`` answered (204), and
    ``access-control-allow-origin`` on responses to an allowed origin. ``"*"``
    allows any origin, method or header. Not in the default pipeline: add it
    before ``auth`` (a preflight carries no credentials)."""

    allowed_origins: tuple[Origin, ...] = ("*",)
    allowed_methods: tuple[Token, ...] = ("*",)
    allowed_headers: tuple[Token, ...] = ("*",)
    allow_credentials: bool = False
    max_age: Annotated[int, Meta(ge=0, le=86400)] = 600  # seconds a browser keeps a preflight
    paths: tuple[Annotated[str, Meta(pattern=r"^/")], ...] = ("/v1/",)


class WafStage(StageConfig, frozen=True, tag="waf"):
    """The OWASP Core Rule Set on libmodsecurity; settings in ``[waf]``."""


class BotsStage(StageConfig, frozen=True, tag="bots"):
    """Classify every client (browser, verified / declared AI agent, automation,
    abusive) and apply the class's policy; settings in ``[bots]``."""


class AuthStage(StageConfig, frozen=True, tag="auth"):
    """API keys and JWTs: who is calling (`Context.principal`); settings in ``[auth]``."""


class ResidencyStage(StageConfig, frozen=True, tag="residency"):
    """Tenants pinned to a region are served only in it; settings in ``[residency]``."""


class RateLimitStage(StageConfig, frozen=True, tag="ratelimit"):
    """Request rates and AI token budgets; settings in ``[ratelimit]``."""


class HttpCacheStage(StageConfig, frozen=True, tag="http_cache"):
    """The RFC 9111 cache of function responses; settings in ``[http_cache]``."""


class AICacheStage(StageConfig, frozen=True, tag="ai_cache"):
    """The exact and semantic caches of the OpenAI API; settings in ``[ai_cache]``."""


class OpenAIStage(StageConfig, frozen=True, tag="openai"):
    """The OpenAI-compatible API (/v1/chat/completions, ...); inactive without [ai]."""


class RouteStage(StageConfig, frozen=True, tag="route"):
    """Match (host, path) to a deployed function; 404 when none serves it."""


class DispatchStage(StageConfig, frozen=True, tag="dispatch"):
    """Run the routed function."""


Stage = (HealthStage | RequestIdStage | TracingStage | EventsStage | AccessLogStage | CorsStage
         | WafStage | BotsStage | AuthStage | ResidencyStage | RateLimitStage | HttpCacheStage
         | AICacheStage | OpenAIStage | RouteStage | DispatchStage)


def default_pipeline() -> list[Stage]:
    return [HealthStage(), RequestIdStage(), EventsStage(), AccessLogStage(), WafStage(),
            BotsStage(), AuthStage(), ResidencyStage(), RateLimitStage(), HttpCacheStage(),
            AICacheStage(), OpenAIStage(), RouteStage(), DispatchStage()]


class PopConfig(Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    name: Annotated[str, Meta(pattern=NAME_PATTERN)] = "edge-local"
    tier: Literal["edge", "regional", "central"] = "edge"
    geo: Annotated[str, Meta(max_length=64)] = ""  # where it runs ("fra", "us-east"): a label
    region: Annotated[str, Meta(max_length=64)] = ""  # its compliance region ([residency])
    data: str = ".edgefn"
    public: Listener = field(default_factory=Listener)
    admin: AdminListener = field(default_factory=AdminListener)
    http: ServerConfig = field(default_factory=ServerConfig)
    grace_seconds: Annotated[float, Meta(ge=0)] = 10.0  # in-flight requests finish on SIGTERM
    # PoP processes accepting on the public port (runtime.workers); "auto": os.cpu_count()
    workers: Annotated[int, Meta(ge=1, le=1024)] | Literal["auto"] = 1
    worker_header: bool = False  # debug: each response says which worker's pid served it
    # seconds a worker has to follow a deploy before it is killed and restarted
    worker_ack_timeout: Annotated[float, Meta(gt=0)] = 30.0
    # run Python functions even where a layer of their sandbox is missing (`edgefn doctor`)
    insecure_python: bool = False
    ai: AIConfig = field(default_factory=AIConfig)
    stores: StoresConfig = field(default_factory=StoresConfig)
    fetch: FetchConfig = field(default_factory=FetchConfig)
    wasm: WasmConfig = field(default_factory=WasmConfig)
    python: PythonConfig = field(default_factory=PythonConfig)
    auth: AuthSettings = field(default_factory=AuthSettings)
    waf: WafSettings = field(default_factory=WafSettings)
    bots: BotSettings = field(default_factory=BotSettings)
    ratelimit: RateLimitSettings = field(default_factory=RateLimitSettings)
    http_cache: HttpCacheSettings = field(default_factory=HttpCacheSettings)
    ai_cache: AICacheSettings = field(default_factory=AICacheSettings)
    events: EventsSettings = field(default_factory=EventsSettings)
    health: HealthSettings = field(default_factory=HealthSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)  # runtime.observe.metrics
    dashboard: DashboardSettings = field(  # runtime.observe.dashboard
        default_factory=DashboardSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)  # runtime.observe.tracing
    residency: ResidencySettings = field(  # runtime.security.residency
        default_factory=ResidencySettings)
    pipeline: list[Stage] = field(default_factory=default_pipeline)

    @property
    def data_dir(self) -> Path:
        return Path(self.data)

    def worker_count(self) -> int:
        """How many PoP processes serve: `workers`, with ``"auto"`` one a core."""
        return self.workers if isinstance(self.workers, int) else (os.cpu_count() or 1)

    def stage_names(self) -> list[str]:
        return [type(s).__struct_config__.tag for s in self.pipeline]  # type: ignore[misc]


def load(path: str | Path | None = None, *, under: Mapping[str, object] | None = None,
         **overrides: object) -> PopConfig:
    """The config in `path` (defaults when None), with `overrides` applied on top:
    top-level fields by name, nested ones as ``"public.port"``. `under`: top-level
    fields for where the file sets none (the CLI's ``$EDGEFN_DATA``: under the
    file's ``data``, over the built-in default); a None value is not given.

    Relative paths in the file (data, ai.worker_config, ai.socket, auth.jwt.jwks,
    bots.agents, bots.directories, metrics.token_file) are resolved
    against the file's folder. Raises `InvalidConfig` naming the file and field.
    """
    label = str(path) if path is not None else "<defaults>"
    raw: dict[str, object] = {}
    if path is not None:
        try:
            text = Path(path).read_bytes()
        except OSError as e:
            raise InvalidConfig(label, f"cannot read: {e.strerror}") from None
        raw = tomlconf.decode(text, dict, label)
        _resolve_paths(raw, Path(path).resolve().parent)
    for key, value in (under or {}).items():
        if value is not None:
            raw.setdefault(key, value)
    for key, value in overrides.items():
        if value is not None:
            _set(raw, key, value)
    try:
        config = msgspec.convert(raw, PopConfig)
    except msgspec.ValidationError as e:
        raise tomlconf.from_validation(label, str(e), kind=PopConfig) from None
    check(config, label)
    return config


def check(config: PopConfig, label: str = "<config>") -> None:
    """What the schema cannot say. Raises `InvalidConfig`."""
    if not _is_loopback(config.admin.host):
        raise InvalidConfig(label, f"the admin API listens on loopback only, got "
                            f"{config.admin.host!r}", "admin.host")
    _check_ports(config, label)
    problem = config.metrics.problem()
    if problem is not None:
        raise InvalidConfig(label, problem[1], f"metrics.{problem[0]}")
    problem = config.tracing.problem()
    if problem is not None:
        raise InvalidConfig(label, problem[1], f"tracing.{problem[0]}")
    residency.check(config.residency, label)
    for field_name in ("functions", "openai"):
        if getattr(config.auth, field_name) == "jwt" and config.auth.jwt is None:
            raise InvalidConfig(label, 'mode "jwt" needs an [auth.jwt] table (jwks or '
                                "secret_env) to verify tokens with; without it every request "
                                "would get 401", f"auth.{field_name}")
    _check_worker_config(config.ai, label)
    _check_events_file(config, label)
    _check_cache_embedder(config, label)
    for model, other in config.ai.fallback.items():
        if not model.strip() or not other.strip() or model == other:
            raise InvalidConfig(label, f"fallback {model!r} -> {other!r}: two different model "
                                "names", f"ai.fallback.{model}")
    names = config.stage_names()
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise InvalidConfig(label, f"stage {name!r} appears twice", f"pipeline[{i}].stage")
    if config.tracing.enabled and "events" not in names:
        raise InvalidConfig(label, "tracing makes its spans from the `events` stage's events: "
                            "add `events` to the pipeline", "tracing.enabled")
    _check_cors(config, names, label)
    if "dispatch" not in names:
        log.warning("%s: the pipeline has no `dispatch` stage, so no function is served; a "
                    "[[pipeline]] list replaces the default one: list every stage (README, "
                    "\"PoP config\")", label)
    if "dispatch" in names and ("route" not in names or names.index("route") > names.index(
            "dispatch")):
        raise InvalidConfig(label, "stage `dispatch` needs a `route` stage before it",
                            f"pipeline[{names.index('dispatch')}].stage")


def _check_ports(config: PopConfig, label: str) -> None:
    """Raises `InvalidConfig` for the admin API on the public port where both bind
    loopback: the second bind failed as "address already in use (is another PoP
    running?", which sent one looking for another PoP."""
    public, admin = config.public, config.admin
    if admin.port and admin.port == public.port and (
            public.host in ("", "0.0.0.0", "::") or _is_loopback(public.host)):
        raise InvalidConfig(label, f"{admin.port} is `public.port` too: the admin API needs a "
                            "port of its own (0: any free one)", "admin.port")


def _check_events_file(config: PopConfig, label: str) -> None:
    """Raises `InvalidConfig` for an ``[events] file`` outside DATA (absolute, or
    through ``..``) in a folder that does not exist: the PoP makes folders under DATA
    only (it made ``/nonexistent_x/`` at the root for one mistyped path)."""
    if not config.events.file:
        return
    data = os.path.abspath(config.data_dir)
    folder = os.path.dirname(os.path.abspath(os.path.join(data, config.events.file)))
    if not Path(folder).is_relative_to(data) and not os.path.isdir(folder):
        raise InvalidConfig(label, f"no such folder: {folder} (a file outside DATA goes in a "
                            "folder that exists; a relative path is under DATA)", "events.file")


def _check_worker_config(ai: AIConfig, label: str) -> None:
    """Raises `InvalidConfig` for a worker config the PoP would start its worker
    with that does not exist, and `WorkerConfigError` (its file and field) for one
    that does not load or names a missing model file: checked here, since a worker
    that cannot start on it is restarted forever."""
    if not ai.enabled or ai.socket is not None or ai.worker_config is None:
        return
    if not Path(ai.worker_config).is_file():
        raise InvalidConfig(label, f"no such file: {ai.worker_config} (the model worker's "
                            "config; leave it out for the packaged models)", "ai.worker_config")
    worker.load(ai.worker_config)


def _check_cache_embedder(config: PopConfig, label: str) -> None:
    """Raises `InvalidConfig` for a semantic cache whose embedding model this PoP
    forwards while tenants are pinned: every prompt it looks up would leave with no
    tenant to check (the embedding call carries none)."""
    model = config.ai_cache.embedding_model
    if config.residency.tenants and model in config.residency.uplink.models:
        raise InvalidConfig(label, f"the AI cache's embedding model {model!r} is forwarded "
                            "([residency.uplink] models) while tenants are pinned: their "
                            "prompts would leave the PoP; use a model served here",
                            "ai_cache.embedding_model")


def _check_cors(config: PopConfig, names: list[str], label: str) -> None:
    """Raises `InvalidConfig` for a ``cors`` stage after ``auth``, or one that
    allows credentials from any origin (browsers refuse that)."""
    if "cors" not in names:
        return
    at = names.index("cors")
    cors = config.pipeline[at]
    assert isinstance(cors, CorsStage)
    if "auth" in names and names.index("auth") < at:
        raise InvalidConfig(label, "stage `cors` must come before `auth`: a browser's preflight "
                            "carries no credentials", f"pipeline[{at}].stage")
    if cors.allow_credentials and "*" in cors.allowed_origins:
        raise InvalidConfig(label, "allow_credentials needs the origins listed: browsers refuse "
                            "credentials with `*`", f"pipeline[{at}].allow_credentials")


def _set(raw: dict[str, object], dotted: str, value: object) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for p in parents:
        child = node.setdefault(p, {})
        assert isinstance(child, dict)
        node = child
    node[leaf] = value


def _resolve_paths(raw: dict[str, object], base: Path) -> None:
    if isinstance(raw.get("data"), str):
        raw["data"] = str(base / str(raw["data"]))
    ai = raw.get("ai")
    if isinstance(ai, dict):
        for key in ("worker_config", "socket"):
            if ai.get(key) == "":  # as README's sample writes it: not set (the PoP's own
                del ai[key]  # worker, the packaged models); "" had named a socket to wait on
            elif isinstance(ai.get(key), str):
                ai[key] = str(base / ai[key])
    metrics = raw.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("token_file"), str):
        metrics["token_file"] = str(base / metrics["token_file"])
    auth = raw.get("auth")
    jwt = auth.get("jwt") if isinstance(auth, dict) else None
    if isinstance(jwt, dict) and isinstance(jwt.get("jwks"), str):
        jwt["jwks"] = str(base / jwt["jwks"])
    bots = raw.get("bots")
    if isinstance(bots, dict):
        if isinstance(bots.get("agents"), str):
            bots["agents"] = str(base / bots["agents"])
        if isinstance(bots.get("directories"), list):
            bots["directories"] = [d if not isinstance(d, str) or "://" in d else str(base / d)
                                   for d in bots["directories"]]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
