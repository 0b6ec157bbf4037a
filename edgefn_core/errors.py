"""The one exception tree of edgefn: the runtime, kv, gpu_worker and the isolates
all raise these.

Every error has a machine-readable `code`, the HTTP `status` a client receives
for it, and a message (``str(err)``) that points at the data: a manifest error
names the file and the field, a function error the function and the limit it
hit. Classes whose code and status vary take them as ``(code, status, message)``,
in that order; the others fix both and take only the message.

    EdgefnError
    ├── InvalidConfig            a pop.toml, worker config or manifest that cannot be used
    │   ├── ManifestError
    │   └── WorkerConfigError
    ├── DeployError              a deploy rejected; nothing changed
    │   ├── RouteConflict
    │   ├── NotOwner             a namespace or index another owner holds
    │   ├── OutOfRegion          a pinned tenant's function outside its region (451)
    │   ├── VersionTampered      stored files that no longer match their hash
    │   └── SandboxMissing       Python functions refused: a sandbox layer is missing
    ├── SandboxError             an isolate host could not apply a sandbox layer
    ├── NotFound                 a function, version, model, key or stream that does not exist
    │   └── NoRoute              no function serves a request
    ├── DataDirBusy
    ├── Interrupted              a PoP stopped by a signal while it started
    ├── ProtocolError            a peer that does not speak the frame format
    ├── HttpReject               a request the HTTP front refuses (4xx)
    ├── Failure                  (code, status, message) chosen where it is raised
    │   ├── FunctionError        user code failed: trap, limit, bad response, crash
    │   ├── WorkerError          the model worker refused one request
    │   │   ├── WorkerDead       ... or is not running
    │   │   └── EngineError      raised inside the worker by an engine
    │   ├── ApiError             an OpenAI API request refused (OpenAI's error shape)
    │   ├── Rejected             a security stage refused a request (401, 403, 429)
    │   └── AdminError           the admin API's answer, as the CLI sees it
    ├── BindingError             a binding call denied or failed (the message is for the function)
    └── StoreError               kv: the stores' errors
        ├── StoreClosed
        ├── UnknownNamespace
        ├── KeyNotFound
        ├── LimitExceeded
        └── InvalidValue

This module is stdlib-only: it is imported inside isolated subinterpreters too.
"""

from __future__ import annotations


class EdgefnError(Exception):
    """Base of every error edgefn raises on purpose."""

    code = "internal_error"
    status = 500

    @property
    def message(self) -> str:
        return str(self)


class Failure(EdgefnError):
    """An error whose code and HTTP status are chosen where it is raised."""

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


# -- configuration and deploys --------------------------------------------------------------
class InvalidConfig(EdgefnError):
    """A config file that cannot be used. `str(err)` reads
    ``<file>: field `<field>`: <what was expected>``."""

    code = "invalid_config"
    status = 400

    def __init__(self, file: str, message: str, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        where = f"{file}: field `{field}`" if field else file
        super().__init__(f"{where}: {message}")


class ManifestError(InvalidConfig):
    """An ``edgefn.toml`` is missing, unparsable or invalid."""

    code = "invalid_manifest"


class WorkerConfigError(InvalidConfig):
    """A model worker config (TOML) that cannot be used."""


class DeployError(EdgefnError):
    """A deploy was rejected (bad package, module, route conflict); nothing changed."""

    code = "deploy_rejected"
    status = 400


class OutOfRegion(DeployError):
    """A function of a tenant pinned to another region: this PoP does not take it (a
    topology rollout leaves such PoPs as they were)."""

    code = "residency_violation"
    status = 451


class SandboxMissing(DeployError):
    """This machine lacks a layer of the Python sandbox and the PoP was not started
    with ``--insecure-python``: Python functions are refused."""

    code = "sandbox_missing"
    status = 503


class SandboxError(EdgefnError):
    """Raised inside an isolate host that could not apply one of its sandbox layers
    (the message names the layer and the system call that failed)."""

    code = "sandbox_failed"


class RouteConflict(DeployError):
    """Two functions, or a function and a built-in endpoint, claim the same route."""

    code = "route_conflict"
    status = 409

    def __init__(self, message: str, path: str = "", owner: str = "") -> None:
        super().__init__(message)
        self.path, self.owner = path, owner


class NotOwner(DeployError):
    """A function binds a KV namespace or vector index that another owner holds and
    has not shared with it (or shares one it does not own)."""

    code = "not_owner"
    status = 403


class VersionTampered(DeployError):
    """A stored version's files no longer match the hash they were deployed with
    (edited, added or removed after the deploy): that version is not loaded."""

    code = "version_tampered"
    status = 500


class RolloutError(DeployError):
    """A rollout across PoPs did not happen; the message names each PoP that failed,
    why, and what was done about the others (aborted, put back)."""

    code = "rollout_failed"
    status = 409


class NotFound(EdgefnError):
    """A function, version, model, key or stream that does not exist was named."""

    code = "not_found"
    status = 404


class NoRoute(NotFound):
    """No deployed function serves the request's host and path."""

    code = "no_route"


class Starting(EdgefnError):
    """No deployed function serves the request's host and path yet, and one may
    soon: `edgefn dev` is still deploying its folders (answered with ``Retry-After``)."""

    code = "starting"
    status = 503


class DataDirBusy(EdgefnError):
    """Another PoP holds this data dir."""

    code = "data_dir_busy"
    status = 409


class Interrupted(EdgefnError):
    """SIGTERM or SIGINT stopped a PoP while it started (runtime.app `StopSignals`):
    what had started unwound. `signum`: the signal's number."""

    code = "interrupted"
    status = 503

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} while starting")
        self.signum = signum


class ProtocolError(EdgefnError):
    """A peer sent something that is not a frame (too large, empty, undecodable);
    the connection is unusable."""

    code = "protocol_error"
    status = 502


class HttpReject(EdgefnError):
    """A request the HTTP front refuses before any application sees it."""

    code = "bad_request"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- failures with a status chosen where they happen -------------------------------------------
class FunctionError(Failure):
    """A user function failed. `code` is stable: ``trap``, ``cpu_limit``,
    ``memory_limit``, ``wall_limit``, ``bad_response``, ``binding``, ``crash``. Its
    message, which may carry the function's text (a trap's, a binding's refusal of
    its arguments), is kept to `MAX_MESSAGE` characters: it goes into the response
    and the PoP's log (a 30 MiB call name went into both)."""

    MAX_MESSAGE = 4096

    def __init__(self, code: str, status: int, message: str) -> None:
        if len(message) > self.MAX_MESSAGE:
            message = message[:self.MAX_MESSAGE] + f" [cut: {len(message)} characters]"
        super().__init__(code, status, message)


class WorkerError(Failure):
    """The model worker refused or failed one request; it is still serving."""


class WorkerDead(WorkerError):
    """The model worker is not running: it died with the request in flight, or did
    not come back in time."""

    def __init__(self, message: str) -> None:
        super().__init__("worker_unavailable", 503, message)


class EngineError(WorkerError):
    """A request a model engine refuses or cannot serve; the worker stays healthy."""


class ApiError(Failure):
    """An OpenAI API request refused; `param` names the offending field."""

    def __init__(self, code: str, status: int, message: str, param: str | None = None) -> None:
        super().__init__(code, status, message)
        self.param = param


class Rejected(Failure):
    """A security stage (auth, WAF, bots, rate limits) refused the request: 401
    ``unauthorized``, 403 ``forbidden`` / ``waf_blocked`` / ``bot_blocked``, 429
    ``rate_limited`` / ``token_budget`` / ``challenge``. `headers` go on the response
    (``Retry-After``, ``RateLimit``, ``WWW-Authenticate``); `detail` is added to the
    error body (the WAF's rule ids, a challenge's instructions)."""

    def __init__(self, code: str, status: int, message: str,
                 headers: list[tuple[bytes, bytes]] | None = None,
                 detail: dict[str, object] | None = None) -> None:
        super().__init__(code, status, message)
        self.headers = headers or []
        self.detail = detail or {}


class AdminError(Failure):
    """The PoP's admin API refused a request; code and status come from its answer."""


class BindingError(EdgefnError):
    """A binding call the function may not make, or one that failed; the message is
    for the function."""

    code = "binding"
    status = 400


# -- kv ----------------------------------------------------------------------------------------
class StoreError(EdgefnError):
    """Base of the KV and vector stores' errors; messages name the namespace, key or index."""

    code = "store_error"
    status = 400


class StoreClosed(StoreError):
    """The store or index was used after `close()`."""

    code = "store_closed"
    status = 503


class UnknownNamespace(StoreError):
    """A namespace or index that was never created."""

    code = "unknown_namespace"
    status = 404


class KeyNotFound(StoreError):
    """A key or id that does not exist where one is required."""

    code = "key_not_found"
    status = 404


class LimitExceeded(StoreError):
    """A key, value, metadata or batch over its size limit."""

    code = "limit_exceeded"
    status = 413


class InvalidValue(StoreError):
    """A value of the wrong shape: a non-integer to increment, a bad cursor, a vector
    of the wrong dimension."""

    code = "invalid_value"


# -- inside isolates ---------------------------------------------------------------------------
class IsolateStop(EdgefnError):
    """Raised out of an isolate's serve loop when it must not be restarted (its module
    cannot be imported, or the PoP went away)."""

    code = "isolate_stopped"


class IsolateWedged(EdgefnError):
    """Raised out of an isolate's serve loop when its interpreter cannot be closed: a
    thread the function started is still running (blocked in C code) after being
    told to stop. The host leaves that interpreter behind and asks to be replaced."""

    code = "isolate_wedged"


class IsolateInterrupt(BaseException):
    """Raised asynchronously in a Python handler's thread when it runs past a limit.

    The one class outside `EdgefnError`, on purpose: a BaseException, so that a
    handler's ``except Exception`` cannot swallow it.
    """

    code = "cpu_limit"


class CpuInterrupt(IsolateInterrupt):
    code = "cpu_limit"


class WallInterrupt(IsolateInterrupt):
    code = "wall_limit"


class ThreadStop(IsolateInterrupt):
    """Raised asynchronously in a thread a function started that is still running
    once its request has been answered."""

    code = "thread_stopped"
