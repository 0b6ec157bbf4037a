"""The HTTP front's own answers as Prometheus metrics: requests it refused before
the pipeline saw them (so they make no event, no access-log line and no
``edgefn_requests_total`` sample), read at scrape time from its `ServerState`.

    edgefn_http_front_refused_total{status}   400 malformed, 408 too slow, 413 body,
                                              414 URL, 431 headers, 501/505, 503 over
                                              a connection cap
    edgefn_http_connections_cut_total         connections cut unanswered (past the cap
                                              of connections waiting for their 503)
    edgefn_http_connections                   connections open now
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from runtime.net.server import ServerState

BASE = ("pop", "tier", "geo")


class FrontMetrics:
    def __init__(self, base: tuple[str, str, str],
                 state: Callable[[], ServerState | None]) -> None:
        """`state()`: the public listener's, None until it started."""
        self.base = base
        self.state = state

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "edgefn_http_front_refused", "Requests the HTTP front answered itself, before "
            "the pipeline (malformed, too large, too slow, over a connection cap).",
            labels=(*BASE, "status"))
        cut = CounterMetricFamily("edgefn_http_connections_cut", "Connections cut without "
                                  "an answer, past the cap of refused ones.", labels=BASE)
        open_now = GaugeMetricFamily("edgefn_http_connections", "Connections open on the "
                                     "public listener.", labels=BASE)
        state = self.state()
        if state is not None:
            for status, n in sorted(state.answered.items()):
                refused.add_metric([*self.base, str(status)], n)
            cut.add_metric(list(self.base), state.cut)
            open_now.add_metric(list(self.base), len(state.connections))
        yield refused
        yield cut
        yield open_now
