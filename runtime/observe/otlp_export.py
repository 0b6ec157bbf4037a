"""`Exporter`: the thread that sends a PoP's spans to an OTLP/HTTP receiver
(``POST`` of an ``ExportTraceServiceRequest``, ``application/x-protobuf``), in
batches, as the SDK's `BatchSpanProcessor` and OTLP exporter did.

`add` (the loop's thread) only queues a request's encoded spans (`otlp.entries`),
up to ``[tracing] max_queue`` spans: past it they are dropped, and counted. The
thread sends what is queued every ``batch_delay_ms``, or at once when a batch's
worth (`BATCH` spans) waits or `flush` asks. A send that fails for a reason that
may pass (no connection, 429, 502, 503, 504) is tried again, backing off, within
``[tracing] timeout`` seconds (not once `close` began); then, or at any other
status, the batch is dropped and logged (at most once every `LOG_EVERY` seconds,
with what was dropped since).
Nothing here raises into the PoP.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from runtime.observe import otlp

log = logging.getLogger("edgefn.tracing")

BATCH = 2048  # spans a POST carries at most
RETRIED = frozenset({429, 502, 503, 504})
FIRST_BACKOFF = 0.25  # seconds before the first retry, doubling
LOG_EVERY = 10.0  # seconds between two log lines about lost spans


class Exporter:
    def __init__(self, endpoint: str, headers: Mapping[str, str], timeout: float,
                 batch_delay_ms: int, max_queue: int, resource_field: bytes,
                 scope_field: bytes, compression: str = "none") -> None:
        """`endpoint`: the receiver's ``http(s)://host[:port]/path`` (checked by the
        settings); `timeout`: seconds for one export, its retries included;
        `resource_field`, `scope_field`: what `otlp.request` wraps each batch in;
        `compression`: ``"gzip"`` or ``"none"``, of each export's body. Starts the
        thread."""
        url = urlsplit(endpoint)
        self.https = url.scheme == "https"
        self.host = url.hostname or ""
        self.port = url.port
        self.path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/x-protobuf", "User-Agent": "edgefn",
                        **headers}
        self.gzip = compression == "gzip"
        if self.gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.timeout = timeout
        self.delay = batch_delay_ms / 1000
        self.max_queue = max_queue
        self.resource, self.scope = resource_field, scope_field
        self.conn: http.client.HTTPConnection | None = None
        self.cond = threading.Condition()
        self.queue: deque[tuple[int, bytes]] = deque()  # (spans, their entries)
        self.queued = 0  # spans in `queue`
        self.added = 0  # requests queued so far; `done`: those sent or dropped since
        self.done = 0
        self.flushing = 0  # flushes waiting: send at once
        self.closing = False
        self.dropped = 0  # spans lost since the last log line about them
        self.logged = 0.0
        self.sent = 0  # spans the receiver took, and those dropped (never reset)
        self.lost = 0
        self.thread = threading.Thread(target=self._run, name="edgefn-otlp", daemon=True)
        self.thread.start()

    def add(self, spans: int, entries: bytes) -> None:
        """Queue one request's `spans` (`entries`: `otlp.entries` of them); dropped
        when the queue holds `max_queue` spans."""
        with self.cond:
            if self.closing or self.queued + spans > self.max_queue:
                self.dropped += spans
                self.lost += spans
                self._log_drops("the queue is full ([tracing] max_queue)")
                return
            self.queue.append((spans, entries))
            self.queued += spans
            self.added += 1
            if self.queued >= BATCH:
                self.cond.notify()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send what is queued now; whether it was all sent (or dropped) within
        `timeout_s` seconds."""
        with self.cond:
            target = self.added
            self.flushing += 1
            self.cond.notify_all()
            try:
                return self.cond.wait_for(lambda: self.done >= target, timeout_s)
            finally:
                self.flushing -= 1

    def close(self) -> None:
        """Send what is queued (each batch tried once, within `timeout` seconds in all),
        then stop the thread."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.thread.join(self.timeout + 1.0)

    # -- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        stop_by = 0.0
        while True:
            with self.cond:
                if not self.closing:
                    self.cond.wait_for(lambda: self.closing or self.queued >= BATCH
                                       or (self.flushing > 0 and bool(self.queue)),
                                       self.delay)
                if self.closing and not stop_by:
                    stop_by = time.monotonic() + self.timeout
                batch, spans = self._take()
            if batch:
                late = bool(stop_by) and time.monotonic() > stop_by
                if late:
                    self._lost(spans, "the PoP stopped before it was sent")
                else:
                    self._export(batch, spans, stop_by or time.monotonic() + self.timeout)
                with self.cond:
                    self.done += len(batch)
                    self.cond.notify_all()
                continue
            if stop_by:
                if self.conn is not None:
                    self.conn.close()
                return

    def _take(self) -> tuple[list[bytes], int]:
        """Up to BATCH spans' worth of the queue (at least one request's)."""
        batch: list[bytes] = []
        spans = 0
        queue = self.queue
        while queue and (not batch or spans + queue[0][0] <= BATCH):
            n, entries = queue.popleft()
            batch.append(entries)
            spans += n
        self.queued -= spans
        return batch, spans

    def _export(self, batch: list[bytes], spans: int, deadline: float) -> None:
        body = otlp.request(self.resource, self.scope, batch)
        if self.gzip:  # (zlib's default level)
            body = gzip.compress(body, 6)
        backoff = FIRST_BACKOFF
        while True:
            status, why = self._post(body, max(0.1, deadline - time.monotonic()))
            if status is not None and 200 <= status < 300:
                self.sent += spans
                return
            if (status is not None and status not in RETRIED) or self.closing or \
                    time.monotonic() + backoff > deadline:  # (a stopping PoP tries once)
                self._lost(spans, why)
                return
            with self.cond:  # a close meanwhile stops the wait, not the retry
                self.cond.wait_for(lambda: self.closing, backoff)
            backoff *= 2

    def _post(self, body: bytes, timeout: float) -> tuple[int | None, str]:
        """POST `body`: the status, or None (and why) when no answer came; once more
        on a fresh connection when a kept one failed (the receiver may close an idle
        one)."""
        reused = self.conn is not None
        status, why = self._post_once(body, timeout)
        if status is None and reused:
            status, why = self._post_once(body, timeout)
        return status, why

    def _post_once(self, body: bytes, timeout: float) -> tuple[int | None, str]:
        try:
            if self.conn is None:
                cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
                self.conn = cls(self.host, self.port, timeout=timeout)
            else:
                self.conn.timeout = timeout
                if self.conn.sock is not None:
                    self.conn.sock.settimeout(timeout)
            self.conn.request("POST", self.path, body, self.headers)
            response = self.conn.getresponse()
            response.read()
            if response.will_close:
                self.conn.close()
                self.conn = None
            return response.status, f"HTTP {response.status}"
        except (OSError, http.client.HTTPException) as e:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            return None, str(e) or type(e).__name__

    def _lost(self, spans: int, why: str) -> None:
        with self.cond:
            self.dropped += spans
            self.lost += spans
            self._log_drops(f"export to {self.endpoint} failed: {why}")

    def _log_drops(self, why: str) -> None:
        """Log the spans dropped since the last line, at most every LOG_EVERY seconds
        (call holding `cond`)."""
        now = time.monotonic()
        if now - self.logged >= LOG_EVERY:
            log.warning("tracing: %d spans dropped (%s)", self.dropped, why)
            self.logged, self.dropped = now, 0
