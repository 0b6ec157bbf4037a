"""The function manifest, ``edgefn.toml``, and its validation.

Every error is a `ManifestError` naming the file, the field and what was
expected, e.g. ``hello/edgefn.toml: field `limits.cpu_ms`: expected `int` >= 1``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, NamedTuple
from urllib.parse import quote, unquote

from msgspec import Meta, Struct, field

from edgefn_core import tomlconf
from edgefn_core.errors import ManifestError
from runtime.cache.settings import CacheOverride
from runtime.security.principal import TENANT_PATTERN
from runtime.security.settings import AuthMode, BotOverride, RateRule, TargetPolicy, WafOverride

MANIFEST_NAME = "edgefn.toml"
NAME_PATTERN = TENANT_PATTERN  # a function's name is its tenant where it sets no owner
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
HOST_PATTERN = r"^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})?(:[0-9]{1,5})?$"  # any version's
# what a new deploy's host must be: a host name (labels of letters, digits and `-`), or
# `*.` before one (a wildcard); no port (`*`, `*example.com`, `a..b` and `h:8080` matched
# no Host: a request's Host is matched without its port)
HOST_NAME = r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,62})?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62})?)*$"
CAPTURE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENTRY_SUFFIXES = {"wasm": (".wasm", ".wat"), "python": (".py",)}
MAX_CPU_MS = 60_000  # documented maxima (README "Manifest reference"); a longer budget never
MAX_MEMORY_MB = 1024  # delays other requests: see `runtime.executors.wasm.function.INLINE_SLICE_MS`
MAX_WALL_MS = 300_000
MAX_CONCURRENCY = 256
DEFAULT_CONCURRENCY = 32
# what `runtime.executors.wasm.wasi.environ` sets for a WASI guest: these names, and per
# header, capture and principal field a name with one of these prefixes
WASI_CGI_NAMES = frozenset({"REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL",
                            "CONTENT_LENGTH", "CONTENT_TYPE", "X_MATCHED_ROUTE", "REMOTE_ADDR",
                            "REMOTE_USER", "EDGEFN_WILDCARD"})
WASI_CGI_PREFIXES = ("HTTP_", "EDGEFN_PARAM_", "EDGEFN_PRINCIPAL_")


class Route(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A path prefix, optionally only for one Host (``example.com``, ``*.example.com``).
    The path may hold captures and end in a wildcard: see `parse_path`."""

    path: str
    host: str | None = None


class PathPattern(NamedTuple):
    """A route's path, parsed: `segments` are literals or ``:name`` captures;
    `wildcard` is true when it ends in ``/*``."""

    segments: tuple[str, ...]
    wildcard: bool

    @property
    def literal(self) -> bool:
        """No captures and no wildcard: a plain prefix, matched as bytes."""
        return not self.wildcard and not any(s.startswith(":") for s in self.segments)

    @property
    def shape(self) -> str:
        """What the pattern matches, ignoring capture names and the wildcard (which
        only names the rest a prefix covers anyway): routes of one shape conflict."""
        return "/" + "/".join(":" if s.startswith(":") else s for s in self.segments)


def canonical_path(path: str) -> str:
    """`path` with its percent-escapes' hex digits in upper case, the form RFC 3986
    6.2.2.1 calls canonical (``/caf%c3%a9`` -> ``/caf%C3%A9``): what routes are
    written and requests matched in (`runtime.functions.router`)."""
    return _ESCAPE.sub(lambda m: m[0].upper(), path) if "%" in path else path


_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def parse_path(path: str) -> PathPattern:
    """Parse a route path. A segment ``:name`` captures one non-empty segment; a last
    segment ``*`` captures the rest of the path (possibly empty) as ``*``. Every
    route is a prefix on segment boundaries; a trailing ``/`` is ignored.

    Raises `ValueError` (the message says what was expected) for a path not
    starting with ``/`` or with ``?``, ``#`` or whitespace, a ``*`` that is not
    the whole last segment, a ``:`` that does not start a valid capture name,
    a capture name used twice (ignoring case), or an empty segment in a
    pattern. Nothing that looks like a pattern is ever taken literally. (What a
    new deploy is refused besides: `_check_new_routes`.)
    """
    if not path.startswith("/"):
        raise ValueError(f"expected a path prefix starting with `/`, got {path!r}")
    if any(c in path for c in "?# \t\r\n"):
        raise ValueError(f"expected a path without `?`, `#` or whitespace (a query is not "
                         f"routed on; percent-encode a space as %20), got {path!r}")
    segments = tuple(path.rstrip("/").split("/")[1:])
    wildcard = segments[-1:] == ("*",)
    if wildcard:
        segments = segments[:-1]
    seen: set[str] = set()
    for seg in segments:
        _check_segment(seg, path, seen)
    pattern = PathPattern(segments, wildcard)
    if not pattern.literal and "" in segments:
        raise ValueError(f"expected no empty segment (`//`) in a route with captures or `*`, "
                         f"got {path!r}")
    return pattern


def _check_segment(seg: str, path: str, seen: set[str]) -> None:
    if "*" in seg:
        raise ValueError(f"expected `*` only as the whole last segment (like `/files/*`), "
                         f"got {path!r}")
    if ":" not in seg:
        return
    if not seg.startswith(":"):
        raise ValueError(f"expected `:` only at the start of a segment (a capture like "
                         f"`/users/:id`), got {seg!r} in {path!r}")
    if not re.match(CAPTURE_PATTERN, seg[1:]):
        raise ValueError(f"expected a capture name after `:` (a letter or `_`, then letters, "
                         f"digits or `_`), got {seg!r} in {path!r}")
    if seg[1:].lower() in seen:
        raise ValueError(f"expected each capture name once (ignoring case), got {seg!r} twice "
                         f"in {path!r}")
    seen.add(seg[1:].lower())


class Limits(Struct, forbid_unknown_fields=True, frozen=True):
    """Per-request limits, and `concurrency`: the most requests of the function in
    flight at once on this PoP (past it: 503 ``concurrency_limit``)."""

    cpu_ms: Annotated[int, Meta(ge=1, le=MAX_CPU_MS)] = 50
    memory_mb: Annotated[int, Meta(ge=1, le=MAX_MEMORY_MB)] = 64
    wall_ms: Annotated[int, Meta(ge=1, le=MAX_WALL_MS)] = 5_000
    max_response_mb: Annotated[int, Meta(ge=1, le=256)] = 16
    concurrency: Annotated[int, Meta(ge=1, le=MAX_CONCURRENCY)] = DEFAULT_CONCURRENCY


class Pool(Struct, forbid_unknown_fields=True, frozen=True):
    """Python isolates: `min` start with the function, up to `max` under load; each
    is replaced by a fresh one after `recycle_after` requests; `standby` keeps a
    second, warm host process ready to take over if the first crashes; `pipeline`:
    when every isolate is busy, how many requests may be sent ahead to each (run
    after its current one, without a wake-up round trip; taken back if another
    isolate frees up first), 0: none; "auto": while the function's requests take
    under half a millisecond each, as many as finish within a millisecond, packed
    onto busy isolates before an idle one is woken, else none
    (`runtime.executors.python.scheduler`)."""

    min: Annotated[int, Meta(ge=1, le=32)] = 1
    max: Annotated[int, Meta(ge=1, le=32)] = 4
    recycle_after: Annotated[int, Meta(ge=1)] = 100_000
    standby: bool = True
    pipeline: Annotated[int, Meta(ge=0, le=32)] | Literal["auto"] = "auto"


OwnerName = Annotated[str, Meta(pattern=NAME_PATTERN)]


class Grant(Struct, forbid_unknown_fields=True, frozen=True):
    """Other owners that may bind one of this owner's namespaces or indexes: `read`
    only reads it, `write` also writes it."""

    read: list[OwnerName] = []
    write: list[OwnerName] = []


class Share(Struct, forbid_unknown_fields=True, frozen=True):
    """What this function's owner lets other owners bind, by namespace / index name."""

    kv: dict[OwnerName, Grant] = {}
    vectors: dict[OwnerName, Grant] = {}


class Bindings(Struct, forbid_unknown_fields=True, frozen=True):
    """Capabilities a function asks for; anything not declared here is denied.

    A KV namespace or vector index belongs to the owner of the first function that
    binds it; a function of another owner may bind it only if `share` (in one of
    the owner's functions) grants it.
    """

    kv: list[Annotated[str, Meta(pattern=NAME_PATTERN)]] = []
    vectors: list[Annotated[str, Meta(pattern=NAME_PATTERN)]] = []
    ai: bool = False
    # URL patterns (fnmatch) the function may fetch: "https://api.example.com/*"
    fetch: list[Annotated[str, Meta(pattern=r"^https?://[^/*?\[]*[^/]*(/.*)?$",
                                    max_length=2048)]] = []
    share: Share = field(default_factory=Share)


class Manifest(Struct, forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, Meta(pattern=NAME_PATTERN)]
    runtime: Literal["wasm", "python"]
    entry: str
    routes: Annotated[list[str | Route], Meta(min_length=1)]
    abi: Literal["auto", "reactor", "wasi"] = "auto"
    limits: Limits = field(default_factory=Limits)
    env: dict[Annotated[str, Meta(pattern=ENV_NAME_PATTERN)], str] = {}
    bindings: Bindings = field(default_factory=Bindings)
    handler: Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "handle"
    pool: Pool = field(default_factory=Pool)
    owner: OwnerName | None = None
    # what it asks of the security stages; None: the PoP's settings (README "Security")
    auth: AuthMode | None = None
    waf: WafOverride | None = None
    bots: BotOverride | None = None
    rate_limits: list[RateRule] = []
    cache: CacheOverride = field(default_factory=CacheOverride)  # README "Caches"
    # a side-effect-free path the PoP GETs before switching to a new version
    # (`runtime.functions.warmup`); it must be served by one of `routes`
    warmup: Annotated[str, Meta(pattern=r"^/[^#\s]*$", max_length=2048)] | None = None

    def route_list(self, *, canonical: bool = True) -> list[Route]:
        """The routes, their paths' percent-escapes in upper case (`canonical_path`)
        unless `canonical` is false (as written: what a manifest error quotes)."""
        written = [Route(r) if isinstance(r, str) else r for r in self.routes]
        return [Route(canonical_path(r.path), r.host) for r in written] if canonical else written

    @property
    def policy(self) -> TargetPolicy:
        return TargetPolicy(self.auth, self.waf, self.bots, self.rate_limits)

    @property
    def tenant(self) -> str:
        """Who owns what this function binds: `owner`, or the function's own name."""
        return self.owner or self.name


def load(directory: str | Path, *, new: bool = True) -> Manifest:
    """Read and validate ``DIR/edgefn.toml``. `new` False: a version already stored,
    which skips the checks only new deploys get (`_check_new`), so what an older
    edgefn stored keeps loading.

    Raises `ManifestError` (naming the file and the field) if the file is
    missing, is not valid TOML, does not match the schema, or names an entry
    file that does not exist.
    """
    path = Path(directory) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(str(path),
                            "no such file: every function folder needs an edgefn.toml") from None
    except OSError as e:
        raise ManifestError(str(path), f"cannot read: {e.strerror}") from e
    manifest = parse(raw, str(path), new=new)
    _check_entry(manifest, Path(directory), str(path))
    return manifest


def parse(raw: bytes, file: str, *, new: bool = True) -> Manifest:
    """Decode and validate manifest bytes; `file` is only used in messages; `new` as
    for `load`.

    Raises `ManifestError`.
    """
    manifest = tomlconf.decode(raw, Manifest, file, ManifestError)
    _check_semantics(manifest, file)
    if new:
        _check_new(manifest, file)
    return manifest


def _check_semantics(m: Manifest, file: str) -> None:
    suffixes = ENTRY_SUFFIXES[m.runtime]
    if not m.entry.endswith(suffixes):
        wanted = " or ".join(f"`{s}`" for s in suffixes)
        raise ManifestError(file, f"expected a {wanted} file for runtime `{m.runtime}`", "entry")
    if m.runtime == "python" and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\.py$", m.entry):
        raise ManifestError(file, "expected a module file at the top of the function folder, "
                            f"named like a Python module, got {m.entry!r}", "entry")
    if m.pool.min > m.pool.max:
        raise ManifestError(file, f"expected `pool.min` <= `pool.max`, got {m.pool.min} > "
                            f"{m.pool.max}", "pool.min")
    if Path(m.entry).is_absolute() or ".." in Path(m.entry).parts:
        raise ManifestError(file, "expected a path inside the function folder", "entry")
    _check_routes(m.route_list(canonical=False), file)
    _check_share(m, file)


def _check_new(m: Manifest, file: str) -> None:
    """Checks added after versions were stored (so a new deploy gets them, a stored
    version does not). Raises `ManifestError` for a route no request can reach
    (`_check_new_routes`), or a field the function's runtime never reads, set to
    something other than its default (it would be silently ignored): `handler` and
    `pool` are Python's (a WASM module exports its own entry points and gets a fresh
    instance per request), `abi` is WASM's; or, for ``abi = "wasi"``, an `env` entry
    the guest would not get as written (`wasi_env_problem`: a CGI variable's name, a
    NUL in the value); for a Python function, a NUL in an `env` value."""
    _check_new_routes(m.route_list(canonical=False), file)
    if m.runtime == "wasm":
        if m.handler != "handle":
            raise ManifestError(file, "`handler` applies to Python functions only (a WASM "
                                "module's entry points are its exports)", "handler")
        if m.pool != Pool():
            raise ManifestError(file, "`pool` applies to Python functions only (a WASM "
                                "function gets a fresh instance per request)", "pool")
        if m.abi == "wasi":
            for name, value in m.env.items():
                problem = wasi_env_problem(name, value)
                if problem is not None:
                    raise ManifestError(file, problem, f"env.{name}")
    elif m.abi != "auto":
        raise ManifestError(file, "`abi` applies to WASM functions only", "abi")
    else:  # Python: the env is its host process's (`os.environ`), which holds no NUL
        for name, value in m.env.items():  # (the host failed to start, "main.py's fault")
            if "\0" in value:
                raise ManifestError(file, "expected a value without NUL (a Python function's "
                                    f"environment is its process's), got {value!r}",
                                    f"env.{name}")


def wasi_cgi_name(name: str) -> bool:
    """Whether `name` is one the PoP sets for each request of a WASI command."""
    return name in WASI_CGI_NAMES or name.startswith(WASI_CGI_PREFIXES)


def wasi_env_problem(name: str, value: str) -> str | None:
    """Why an `env` entry would not reach a WASI guest as written, or None: a name the
    PoP sets for each request (`WASI_CGI_NAMES`, `WASI_CGI_PREFIXES`; the request's
    variable wins, `runtime.executors.wasm.wasi.environ`), or a NUL in the value (the
    guest's environment is C strings: it ended there)."""
    if wasi_cgi_name(name):
        like = next((f" (`{p}*`)" for p in WASI_CGI_PREFIXES if name.startswith(p)), "")
        return (f"{name!r} is named like a CGI variable the PoP sets for each request{like}, "
                "which a WASI guest gets instead: choose another name")
    if "\0" in value:
        return ("expected a value without NUL (a WASI guest's environment is C strings: "
                f"it would end at the NUL), got {value!r}")
    return None


def _check_share(m: Manifest, file: str) -> None:
    """Raises `ManifestError` for a share of a name the function does not bind, with
    its own owner, or with one owner both to read and to write."""
    for kind, declared in (("kv", m.bindings.kv), ("vectors", m.bindings.vectors)):
        grants: dict[str, Grant] = getattr(m.bindings.share, kind)
        for name, grant in grants.items():
            where = f"bindings.share.{kind}.{name}"
            if name not in declared:
                raise ManifestError(file, f"expected a name listed in `bindings.{kind}` (only "
                                    f"what the function binds can be shared), got {name!r}",
                                    where)
            if m.tenant in grant.read or m.tenant in grant.write:
                raise ManifestError(file, f"{m.tenant!r} is the owner; share with other "
                                    "owners only", where)
            both = sorted(set(grant.read) & set(grant.write))
            if both:
                raise ManifestError(file, f"{both[0]!r} is in both `read` and `write` "
                                    "(`write` includes reading)", where)


def _host_ok(host: str) -> bool:
    """A host name, or `*.` and one; no port: a request's Host is matched without its
    port, so `example.com:8080` matched no request."""
    return len(host) <= 255 and re.match(HOST_NAME, host) is not None


def _check_new_routes(routes: list[Route], file: str) -> None:
    """Raises `ManifestError` naming ``routes[i]`` for what no request can reach, which
    a new deploy is refused (a stored version keeps serving what it served): an empty
    segment (`//` was read as the catch-all `/`, `/a//b` served `/a/b`), a `.` or `..`
    segment, plain or percent-encoded (the front answers 400 to every such request),
    or a host that is not a host name or `*.` and one (a port: hosts are matched
    without theirs)."""
    for i, route in enumerate(routes):
        where = f"routes[{i}]"
        if "//" in route.path:
            raise ManifestError(file, f"expected no empty segment (`//`) in a route, got "
                                f"{route.path!r}", where)
        if not all("\x21" <= c <= "\x7e" for c in route.path):  # raw bytes are matched:
            raise ManifestError(file, f"expected a path of printable ASCII (percent-encode "
                                f"the rest, as clients send it: {quote(route.path, safe='/:*')!r}"
                                f"), got {route.path!r}", where)  # "/a/é" matched nothing
        if any(unquote(seg) in (".", "..") for seg in route.path.split("/")):
            raise ManifestError(file, f"expected no `.` or `..` segment (requests with one "
                                f"are refused), got {route.path!r}", where)
        if route.host is not None and not _host_ok(route.host):
            raise ManifestError(file, f"expected a host name (`*.example.com` for a wildcard; "
                                f"no port: a request's Host is matched without its port), got "
                                f"{route.host!r}", f"{where}.host")


def _check_routes(routes: list[Route], file: str) -> None:
    """Raises `ManifestError` naming ``routes[i]`` for a bad path or host, or a route
    that matches the same paths as an earlier one."""
    seen: dict[tuple[str | None, str], str] = {}
    for i, route in enumerate(routes):
        where = f"routes[{i}]"
        try:
            shape = parse_path(canonical_path(route.path)).shape
        except ValueError as e:
            raise ManifestError(file, str(e), where) from None
        if route.host is not None and not re.match(HOST_PATTERN, route.host):
            raise ManifestError(file, f"expected a host name, got {route.host!r}", f"{where}.host")
        key = (route.host.lower() if route.host else None, shape)
        if key in seen:
            same = "" if seen[key] == route.path else f" (it matches what {seen[key]!r} does)"
            raise ManifestError(file, f"duplicate route {route.path!r}{same}", where)
        seen[key] = route.path


def _check_entry(m: Manifest, directory: Path, file: str) -> None:
    entry = directory / m.entry
    if not entry.is_file():
        raise ManifestError(file, f"entry file {m.entry!r} does not exist in {directory}", "entry")
