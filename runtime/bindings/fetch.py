"""The fetch capability: a function's only way out of its sandbox, an HTTP(S) request
made by the PoP to a URL its manifest allows (``[bindings] fetch = [patterns]``).

    fetch {url, method?, headers?, body? (base64), timeout_ms?}
        -> {status, headers: {name: value}, header_list: [[name, value], ...],
            body (base64)}   (`headers` joins a repeated field with ", ", as fetch's
            ``Headers.get`` does; `header_list` has each, e.g. every Set-Cookie)

Rules, checked here in one place:
- the URL must match one of the manifest's patterns (``https://api.example.com/*``:
  shell wildcards, matched part by part: scheme, host[:port], path and query; see
  `matches`), scheme http or https;
- the host's addresses are resolved once and the connection goes to the address
  that was checked (no second lookup a DNS answer could change): loopback,
  private, link-local, multicast and reserved addresses are refused unless the
  pattern names that host literally (no wildcard in its host part) and the PoP's
  ``[fetch] private_hosts`` lets functions reach it (`private_ok`; by default any);
- a timeout (the call's ``timeout_ms``, at most the function's wall-time limit, which
  the subrequest counts against anyway) and a response cap (`MAX_RESPONSE`);
- redirects are not followed: a 3xx comes back to the function as it is;
- loops end: each subrequest carries the calling request's ``CDN-Loop`` (RFC 8586)
  with ``edgefn`` added, and a request that already came through `MAX_HOPS` of them
  may fetch no more (a function fetching its own URL looped for minutes, every
  level waiting on the next, long after the first client had gone);
- trees end: the entry names the request tree (``edgefn; tree=<id>``: the id of
  the client's request, drawn when it first fetches, kept by every subrequest it
  causes), and a tree may make `MAX_SUBREQUESTS` fetches on one PoP process
  (`Subrequests`): depth alone let a function fetching itself 3 times per level
  make ~7,300 subrequests for one client request.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import secrets
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import quote, urlsplit

import httptools

from edgefn_core.errors import BindingError
from runtime.bindings.codec import b64, base64_bytes, known
from runtime.bindings.threads import OwnerThreads
from runtime.functions.manifest import MAX_WALL_MS
from runtime.net.message import LOOP_ID, hops

MAX_RESPONSE = 8 << 20  # bytes of response body a subrequest may bring back
# a response's header fields, and their bytes (names and values): a repeated field was
# joined anew at each repeat (150,000 of them held the loop 1.8 s), 1,000,000 distinct
# ones took 370 MB and a reply the isolate could not read
MAX_RESPONSE_FIELDS = 1000
MAX_RESPONSE_HEAD = 256 << 10
# a request header's name: an RFC 9110 token ("Host " or "transfer-encoding\t" reached
# the server as sent); a value: no control character but HTAB
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# a URL's path and query as sent: printable ASCII; anything above it percent-encoded as
# UTF-8, as a browser sends it (latin-1 could not encode it)
_AS_IS = "".join(chr(c) for c in range(0x21, 0x7F))
MAX_REQUEST = 8 << 20
DEFAULT_TIMEOUT_MS = 10_000
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# set by the PoP, not the function
HOP_BY_HOP = frozenset({"host", "connection", "content-length", "transfer-encoding", "keep-alive",
                        "upgrade", "te", "trailer", "proxy-authorization", "proxy-connection",
                        "cdn-loop"})
ARGS = frozenset({"url", "method", "headers", "body", "timeout_ms"})
MAX_HOPS = 8  # edgefn subrequests one chain of requests may go through
MAX_SUBREQUESTS = 200  # fetches one request tree may make on one PoP process
# how long a tree's count is kept: past the longest a tree can live, each of its
# MAX_HOPS levels fetching just before its wall limit (900 s let one reset at 15 min)
TREE_SECONDS = (MAX_HOPS + 1) * MAX_WALL_MS / 1000
MAX_TREES = 1 << 16  # trees counted at once (the oldest is forgotten past it)
# the key under which the executors pass the calling request's `Lineage` (set by the
# host, whatever the guest put there: `runtime.bindings.Bindings.call`)
LOOP_ARG = "cdn_loop"
_TREE = re.compile(r"^[0-9a-f]{16}$")


class Lineage:
    """Where a request stands in a tree of subrequests: its CDN-Loop (`cdn_loop`,
    None without one) and the tree's id (`tree`: the one its last ``edgefn`` entry
    names, or drawn once, when a request no edgefn fetch made first fetches).
    One per request, made by the executor; its fetches all share it."""

    __slots__ = ("_tree", "cdn_loop")

    def __init__(self, cdn_loop: str | None = None) -> None:
        self.cdn_loop = cdn_loop
        self._tree: str | None = None

    @property
    def tree(self) -> str:
        if self._tree is None:
            self._tree = _named_tree(self.cdn_loop) or secrets.token_hex(8)
        return self._tree

    def onward(self) -> str:
        """The CDN-Loop a subrequest of this request carries."""
        mine = f"{LOOP_ID}; tree={self.tree}"
        return f"{self.cdn_loop}, {mine}" if self.cdn_loop else mine


def _named_tree(cdn_loop: str | None) -> str | None:
    """The tree the last edgefn entry of `cdn_loop` names (16 hex digits; anything
    else, as from a client, names none)."""
    for entry in reversed((cdn_loop or "").split(",")):
        cdn_id, _, params = entry.partition(";")
        if cdn_id.strip().lower() != LOOP_ID:
            continue
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "tree" and _TREE.match(value.strip()):
                return value.strip()
        return None
    return None


class Subrequests:
    """How many fetches each request tree made on this PoP process, kept
    `TREE_SECONDS` from its first and for at most `MAX_TREES` trees. Thread-safe
    (WASM guests fetch from worker threads). With ``workers = N`` each worker
    counts the part of a tree it serves."""

    def __init__(self, limit: int = MAX_SUBREQUESTS, seconds: float = TREE_SECONDS,
                 most: int = MAX_TREES, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.limit, self.seconds, self.most, self.clock = limit, seconds, most, clock
        self.trees: OrderedDict[str, list[float]] = OrderedDict()  # id: [first, count]
        self.lock = threading.Lock()

    def take(self, tree: str) -> None:
        """Count one fetch of `tree`. Raises `BindingError` if it made `limit` already."""
        now = self.clock()
        with self.lock:
            trees = self.trees
            while trees and now - next(iter(trees.values()))[0] >= self.seconds:
                trees.popitem(last=False)
            seen = trees.get(tree)
            if seen is None:
                if len(trees) >= self.most:
                    trees.popitem(last=False)
                trees[tree] = [now, 1]
                return
            if seen[1] >= self.limit:
                raise BindingError(
                    f"fetch: refused: this request and the subrequests it caused made "
                    f"{self.limit} fetches already (at most {self.limit} per client "
                    f"request on a PoP); does a function fetch its own URL?")
            seen[1] += 1


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # with the query


def parse_url(url: str) -> Target:
    """Raises `BindingError` for a URL that is not absolute http(s)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise BindingError(f"fetch: bad URL {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BindingError(f"fetch: bad URL {url!r}: expected http:// or https:// and a host")
    if parts.username or parts.password:
        raise BindingError(f"fetch: bad URL {url!r}: credentials in URLs are not allowed")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c <= " " or c == "\x7f" for c in path):  # a request line of its own making
        raise BindingError(f"fetch: bad URL {url!r}: a space or control character in its "
                           "path or query (percent-encode it)")
    path = quote(path, safe=_AS_IS)
    return Target(parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https"
                                                                   else 80), path)


def matches(pattern: str, url: str) -> bool:
    """Whether `url` is one `pattern` allows, part by part: a wildcard in the scheme or
    the host part matches within that part only (``https://*.example.com/*`` does not
    take ``https://evil.net/x.example.com/`` or ``https://evil.net?.example.com/``);
    the rest is a shell pattern over the path and query (an empty path is ``/``). A
    pattern with no path allows any (``https://api.example.com``, as in a CSP source)."""
    p_scheme, p_sep, p_rest = pattern.partition("://")
    u_scheme, u_sep, u_rest = url.partition("://")
    if not p_sep or not u_sep:
        return False
    p_host, p_path = _authority(p_rest)
    u_host, u_path = _authority(u_rest)
    if p_host.startswith("["):  # an IPv6 literal, not a character class: `[::1]` matched
        p_host = p_host.replace("[", "[[]")  # no URL, its own included
    if not (fnmatchcase(u_scheme.lower(), p_scheme.lower())
            and fnmatchcase(u_host.lower(), p_host.lower())):
        return False
    return not p_path or fnmatchcase(_rooted(u_path), _rooted(p_path))


def _rooted(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def _authority(rest: str) -> tuple[str, str]:
    """``host[:port]`` and what follows it (from the first ``/``, ``?`` or ``#``)."""
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return rest[:end], rest[end:]


def _pattern_host(pattern: str) -> str:
    host = _authority(pattern.split("://", 1)[-1])[0].rsplit("@", 1)[-1]
    if host.startswith("["):
        return host[1:].split("]", 1)[0].lower()
    return host.rsplit(":", 1)[0].lower() if host.count(":") == 1 else host.lower()


def private_ok(private_hosts: tuple[tuple[str, int | None], ...], host: str, port: int) -> bool:
    """Whether `private_hosts` (``[fetch] private_hosts``, `FetchConfig.hosts`) lets a
    function reach `host` (lower case; an IPv6 one without brackets) on `port` at a
    private address."""
    return any(fnmatchcase(host, pattern) and at in (None, port)
               for pattern, at in private_hosts)


NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: IPv4 in the low 32 bits
# not global, whatever `is_global` says: site-local (deprecated), IPv4-compatible
# (deprecated), IPv4-translated, and NAT64's local-use prefix (its IPv4 may sit anywhere)
NOT_GLOBAL = tuple(ipaddress.ip_network(n) for n in ("fec0::/10", "::/96", "::ffff:0:0:0/96",
                                                      "64:ff9b:1::/48"))


def _public(ip: str) -> bool:
    """Whether `ip` is a global unicast address, an IPv4 one embedded in IPv6 (mapped,
    NAT64, 6to4) judged as itself. Only what IANA lists as globally reachable: a
    deny list of address kinds let 100.64.0.0/10 (shared address space, a cloud's
    metadata service at 100.100.100.200) and NAT64's 64:ff9b::7f00:1 through."""
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
        ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.teredo is not None or any(addr in net for net in NOT_GLOBAL):
            return False
        elif addr in NAT64:
            addr = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        elif addr.sixtofour is not None:
            addr = addr.sixtofour
    return addr.is_global and not addr.is_multicast


class FetchBinding:
    def __init__(self, owner: str, patterns: list[str], wall_ms: int,
                 subrequests: Subrequests | None = None,
                 resolve_on: tuple[OwnerThreads, str] | None = None,
                 private_hosts: tuple[tuple[str, int | None], ...] = (("*", None),)) -> None:
        """`subrequests`: the PoP's count of fetches per request tree (one shared by
        every function; None: a count of this binding's own). `resolve_on`: the
        threads and tenant its DNS lookups run on (`OwnerThreads`: a slow resolver
        one tenant points at holds only that tenant's threads; None: the loop's
        resolver, shared by everyone). `private_hosts`: the PoP's ``[fetch]
        private_hosts`` (`FetchConfig.hosts`)."""
        self.owner = owner
        self.patterns = list(patterns)
        self.wall_ms = wall_ms
        self.subrequests = subrequests if subrequests is not None else Subrequests()
        self.resolve_on = resolve_on
        self.private_hosts = private_hosts

    def allowed(self, url: str) -> tuple[Target, str]:
        """The target, and why it may not be at a private address ("": it may, a
        matching pattern names its host literally and the PoP's `private_hosts`
        has it). Raises `BindingError` if no pattern matches."""
        target = parse_url(url)
        matching = [p for p in self.patterns if matches(p, url)]
        if not matching:
            allowed = ", ".join(self.patterns) or "none: add `fetch = [...]` to [bindings]"
            raise BindingError(f"fetch: {url!r} is not allowed for function {self.owner!r} "
                               f"(allowed: {allowed})")
        if not any(_pattern_host(p) == target.host for p in matching):
            return target, "list that host in the pattern explicitly to allow it"
        if not private_ok(self.private_hosts, target.host, target.port):
            return target, ("this PoP's [fetch] private_hosts does not let functions "
                            "reach it")
        return target, ""

    async def call(self, args: dict[str, Any], traceparent: str | None = None,
                   lineage: Lineage | None = None) -> dict[str, Any]:
        """One subrequest; it carries `traceparent` (the calling request's span) unless
        the function set that header itself, and the calling request's CDN-Loop with
        ``edgefn; tree=..`` added (`lineage`; None: a request without one, of its
        own). Raises `BindingError` (denied, a loop, its tree's fetches spent,
        unreachable, timed out, too large) and KeyError/TypeError/ValueError for bad
        arguments."""
        if lineage is None:
            lineage = Lineage()
        if (n := hops(lineage.cdn_loop)) >= MAX_HOPS:
            raise BindingError(f"fetch: refused, a loop: the calling request already came "
                               f"through {n} edgefn subrequests (its CDN-Loop header; at "
                               f"most {MAX_HOPS}); does a function fetch its own URL?")
        known(args, ARGS, "fetch")
        url = str(args["url"])
        method = str(args.get("method") or "GET").upper()
        if method not in METHODS:
            raise BindingError(f"fetch: method {method!r} is not one of "
                               f"{', '.join(sorted(METHODS))}")
        body = base64_bytes(args, "body") if args.get("body") is not None else b""
        if len(body) > MAX_REQUEST:
            raise BindingError(f"fetch: request body larger than {MAX_REQUEST} bytes")
        headers = {str(k).lower(): str(v) for k, v in dict(args.get("headers") or {}).items()}
        for k, v in headers.items():
            if not TOKEN.fullmatch(k) or CONTROL.search(v):
                raise BindingError(f"fetch: invalid header {k!r}: a name is a token (letters, "
                                   "digits, !#$%&'*+-.^_`|~) and a value holds no control "
                                   "character but tab")
        if traceparent is not None:
            headers.setdefault("traceparent", traceparent)
        headers["cdn-loop"] = lineage.onward()
        asked = args.get("timeout_ms") or DEFAULT_TIMEOUT_MS
        if type(asked) not in (int, float) or not 1 <= asked < 1e12:  # 0.5 was cut to 0
            # ms; a WASM guest's JSON may say Infinity, which int() refused uncaught
            raise ValueError(f"timeout_ms must be a number of milliseconds, at least 1, got "
                             f"{asked!r:.40}")
        timeout_ms = min(int(asked), self.wall_ms)
        target, not_private = self.allowed(url)
        self.subrequests.take(lineage.tree)  # an allowed fetch, about to be made
        try:
            return await asyncio.wait_for(self._fetch(target, not_private, method, headers,
                                                      body),
                                          timeout_ms / 1000)
        except TimeoutError:
            raise BindingError(f"fetch: {url!r} timed out after {timeout_ms} ms") from None
        except (OSError, ssl.SSLError) as e:
            raise BindingError(f"fetch: {url!r} failed: {e}") from None

    async def _fetch(self, t: Target, not_private: str, method: str, headers: dict[str, str],
                     body: bytes) -> dict[str, Any]:
        """`not_private`: why `t` may not be at a private address ("": it may)."""
        if self.resolve_on is None:
            infos = await asyncio.get_running_loop().getaddrinfo(t.host, t.port,
                                                                 type=socket.SOCK_STREAM)
        else:
            threads, tenant = self.resolve_on
            infos = await threads.run(tenant, functools.partial(
                socket.getaddrinfo, t.host, t.port, type=socket.SOCK_STREAM))
        if not infos:
            raise BindingError(f"fetch: cannot resolve {t.host!r}")
        ip = str(infos[0][4][0])
        if not_private and not _public(ip):
            raise BindingError(f"fetch: {t.host!r} resolves to {ip}, a loopback or private "
                               f"address: {not_private}")
        ctx = ssl.create_default_context() if t.scheme == "https" else None
        reader, writer = await asyncio.open_connection(
            ip, t.port, ssl=ctx, server_hostname=t.host if ctx else None)
        try:
            default_port = 443 if t.scheme == "https" else 80
            host = t.host if t.port == default_port else f"{t.host}:{t.port}"
            if ":" in t.host and not t.host.startswith("["):
                host = f"[{t.host}]" if t.port == default_port else f"[{t.host}]:{t.port}"
            lines = [f"{method} {t.path} HTTP/1.1", f"host: {host}", "connection: close",
                     "user-agent: edgefn-fetch", f"content-length: {len(body)}"]
            lines += [f"{k}: {v}" for k, v in headers.items() if k not in HOP_BY_HOP]
            lines.append(f"cdn-loop: {headers['cdn-loop']}")
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            return await _read_response(reader, method == "HEAD")
        finally:
            writer.close()


class _Response:
    """httptools callbacks collecting one response, its body capped."""

    def __init__(self, head: bool) -> None:
        self.head = head  # an answer to HEAD has no body, whatever its content-length says
        self.headers: dict[str, str] = {}  # repeated ones joined by ", " (as fetch's get())
        self.pairs: list[list[str]] = []  # each field as it came (Set-Cookie's are not joined)
        self.chunks: list[bytes] = []
        self.size = 0
        self.head_size = 0
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        """Raises `BindingError` past `MAX_RESPONSE_FIELDS` or `MAX_RESPONSE_HEAD`."""
        self.head_size += len(name) + len(value)
        if len(self.pairs) >= MAX_RESPONSE_FIELDS or self.head_size > MAX_RESPONSE_HEAD:
            raise BindingError(f"fetch: response headers past {MAX_RESPONSE_FIELDS} fields or "
                               f"{MAX_RESPONSE_HEAD} bytes")
        self.pairs.append([name.decode("latin-1").lower(), value.decode("latin-1")])

    def on_headers_complete(self) -> None:
        joined: dict[str, list[str]] = {}
        for key, text in self.pairs:  # joined once each (at each repeat: quadratic)
            joined.setdefault(key, []).append(text)
        self.headers = {key: ", ".join(texts) for key, texts in joined.items()}
        if self.head:
            self.done = True

    def on_body(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > MAX_RESPONSE:
            raise BindingError(f"fetch: response larger than {MAX_RESPONSE} bytes")
        self.chunks.append(data)

    def on_message_complete(self) -> None:
        self.done = True


async def _read_response(reader: asyncio.StreamReader, head: bool) -> dict[str, Any]:
    r = _Response(head)
    parser = httptools.HttpResponseParser(r)
    try:
        while not r.done:
            data = await reader.read(1 << 16)
            if not data:  # the server closed: a body without a length ends here
                if parser.get_status_code():
                    break
                raise BindingError("fetch: the server closed the connection before answering")
            parser.feed_data(data)
    except httptools.HttpParserError as e:
        if isinstance(e.__context__, BindingError):
            raise e.__context__ from None
        raise BindingError(f"fetch: malformed response: {e}") from None
    return {"status": parser.get_status_code(), "headers": r.headers, "header_list": r.pairs,
            "body": b64(b"".join(r.chunks))}
