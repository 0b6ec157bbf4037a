"""Routing: (host, path) -> the deployed function that serves it, and its captures.

A route is a path prefix matched on segment boundaries (``/api`` serves
``/api`` and ``/api/x`` but not ``/apix``), optionally bound to a host
(``example.com`` or ``*.example.com``). Its path may capture segments and name
the rest (`runtime.functions.manifest.parse_path`): ``/users/:id`` serves
``/users/42`` and ``/users/42/posts`` with ``id = "42"``; ``/files/*`` serves
``/files``, ``/files/`` and ``/files/a/b`` with ``* = ""``, ``""`` and ``"a/b"``.
Captured values are the raw path's bytes as latin-1 text (not percent-decoded).
A percent-escape matches whatever case its hex digits are written in (RFC 3986
6.2.2.1: ``/caf%c3%a9`` is ``/caf%C3%A9``): a manifest's routes are written in
upper case (`runtime.functions.manifest.canonical_path`; a hit names the route so)
and a request's path is matched in upper case too; what a route captures keeps the
request's case.
A plain prefix captures nothing: its hit carries the shared, read-only
`NO_PARAMS`, so a hit on it allocates nothing.

Precedence, most specific first:

1. a route bound to the request's host, then one bound to a wildcard host
   (longer suffix first), then a host-less one: the first of these tables
   with any match decides;
2. within a table, compare segment by segment from the left: a literal
   segment beats a capture, which beats the end of a route (its remainder,
   named by ``*`` or not). So ``/users/me`` beats ``/users/:id`` on
   ``/users/me/x``, ``/users/:id`` beats ``/users``, and among literal
   prefixes the longer wins.

Two routes that match the same paths (``/users/:id`` and ``/users/:name``;
``/api`` and ``/api/*``) on the same host conflict unless one function owns
both. A `Router` is immutable: a deploy builds a new one and swaps the
reference, so a request sees one consistent table. A table with no captures or
wildcards is scanned with plain byte comparisons, as before patterns existed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from edgefn_core.abi import WILDCARD
from edgefn_core.errors import RouteConflict
from runtime.functions.manifest import PathPattern, Route, canonical_path, parse_path

type Hit[T] = tuple[T, str, Mapping[str, str]]  # (target, route path as written, captures)
NO_PARAMS: Mapping[str, str] = MappingProxyType({})


def overlap(a: Route, b: Route) -> bool:
    """Whether some request matches both routes: hosts that can be one (a host-less
    route takes every host), and paths alike segment by segment as far as the
    shorter goes (a capture takes any segment; past its end a route takes any;
    percent-escapes in either case alike)."""
    if not _hosts_meet(a.host, b.host):
        return False
    sa = parse_path(canonical_path(a.path)).segments
    sb = parse_path(canonical_path(b.path)).segments
    return all(x == y or x.startswith(":") or y.startswith(":") for x, y in zip(sa, sb,
                                                                                strict=False))


def _hosts_meet(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    a, b = a.lower(), b.lower()
    if a.startswith("*.") and b.startswith("*."):
        return a.endswith(b[1:]) or b.endswith(a[1:])
    if a.startswith("*."):
        return b.endswith(a[1:])
    if b.startswith("*."):
        return a.endswith(b[1:])
    return a == b


def _conflict(route: Route, owner: str) -> RouteConflict:
    host = f" on host {route.host}" if route.host else ""
    return RouteConflict(f"route {route.path!r}{host} is already served by function {owner!r}",
                         route.path, owner)


class _Literal[T]:
    """A plain prefix route."""

    __slots__ = ("exact", "hit", "rank", "route", "slash", "target")

    def __init__(self, route: str, pattern: PathPattern, target: T) -> None:
        self.route = route
        self.rank = _rank(pattern)
        self.exact = route.rstrip("/").encode() or b"/"
        self.slash = self.exact if self.exact.endswith(b"/") else self.exact + b"/"
        self.target = target
        self.hit: Hit[T] = (target, route, NO_PARAMS)  # built once: a hit allocates nothing

    def params(self, path: bytes, raw: bytes) -> Mapping[str, str] | None:
        if path == self.exact or path.startswith(self.slash) or self.exact == b"/":
            return NO_PARAMS
        return None


class _Pattern[T]:
    """A route with captures or a final wildcard, compiled to one regex."""

    __slots__ = ("names", "rank", "regex", "route", "target")

    def __init__(self, route: str, pattern: PathPattern, target: T) -> None:
        self.route = route
        self.rank = _rank(pattern)
        self.target = target
        self.names = [s[1:] for s in pattern.segments if s.startswith(":")]
        parts = [b"/" + (rb"([^/]+)" if s.startswith(":") else re.escape(s.encode()))
                 for s in pattern.segments]
        if pattern.wildcard:
            self.names.append(WILDCARD)
            parts.append(rb"(?:/(.*))?\Z" if parts else rb"/?(.*)\Z")
        else:
            parts.append(rb"(?:/|\Z)")
        self.regex = re.compile(b"".join(parts), re.DOTALL)

    def params(self, path: bytes, raw: bytes) -> Mapping[str, str] | None:
        """What the route captures of `path` (matched), taken from `raw` (the request's
        own bytes, of `path`'s length); None if it does not match."""
        m = self.regex.match(path)
        if m is None:
            return None
        return {n: raw[m.start(i):m.end(i)].decode("latin-1") if m.start(i) >= 0 else ""
                for i, n in enumerate(self.names, 1)}


type _Entry[T] = _Literal[T] | _Pattern[T]
type _Table[T] = tuple[Callable[[list, bytes, bytes], Hit[T] | None],
                      list[_Entry[T]]]  # (scan, entries)
_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}")


def _upper(m: re.Match[bytes]) -> bytes:
    return m[0].upper()


def _rank(pattern: PathPattern) -> tuple[int, ...]:
    """Sorts routes most specific first (see the module docstring): per segment,
    2 for a literal, 1 for a capture; 0 for where the route ends."""
    return (*(1 if s.startswith(":") else 2 for s in pattern.segments), 0)


class Router[T]:
    def __init__(self, routes: Iterable[tuple[Route, str, T]] = ()) -> None:
        """Build from (route, owner name, target). Raises `RouteConflict` when two
        owners claim routes that match the same paths on the same host, and
        `ValueError` for a path `parse_path` refuses (manifests are checked first)."""
        owners: dict[tuple[str | None, str], str] = {}
        hosts: dict[str | None, list[_Entry[T]]] = {}
        for route, owner, target in routes:
            host = route.host.lower() if route.host else None
            path = canonical_path(route.path)
            pattern = parse_path(path)
            key = (host, pattern.shape)
            if owners.setdefault(key, owner) != owner:
                raise _conflict(route, owners[key])
            kind = _Literal if pattern.literal else _Pattern
            hosts.setdefault(host, []).append(kind(path, pattern, target))
        self._any_scan, self._any = _table(hosts.pop(None, []))
        named = {h: _table(e) for h, e in hosts.items() if h is not None}
        self._exact = {h: t for h, t in named.items() if not h.startswith("*.")}
        self._wild = sorted(((h[1:].encode(), t) for h, t in named.items() if h.startswith("*.")),
                            key=lambda w: len(w[0]), reverse=True)

    @property
    def host_bound(self) -> bool:
        """Whether some route is bound to a host (a request's Host then matters)."""
        return bool(self._exact or self._wild)

    def match(self, host: bytes, path: bytes) -> Hit[T] | None:
        """The target for a request, the route (as written) it matched and what the
        route captured; None if no route matches."""
        raw = path
        if b"%" in path:
            path = _ESCAPE.sub(_upper, path)
        if self._exact or self._wild:
            name = host.split(b":", 1)[0].lower()
            table = self._exact.get(name.decode("latin-1"))
            if table is not None and (hit := table[0](table[1], path, raw)):
                return hit
            for suffix, (scan, entries) in self._wild:
                if name.endswith(suffix) and (hit := scan(entries, path, raw)):
                    return hit
        return self._any_scan(self._any, path, raw)


def _table[T](entries: list[_Entry[T]]) -> _Table[T]:
    """A scan over `entries` in precedence order; byte comparisons only when no
    entry is a pattern."""
    entries.sort(key=lambda e: e.rank, reverse=True)
    if all(isinstance(e, _Literal) for e in entries):
        return _scan_literal, entries
    return _scan, entries


def _scan_literal[T](entries: list[_Literal[T]], path: bytes, raw: bytes) -> Hit[T] | None:
    for e in entries:
        if path == e.exact or path.startswith(e.slash) or e.exact == b"/":
            return e.hit
    return None


def _scan[T](entries: list[_Entry[T]], path: bytes, raw: bytes) -> Hit[T] | None:
    for e in entries:
        params = e.params(path, raw)
        if params is not None:
            return e.target, e.route, params
    return None
