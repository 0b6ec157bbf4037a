"""Routing: (host, path) -> the deployed function that serves it.

A route is a path prefix matched on segment boundaries (``/api`` serves
``/api`` and ``/api/x`` but not ``/apix``), optionally bound to a host
(``example.com`` or ``*.example.com``). Host-bound routes win over host-less
ones; then the longest prefix wins. A `Router` is immutable: a deploy builds a
new one and swaps the reference, so a request sees one consistent table.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgefn_core.errors import RouteConflict
from runtime.functions.manifest import Route


def _conflict(route: Route, owner: str) -> RouteConflict:
    host = f" on host {route.host}" if route.host else ""
    return RouteConflict(f"route {route.path!r}{host} is already served by function {owner!r}",
                         route.path, owner)


class _Entry[T]:
    __slots__ = ("exact", "prefix", "slash", "target")

    def __init__(self, prefix: str, target: T) -> None:
        self.prefix = prefix
        self.exact = prefix.rstrip("/").encode() or b"/"
        self.slash = self.exact if self.exact.endswith(b"/") else self.exact + b"/"
        self.target = target


class Router[T]:
    def __init__(self, routes: Iterable[tuple[Route, str, T]] = ()) -> None:
        """Build from (route, owner name, target). Raises `RouteConflict` when two
        owners claim the same (host, path)."""
        owners: dict[tuple[str | None, str], str] = {}
        hosts: dict[str | None, list[_Entry[T]]] = {}
        for route, owner, target in routes:
            host = route.host.lower() if route.host else None
            key = (host, route.path.rstrip("/") or "/")
            if owners.setdefault(key, owner) != owner:
                raise _conflict(route, owners[key])
            hosts.setdefault(host, []).append(_Entry(route.path, target))
        for entries in hosts.values():
            entries.sort(key=lambda e: len(e.exact), reverse=True)
        self._any = hosts.pop(None, [])
        named = {h: e for h, e in hosts.items() if h is not None}
        self._exact = {h: e for h, e in named.items() if not h.startswith("*.")}
        self._wild = [(h[1:].encode(), e) for h, e in named.items() if h.startswith("*.")]

    def match(self, host: bytes, path: bytes) -> tuple[T, str] | None:
        """The target for a request and the route prefix it matched, or None."""
        if self._exact or self._wild:
            name = host.split(b":", 1)[0].lower()
            entries = self._exact.get(name.decode("latin-1"))
            if entries is not None and (hit := _scan(entries, path)):
                return hit
            for suffix, entries in self._wild:
                if name.endswith(suffix) and (hit := _scan(entries, path)):
                    return hit
        return _scan(self._any, path)


def _scan[T](entries: list[_Entry[T]], path: bytes) -> tuple[T, str] | None:
    for e in entries:
        if path == e.exact or path.startswith(e.slash) or e.exact == b"/":
            return e.target, e.prefix
    return None
