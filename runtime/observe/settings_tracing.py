"""pop.toml ``[tracing]``: OpenTelemetry traces of every request
(`runtime.observe.tracing`), exported over OTLP/HTTP. Off by default; when off
the pipeline is exactly what it is without the table.

    [tracing]
    enabled = true
    endpoint = "http://127.0.0.1:4318/v1/traces"   # an OTLP/HTTP (protobuf) receiver
    service_name = "edge-fra-1"                     # default: the PoP's name
    sample = 0.1                                    # share of new traces kept (0..1);
                                                    # a client's traceparent decides its own
    trust_sampled = true                            # false: a client's traceparent joins
                                                    # its trace, `sample` decides (any
                                                    # client could have every one of its
                                                    # requests traced, at 0.1x the req/s)
    headers = { authorization = "Bearer ..." }      # sent with every export
    compression = "gzip"                            # of each export ("none": the default)
    stage_spans = true                              # a child span per stage (about 6 us
                                                    # each); false: the request's span and
                                                    # the model call's only

`runtime.config.load` refuses bad values with `InvalidConfig` naming the field
(the schema's, and `TracingSettings.problem`'s).
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from msgspec import Meta, Struct

HeaderName = Annotated[str, Meta(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")]
HeaderValue = Annotated[str, Meta(pattern=r"^[ -~]{0,4096}$")]


class TracingSettings(Struct, forbid_unknown_fields=True, frozen=True):
    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    service_name: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    sample: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    headers: dict[HeaderName, HeaderValue] = {}
    stage_spans: bool = True
    trust_sampled: bool = True  # a valid traceparent's sampled flag decides (W3C parent-based)
    timeout: Annotated[float, Meta(gt=0, le=60)] = 5.0  # seconds per export
    batch_delay_ms: Annotated[int, Meta(ge=1, le=60_000)] = 1000  # between exports
    max_queue: Annotated[int, Meta(ge=16, le=1_000_000)] = 8192  # spans; more are dropped
    compression: Literal["none", "gzip"] = "none"  # of each export's body

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) for what the schema cannot say, or None."""
        url = urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            return "endpoint", f"{self.endpoint!r} is not an http(s):// URL with a host"
        try:
            _ = url.port
        except ValueError:
            return "endpoint", f"{self.endpoint!r} has a bad port"
        return None
