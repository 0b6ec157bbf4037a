"""pop.toml ``[metrics]``: the Prometheus metrics of `runtime.observe.metrics`.

    [metrics]
    enabled = true
    token = "..."                 # or token_file = "metrics.token": scrapers send
                                  # `Authorization: Bearer <token>`; none: open (loopback)
    listen = "127.0.0.1:9464"     # a listener of its own for scrapers (besides the admin's)
    max_series = 10000            # per metric; more label sets are counted as `_overflow`
    worker_timeout = 0.5          # seconds a scrape waits for the model worker's figures and,
                                  # with workers = N, for each other worker's series

`runtime.config.load` refuses bad values with `InvalidConfig` naming the field
(the schema's, and `MetricsSettings.problem`'s).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from msgspec import Meta, Struct


class MetricsSettings(Struct, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    token: Annotated[str, Meta(min_length=16, max_length=512, pattern=r"^[!-~]+$")] | None = None
    token_file: str | None = None  # relative: to pop.toml's folder
    listen: str | None = None  # "HOST:PORT" ("[::1]:9464" for IPv6)
    max_series: Annotated[int, Meta(ge=10, le=1_000_000)] = 10_000
    worker_timeout: Annotated[float, Meta(gt=0, le=10)] = 0.5

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) for what the schema cannot say, or None."""
        if self.token is not None and self.token_file is not None:
            return "token_file", "give `token` or `token_file`, not both"
        if self.listen is not None:
            try:
                split_listen(self.listen)
            except ValueError as e:
                return "listen", str(e)
        return None

    def address(self) -> tuple[str, int] | None:
        """The separate listener's (host, port), or None."""
        return split_listen(self.listen) if self.listen is not None else None


def split_listen(value: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` → ("127.0.0.1", 9464). Raises ValueError."""
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) <= 65535:
        raise ValueError(f"listen {value!r} is not HOST:PORT with a port in 1..65535")
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"listen {value!r}: {host!r} is not an IP address") from None
    return host, int(port)
