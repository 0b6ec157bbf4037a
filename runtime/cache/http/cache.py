"""`HttpCache`: the store, the policy and single flight tied together, with
purges by key, path prefix, ``Cache-Tag`` and function. The ``http_cache``
stage (`runtime.pipeline.stages.http_cache`) drives it per request.

A primary key is the function's ``name@version`` label, the host, the path
and the query: a deploy or a rollback never meets the other version's entries.
Within one, a variant is chosen by the request headers its response's ``Vary``
names and by the caller's scope: a response that is not ``public`` is only
served to the caller scope it was stored for (anonymous, a tenant, or a
credential's hash), so tenants never share a non-public response.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path

from runtime.cache.http import policy
from runtime.cache.http.coalesce import Flights
from runtime.cache.http.labels import SharedLabels
from runtime.cache.http.store import Entry, TieredStore, Variants
from runtime.cache.settings import HttpCacheSettings
from runtime.net.message import Headers, Request, Response

MAX_VARIANTS = 8  # per URL; the oldest goes first
# header fields one response's Vary may list and still be stored: each lookup compares
# them (a Vary of 100k names against 3000 request headers held the loop 6-10 s a hit)
MAX_VARY = 16
PUBLIC = "*"  # the scope of a `public` response: any caller
# not stored with a response: hop-by-hop, computed per answer, or for the cache only
UNSTORED = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive",
                      b"age", b"cache-tag", b"x-edgefn-cache"})
# what a 304 carries over from the stored response (RFC 9110 15.4.5)
NOT_MODIFIED_FIELDS = frozenset({b"cache-control", b"content-location", b"date", b"etag",
                                 b"expires", b"vary", b"x-edgefn-function"})


PASS_SECONDS = 120.0  # a key whose response could not be stored is not coalesced this long
MAX_PASSES = 65536


class HttpCache:
    def __init__(self, settings: HttpCacheSettings, data_dir: Path | None = None,
                 clock: Callable[[], float] = time.time, writers: int = 1) -> None:
        """`data_dir`: the PoP's; the disk tier lives in DATA/cache/http (None: memory
        only), shared by `writers` processes (``workers = N``). `clock`: wall-clock
        seconds (stored entries outlive a restart). Raises `lmdb.Error` if the disk
        tier cannot be opened, `OSError` if its shared list of deployments that
        stored a response cannot (`SharedLabels`, with `writers` > 1)."""
        self.settings = settings
        self.clock = clock
        disk = data_dir / "cache" / "http" if data_dir is not None else None
        self.store = TieredStore(settings.memory_bytes, disk, settings.disk_bytes, writers)
        self.flights = Flights()
        # deployments (name@version) that stored a response: nothing of any other is
        # stored, so their requests need no lookup (see `HttpCacheStage`)
        self.caching: set[str] = {k.split(b"\0", 1)[0].decode() for k, _ in self.store.items()}
        # workers = N: the deployments that stored a response in any worker (`labels`)
        self.labels = SharedLabels(disk) if disk is not None and self.store.shared else None
        self.labels_seen = -1
        if self.labels is not None:
            self.labels_stamp()
        self.passes: dict[bytes, float] = {}  # key -> until when misses go straight through

    # -- single flight ----------------------------------------------------------------------
    def coalesces(self, key: bytes, label: str, default_ttl: int | None) -> bool:
        """Whether concurrent misses of `key` should wait for one origin call: only
        for a deployment that has stored a response before (or stores every
        response, `default_ttl`), and not while `key`'s last response could not be
        stored (for `PASS_SECONDS`: Varnish's hit-for-miss). Otherwise the
        concurrent requests of a function that never caches would queue behind
        each other, one origin call at a time."""
        if default_ttl is None and label not in self.caching:
            return False
        until = self.passes.get(key)
        if until is None:
            return True
        if until > self.clock():
            return False
        del self.passes[key]
        return True

    def stored(self, key: bytes, label: str) -> None:
        """A response to `key` was stored: its misses coalesce from now on (and, with
        workers, every worker looks `label`'s requests up from its next read on)."""
        if label not in self.caching:
            self.caching.add(label)
            if self.labels is not None:
                self.labels.add(label)
        self.passes.pop(key, None)

    def labels_stamp(self) -> int:
        """With workers (`labels`): a value that changes when any worker stores its
        first response of a deployment; `caching` holds those deployments once it
        was called. The planner calls it for each request, the native lane at each
        read (the http_cache stage's ``plan_stamp``)."""
        assert self.labels is not None
        n = self.labels.stamp()
        if n != self.labels_seen:
            self.caching.update(self.labels.fresh())
            self.labels_seen = n
        return n

    def passed(self, key: bytes) -> None:
        """A response to `key` could not be stored: don't make its misses wait."""
        if len(self.passes) >= MAX_PASSES:
            self.passes.clear()
        self.passes[key] = self.clock() + PASS_SECONDS

    # -- lookups ----------------------------------------------------------------------------
    @staticmethod
    def key(label: str, request: Request) -> bytes:
        """`label`: the deployment's ``name@version``; the host as `origin_host` reads it."""
        return b"\0".join((label.encode(), origin_host(request.host), request.path,
                            request.query))

    def lookup(self, key: bytes, request: Request, scope: str) -> Entry | None:
        """The stored variant `request` selects, fresh or not. Raises `StoreClosed`."""
        variants = self.store.get(key)
        if variants is None:
            return None
        fields = _request_fields(request, variants)
        for entry in variants:
            if _selects(entry, fields, scope):
                return entry
        return None

    def age(self, entry: Entry) -> float:
        return entry.initial_age + max(0.0, self.clock() - entry.stored_at)

    # -- storing ----------------------------------------------------------------------------
    def admit(self, key: bytes, request: Request, scope: str, response: Response,
              origin_ms: float, default_ttl: int | None) -> Entry | str:
        """Store `response` to `request` if RFC 9111 allows it: the new entry, or
        why it was not stored. Raises `StoreClosed`."""
        body = response.body
        if not isinstance(body, bytes):
            return "streamed"
        if len(body) > self.settings.max_entry_bytes:
            return "too large"
        fields = _fields(response.headers)
        if b"set-cookie" in fields:
            return "set-cookie"
        vary = _vary(fields.get(b"vary"), request)
        if vary is None:
            return "vary *"
        if len(vary) > MAX_VARY:
            return f"vary lists over {MAX_VARY} fields"
        now = self.clock()
        f = policy.freshness(response.status, policy.directives(fields.get(b"cache-control")),
                             fields.get(b"expires"), fields.get(b"date"), now,
                             scope != "", default_ttl)
        if isinstance(f, str):
            return f
        etag, modified = fields.get(b"etag"), fields.get(b"last-modified")
        if f.no_cache and etag is None and modified is None:
            return "no-cache without validator"
        tags = [t.strip() for t in fields.get(b"cache-tag", b"").decode("latin-1").split(",")
                if t.strip()]
        stored = _stored(response.headers)
        if b"date" not in fields:  # the front dates what it sends: a hit says when it was made
            stored.append((b"date", formatdate(now, usegmt=True).encode()))
        entry = Entry(response.status, stored, body, now,
                      _age(fields.get(b"age")), f.lifetime, f.swr, f.sie, f.revalidate,
                      f.no_cache, f.public, etag, modified, vary,
                      PUBLIC if f.public else scope, tags, origin_ms)
        self._put(key, request, scope, entry)
        return entry

    def refresh(self, key: bytes, request: Request, scope: str, entry: Entry,
                response: Response, default_ttl: int | None) -> Entry | str:
        """`entry` updated with a 304 from the origin (RFC 9111 4.3.4): its fields
        replace the stored ones and freshness starts again. Returns the entry to
        serve; a reason string if it may no longer be stored (it is dropped: the
        client's answer is then `updated`'s)."""
        result = self.admit(key, request, scope, updated(entry, response), entry.origin_ms,
                            default_ttl)
        if isinstance(result, str):
            self.invalidate(key)
        return result

    def _put(self, key: bytes, request: Request, scope: str, entry: Entry) -> None:
        old = self.store.get(key) or []
        fields = _request_fields(request, old)
        kept: Variants = [e for e in old if not _selects(e, fields, scope)]
        self.store.put(key, [entry, *kept][:MAX_VARIANTS])

    # -- invalidation and purges ------------------------------------------------------------
    def invalidate(self, key: bytes) -> bool:
        """Drop every variant of one URL (an unsafe method succeeded on it)."""
        return self.store.delete(key)

    def purge(self, *, key: str | None = None, prefix: str | None = None,
              tag: str | None = None, function: str | None = None,
              only: frozenset[str] | None = None) -> int:
        """Drop the entries of one URL (``http://host/path?query``, or a path and
        query on any host), a path prefix, a ``Cache-Tag`` or a function (all its
        versions): how many URLs went. Exactly one of those is given; `only`:
        the functions whose entries may go (None: all)."""
        match = _matcher(key, prefix, tag, function)
        gone = [k for k, tags in self.store.items() if match(k, tags)
                and (only is None or k.split(b"@", 1)[0].decode() in only)]
        for k in gone:
            self.store.delete(k)
        return len(gone)

    def close(self) -> None:
        self.store.close()
        if self.labels is not None:
            self.labels.close()
            self.labels = None


CONTENT_FIELDS = frozenset({b"content-type", b"content-length", b"content-encoding",
                            b"content-range"})


def updated(entry: Entry, response: Response) -> Response:
    """`entry`'s response with the fields of `response`, a 304 that validated it, over
    its own (RFC 9111 4.3.4)."""
    # what describes the stored content stays its own: a 304 has no content
    # (RFC 9110 15.4.5), and a Content-Type on one made a cached JSON body "text"
    fresh = [(k, v) for k, v in _stored(response.headers) if k not in CONTENT_FIELDS]
    new = _fields(fresh)
    # a 304 without a Date (the front dates it later) is dated now by `admit`: the
    # stored one with a restarted Age told caches below it was an hour old
    headers = [(k, v) for k, v in entry.headers if k not in new and k != b"date"]
    headers += fresh
    tags = _fields(response.headers).get(b"cache-tag") or ",".join(entry.tags).encode()
    if tags:  # kept from the stored response unless the 304 names others
        headers.append((b"cache-tag", tags))
    return Response(entry.status, headers, entry.body)


def served(entry: Entry, age: float, outcome: bytes, request: Request) -> Response:
    """The stored response as served: with ``Age`` and ``x-edgefn-cache``; a 304
    when the request's validators match it."""
    inm, ims = request.header(b"if-none-match"), request.header(b"if-modified-since")
    if (inm is not None or ims is not None) and entry.status == 200 and policy.not_modified(
            inm, ims, entry.etag, entry.last_modified):
        headers = [(k, v) for k, v in entry.headers if k in NOT_MODIFIED_FIELDS]
        return Response(304, [*headers, (b"age", b"%d" % age), (b"x-edgefn-cache", outcome)])
    return Response(entry.status, [*entry.headers, (b"age", b"%d" % age),
                                   (b"x-edgefn-cache", outcome)], entry.body)


def answered(response: Response, request: Request, outcome: bytes,
             conditional: bool = True) -> Response:
    """The origin's `response`, which was not stored, as the client gets it: its
    client view with ``x-edgefn-cache``, or a 304 when the client's validators
    (which the origin did not see: a miss asks for the full response) match a 200
    with a whole body (RFC 9110 13.2.2, as a server would answer them).
    `conditional` False: the caller saw the request carry no validator."""
    response.headers.append((b"x-edgefn-cache", outcome))
    if not conditional or response.status != 200 or request.method != b"GET" \
            or not isinstance(response.body, bytes):
        return client_view(response)
    inm = ims = None
    for k, v in request.headers:  # one pass (most requests carry neither)
        if k == b"if-none-match":
            inm = v if inm is None else inm
        elif k == b"if-modified-since":
            ims = v if ims is None else ims
    if inm is None and ims is None:
        return client_view(response)
    etag = last_modified = None
    for k, v in response.headers:
        if k == b"etag":
            etag = v
        elif k == b"last-modified":
            last_modified = v
    if not policy.not_modified(inm, ims, etag, last_modified):
        return client_view(response)
    return Response(304, [(k, v) for k, v in response.headers
                          if k in NOT_MODIFIED_FIELDS or k == b"x-edgefn-cache"])


def client_view(response: Response) -> Response:
    """`response` without what is for the cache only (``Cache-Tag``)."""
    for k, _ in response.headers:
        if k == b"cache-tag":
            response.headers = [(k, v) for k, v in response.headers if k != b"cache-tag"]
            break
    return response


def _selects(entry: Entry, fields: dict[bytes, bytes], scope: str) -> bool:
    """Whether `entry` answers a request of `scope` whose Vary'd header `fields`
    (`_request_fields`) are these."""
    if entry.scope != scope and entry.scope != PUBLIC:
        return False
    return all(fields.get(name) == value for name, value in entry.vary)


def _request_fields(request: Request, variants: Variants) -> dict[bytes, bytes]:
    """The request's values of every field the `variants` vary on, in one pass over
    its headers (it was one pass a field a variant)."""
    names = {name for entry in variants for name, _ in entry.vary}
    return _values(request.headers, names) if names else {}


def _values(headers: Headers, names: set[bytes]) -> dict[bytes, bytes]:
    """Each of `names` the headers hold: all its values joined with ", " (RFC 9110
    5.3); a name they lack is left out. An API key sent as ``x-api-key`` is a value
    of ``authorization`` (auth takes it from either: `Vary: Authorization` served one
    key's answer to another key, or to no key, sent that way)."""
    found: dict[bytes, list[bytes]] = {}
    credential = b"authorization" in names
    for k, v in headers:
        if k in names:
            found.setdefault(k, []).append(v.strip())
        elif credential and k == b"x-api-key":
            found.setdefault(b"authorization", []).append(b"x-api-key " + v.strip())
    return {k: b", ".join(vs) for k, vs in found.items()}


def _vary(value: bytes | None, request: Request) -> list[tuple[bytes, bytes | None]] | None:
    """The Vary'd request headers and their values; None for ``Vary: *``."""
    if not value:
        return []
    names = {n.strip().lower() for n in value.split(b",") if n.strip()}
    if b"*" in names:
        return None
    values = _values(request.headers, names) if len(names) <= MAX_VARY else {}
    return [(n, values.get(n)) for n in sorted(names)]


def _fields(headers: Headers) -> dict[bytes, bytes]:
    """Header values by lower-case name; repeated ones joined with ", "."""
    out: dict[bytes, bytes] = {}
    for k, v in headers:
        k = k.lower()
        out[k] = out[k] + b", " + v if k in out else v
    return out


def _stored(headers: Headers) -> Headers:
    return [(k.lower(), v) for k, v in headers if k.lower() not in UNSTORED]


def _age(value: bytes | None) -> float:
    """An origin's Age header, as RFC 9111 delta-seconds (0 if invalid, at most 2^31)."""
    return float(policy.delta_seconds(value.strip())) if value is not None else 0.0


def _matcher(key: str | None, prefix: str | None, tag: str | None,
             function: str | None) -> Callable[[bytes, frozenset[str]], bool]:
    if key is not None:
        host, target = _split_url(key)
        return lambda k, _: _url(k, host) == target
    if prefix is not None:
        p = prefix.encode()
        return lambda k, _: k.split(b"\0")[2].startswith(p)
    if tag is not None:
        return lambda _, tags: tag in tags
    assert function is not None
    name = function.encode() + b"@"
    return lambda k, _: k.startswith(name)


def origin_host(host: bytes) -> bytes:
    """`host` as one origin's: ``EXAMPLE.com``, ``example.com:80`` and ``example.com.``
    are ``example.com`` (each was an entry of its own, and a purge by URL named one)."""
    host = host.lower()
    if host.endswith(b":80"):
        host = host[:-3]
    if host.endswith(b"."):
        host = host.rstrip(b".") or b"."
    return host


def _split_url(url: str) -> tuple[bytes | None, bytes]:
    """``http://host/p?q`` -> (host, b"/p?q"); ``/p?q`` -> (None, b"/p?q")."""
    _, sep, rest = url.partition("://")
    if not sep:
        return None, url.encode()
    host, slash, path = rest.partition("/")
    return origin_host(host.encode()), (slash + path).encode() or b"/"


def _url(k: bytes, host: bytes | None) -> bytes | None:
    """A primary key's path?query, if its host is `host` (any when None)."""
    _, khost, path, query = k.split(b"\0")
    if host is not None and khost != host:
        return None
    return path + b"?" + query if query else path
