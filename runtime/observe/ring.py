"""`Ring`: the last `[events] ring_size` events in memory, queried by the admin
API (`edgefn events`) and followed live by subscribers (`edgefn tail`).

The ring is fed on the PoP's loop and read from the admin API's thread: the
deque is only appended to there, and a reader copies it (one C call under the
GIL) before filtering. A subscriber's buffer is bounded: when it is full, newer
events are dropped and counted, and the subscriber is told how many it missed;
the PoP never waits for a reader.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec

from edgefn_core.errors import InvalidConfig
from runtime.observe.batch import Deferred, EventBatch
from runtime.observe.event import Event
from runtime.observe.settings import MAX_EVENT_BYTES

MAX_TEXT = 1024  # path and query characters a ring event keeps
# path, query and host characters past which an event's stage records are measured
PLAIN_TEXT = 256
MAX_LIMIT = 10_000
MAKE_AT_ONCE = 64  # a Chunk's events a read makes in one call (a query may stop early)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
Clock = Callable[[], float]


class Query(msgspec.Struct, frozen=True, kw_only=True):
    """Which events to return: all given filters must match."""

    since: float | None = None  # seconds back from now
    # a function's name ("hello") or a target label, whose version may be cut ("hello@1a2b",
    # as `edgefn rollback` takes a version's first characters)
    function: str | None = None
    status: int | None = None  # an exact status ...
    status_class: int | None = None  # ... or its class: 5 for "5xx"
    tenant: str | None = None
    path: str | None = None  # a path prefix
    method: str | None = None
    min_ms: float | None = None
    limit: int = 100
    # a tenant's API key sees only its tenant's: events it made, or of its functions
    viewer: str | None = None

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> Query:
        """From the admin API's query parameters. Raises `InvalidConfig` naming the
        parameter (`field`) for an unknown one or a bad value."""
        known = {"since", "function", "status", "tenant", "path", "method", "min_ms", "limit"}
        for name in params:
            if name not in known:
                raise _bad(name, f"unknown filter; use one of {', '.join(sorted(known))}")
        status, status_class = _status(params.get("status"))
        return cls(since=since_seconds(params.get("since")),
                   function=params.get("function") or None,
                   status=status, status_class=status_class, tenant=params.get("tenant") or None,
                   path=_prefix(params.get("path")), method=_method(params.get("method")),
                   min_ms=_number("min_ms", params.get("min_ms")),
                   limit=_limit(params.get("limit")))

    def matcher(self, now: float) -> Callable[[Event], bool]:
        """A predicate for this query's filters (`since` relative to `now`)."""
        after = now - self.since if self.since is not None else None
        fn = self.function
        versioned = fn is not None and "@" in fn

        def match(e: Event) -> bool:
            return ((after is None or e.ts >= after)
                    and (fn is None or (e.target is not None and e.target.startswith(fn)
                                        if versioned else _function(e.target) == fn))
                    and (self.status is None or e.status == self.status)
                    and (self.status_class is None or e.status // 100 == self.status_class)
                    and (self.tenant is None or e.tenant == self.tenant)
                    and (self.path is None or e.path.startswith(self.path))
                    and (self.method is None or e.method == self.method)
                    and (self.min_ms is None or e.duration_ms >= self.min_ms)
                    and (self.viewer is None or e.tenant == self.viewer
                         or e.owner == self.viewer))

        return match


class Subscriber:
    """A live follower on its own loop (the admin API's): `get()` waits for the
    next batch. Fed from the PoP's loop through `push`, which never blocks."""

    def __init__(self, match: Callable[[Event], bool], size: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.match, self.size, self.loop = match, size, loop
        self.buffer: deque[Event] = deque()
        # events lost: a total only `push` writes and what `get` has reported, which
        # only `get` writes (two threads; neither has to lock the other out)
        self.lost = 0
        self.reported = 0
        self._ready = asyncio.Event()
        self._wake_pending = False

    def push(self, event: Event) -> None:
        if not self.match(event):
            return
        if len(self.buffer) >= self.size:
            self.lost += 1
        else:
            self.buffer.append(event)
        if not self._wake_pending:
            self._wake_pending = True
            self.loop.call_soon_threadsafe(self._wake)

    @property
    def dropped(self) -> int:
        """Events lost since the last `get`."""
        return self.lost - self.reported

    def _wake(self) -> None:
        self._wake_pending = False
        self._ready.set()

    async def get(self, timeout: float) -> tuple[list[Event], int]:
        """The events buffered (oldest first) and how many were dropped since the
        last call; both empty/0 after `timeout` seconds without any."""
        if not self.buffer and not self.dropped:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return [], 0
        self._ready.clear()
        events = [self.buffer.popleft() for _ in range(len(self.buffer))]
        lost = self.lost  # read once: `push` may count more meanwhile, for the next call
        dropped, self.reported = lost - self.reported, lost
        return events, dropped


class Chunk:
    """Events made when read (a plain `EventBatch`'s, `deferred`): `deferred`'s of
    `records[start:]`, the ring having let the first `start` go. `records` is never
    changed once here (the native lane's `Records`, a frame of undecoded events)."""

    __slots__ = ("deferred", "records", "start")

    def __init__(self, deferred: Deferred, records: Any) -> None:
        self.deferred, self.records, self.start = deferred, records, 0

    def __len__(self) -> int:
        return len(self.records) - self.start

    def newest_first(self) -> Iterator[Event]:
        """Its events, newest first, made `MAKE_AT_ONCE` at a time (a query may stop
        early)."""
        records, deferred = self.records, self.deferred
        start, stop = self.start, len(records)  # read once: the loop may move `start`
        while stop > start:
            lo = max(start, stop - MAKE_AT_ONCE)
            yield from reversed(deferred.events(records[lo:stop]))
            stop = lo


class Ring:
    """The last `size` sampled events; an `Observer`. A plain `EventBatch` whose
    events are made when read (the native lane's, the other workers') is kept as
    one `Chunk`, nothing made of it: each event is made when a query, a subscriber
    or `events` reads it."""

    def __init__(self, size: int, max_event_bytes: int = MAX_EVENT_BYTES,
                 clock: Clock = time.time) -> None:
        self.size = size
        # appended to on the loop only; readers copy it (`_newest_first`)
        self.items: deque[Event | Chunk] = deque()
        self.count = 0  # the events in `items`: at most `size`
        self.max_event_bytes = max_event_bytes
        self.clock = clock
        self.subscribers: list[Subscriber] = []

    def observe(self, event: Event) -> None:
        if not event.sampled:
            return
        event = kept(event, self.max_event_bytes)
        self._keep(event, 1)
        for sub in self.subscribers:
            sub.push(event)

    def observe_batch(self, batch: EventBatch) -> None:
        """`batch`'s events, each as `observe` takes it; a `plain` batch's are kept
        as they are (nothing in them to bound or skip), made when read if they are
        not made yet and nobody follows the ring."""
        if not batch.plain:
            for event in batch.events:
                self.observe(event)
            return
        if batch.deferred is not None and not self.subscribers:
            if batch.n:
                self._keep(Chunk(batch.deferred, batch.records), batch.n)
            return
        events = batch.events
        self.items.extend(events)
        self._counted(len(events))
        for sub in self.subscribers:
            for event in events:
                sub.push(event)

    def _keep(self, item: Event | Chunk, n: int) -> None:
        self.items.append(item)
        self._counted(n)

    def _counted(self, n: int) -> None:
        """`n` events were appended to `items`: the oldest past `size` let go."""
        self.count += n
        if self.count > self.size:
            self._trim()

    def _trim(self) -> None:
        """The oldest events let go, past `size`: whole items, or the first events of
        a `Chunk` (its `start` moved)."""
        items, over = self.items, self.count - self.size
        while over > 0:
            first = items[0]
            n = len(first) if isinstance(first, Chunk) else 1
            if n > over:
                assert isinstance(first, Chunk)
                first.start += over
                self.count -= over
                return
            items.popleft()
            self.count -= n
            over -= n

    @property
    def events(self) -> deque[Event]:
        """The events kept, oldest first (a copy: those made when read are made now)."""
        newest = list(_newest_first(self.items))
        return deque(reversed(newest), maxlen=self.size)

    def query(self, q: Query) -> list[Event]:
        """The newest `q.limit` events matching `q`, oldest first."""
        match = q.matcher(self.clock())
        out: list[Event] = []
        for e in _newest_first(self.items):
            if match(e):
                out.append(e)
                if len(out) >= q.limit:
                    break
        out.reverse()
        return out

    def subscribe(self, q: Query, size: int) -> Subscriber:
        """A follower of new events matching `q` (its `since` and `limit` are
        ignored), on the running loop; `unsubscribe` it when done."""
        sub = Subscriber(q.matcher(0.0), size, asyncio.get_running_loop())
        self.subscribers = [*self.subscribers, sub]  # replaced, never mutated: read elsewhere
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers = [s for s in self.subscribers if s is not sub]

    def __len__(self) -> int:
        return self.count


def _newest_first(items: deque[Event | Chunk]) -> Iterator[Event]:
    """The events of ring items, newest first, those of a `Chunk` made as they are
    reached. `items` is copied first (one C call under the GIL): the PoP's loop
    appends meanwhile, and the admin API's thread reads."""
    for item in reversed(items.copy()):
        if isinstance(item, Chunk):
            yield from item.newest_first()
        else:
            yield item


def encoded_size(event: Event) -> int:
    return len(msgspec.json.encode(event))


def kept(event: Event, cap: int) -> Event:
    """`event` as a ring of `cap` bytes an event keeps it: as it is, or bounded."""
    size = len(event.path) + len(event.query) + len(event.host)
    # the stages' records are small unless they quote the request (the HTTP cache's
    # key: host and path) or list WAF rules: only then is their size measured
    if size > MAX_TEXT or ((size > PLAIN_TEXT or "waf" in event.decisions)
                           and _too_big(event, cap)):
        return _bounded(event, cap)
    return event


def _too_big(event: Event, cap: int) -> bool:
    return bool(event.decisions) and len(msgspec.json.encode(event.decisions)) > cap // 2


def _bounded(event: Event, cap: int) -> Event:
    """`event` with a long path/query cut and oversized decisions replaced by
    their size, so that one event holds about `cap` bytes at most."""
    decisions = event.decisions
    if decisions and (size := len(msgspec.json.encode(decisions))) > cap // 2:
        decisions = {"truncated": size}
    return msgspec.structs.replace(event, path=event.path[:MAX_TEXT // 2],
                                   query=event.query[:MAX_TEXT // 2],
                                   host=event.host[:MAX_TEXT // 4], decisions=decisions)


def _function(label: str | None) -> str | None:
    return label.partition("@")[0] if label is not None else None


def _bad(name: str, message: str) -> InvalidConfig:
    return InvalidConfig("query", message, name)


def since_seconds(text: str | None) -> float | None:
    """``"90"``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``: seconds."""
    if not text:
        return None
    m = _DURATION.match(text.strip())
    if m is None:
        raise _bad("since", f"expected seconds or a duration like 10m, 2h, 1d; got {text!r}")
    return float(m[1]) * _UNITS[m[2]]


def _status(text: str | None) -> tuple[int | None, int | None]:
    """``"404"`` -> (404, None); ``"5xx"`` -> (None, 5)."""
    if not text:
        return None, None
    t = text.strip().lower()
    if re.fullmatch(r"[1-5]xx", t):
        return None, int(t[0])
    if re.fullmatch(r"[1-5]\d\d", t):
        return int(t), None
    raise _bad("status", f"expected a status (404) or a class (5xx), got {text!r}")


def _prefix(text: str | None) -> str | None:
    if not text:
        return None
    if not text.startswith("/"):
        raise _bad("path", f"expected a path prefix starting with /, got {text!r}")
    return text


def _method(text: str | None) -> str | None:
    if not text:
        return None
    if not re.fullmatch(r"[A-Za-z]{1,16}", text):
        raise _bad("method", f"expected an HTTP method (GET), got {text!r}")
    return text.upper()


def _number(name: str, text: str | None) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise _bad(name, f"expected a number >= 0, got {text!r}")
    return value


def _limit(text: str | None) -> int:
    if not text:
        return 100
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise _bad("limit", f"expected an integer 1..{MAX_LIMIT}, got {text!r}")
    return int(text)
