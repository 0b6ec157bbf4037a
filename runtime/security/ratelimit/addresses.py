"""Client addresses aggregated to a network, so a client spread over a /24 (IPv4)
or a /64 (IPv6) counts as one."""

from __future__ import annotations

import ipaddress

CACHE_SIZE = 4096  # recent addresses; the cache is dropped whole when full


class Aggregator:
    """``aggregator(ip) -> str``: the network `ip` belongs to, as ``"a.b.c.0/24"``,
    or `ip` itself at /32 and /128."""

    def __init__(self, ipv4_prefix: int = 32, ipv6_prefix: int = 128) -> None:
        self.v4, self.v6 = ipv4_prefix, ipv6_prefix
        self.identity = ipv4_prefix == 32 and ipv6_prefix == 128
        self.cache: dict[str, str] = {}

    def __call__(self, ip: str) -> str:
        if self.identity:
            return ip
        hit = self.cache.get(ip)
        if hit is None:
            if len(self.cache) >= CACHE_SIZE:
                self.cache.clear()
            hit = self.cache[ip] = self._network(ip)
        return hit

    def _network(self, ip: str) -> str:
        """An unparsable address (a Unix socket's peer) is its own network."""
        try:
            addr = ipaddress.ip_address(ip.strip("[]"))
        except ValueError:
            return ip
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        prefix = self.v4 if addr.version == 4 else self.v6
        return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False))
