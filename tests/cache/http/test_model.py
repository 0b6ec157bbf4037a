"""A hypothesis state machine of the HTTP cache against a small reference model
of RFC 9111 freshness and validation, with a controlled clock.

The origin's behaviour changes at random (Cache-Control, ETag, Vary, Cache-Tag,
failing with 500s); requests come with random Vary'd headers and validators;
time moves; URLs, tags, prefixes and the function are purged. After every request the stage's outcome, body, status and
Age must be what the model predicts: never a stale entry outside its window,
never across Vary, never after a purge."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from runtime.net.message import Request, Response
from tests.cache.http.helpers import Harness, header, request

PATHS = (b"/shop/a", b"/shop/sub/b")
LANGS = (None, "fr", "de")
ANY = "<any>"  # a model entry without Vary


@dataclass(frozen=True)
class Option:
    """One Cache-Control the origin may send, and what RFC 9111 makes of it."""

    cc: str | None
    storable: bool  # with an ETag where it needs one (no-cache)
    lifetime: float = 0.0
    swr: float = 0.0
    revalidate: bool = False
    no_cache: bool = False
    sie: float = 0.0


OPTIONS = [
    Option("max-age=10", True, 10),
    Option("max-age=30", True, 30),
    Option("max-age=10, stale-while-revalidate=15", True, 10, swr=15),
    Option("max-age=10, must-revalidate", True, 10, revalidate=True),
    Option("max-age=10, stale-while-revalidate=15, must-revalidate", True, 10, swr=15,
           revalidate=True),
    Option("max-age=10, stale-if-error=20", True, 10, sie=20),
    Option("max-age=5, stale-while-revalidate=5, stale-if-error=30", True, 5, swr=5, sie=30),
    Option("s-maxage=20", True, 20, revalidate=True),  # s-maxage implies proxy-revalidate
    Option("public, max-age=5", True, 5),
    Option("no-cache", True, 0, no_cache=True),  # stored only with a validator
    Option("max-age=0", False),
    Option("no-store, max-age=60", False),
    Option("private, max-age=60", False),
    Option(None, False),
]


@dataclass
class Origin:
    option: Option = OPTIONS[0]
    etag: bool = True
    vary: str | None = None  # None, "accept-language" or "*"
    tag: str = "red"
    generation: int = 0
    down: bool = False  # answers 500

    def etag_value(self) -> bytes:
        return b'"g%d"' % self.generation

    def storable(self) -> bool:
        o = self.option
        return o.storable and self.vary != "*" and (not o.no_cache or self.etag)


@dataclass
class Stored:
    body: bytes
    stored_at: float
    option: Option
    etag: bytes | None
    lang: str | None  # the Vary'd request header's value, or ANY
    tags: set[str] = field(default_factory=set)


class HttpCacheModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.origins = {p: Origin() for p in PATHS}
        self.model: dict[bytes, list[Stored]] = {p: [] for p in PATHS}
        self.h.origin.answer = self.answer

    def teardown(self) -> None:
        self.h.close()

    # -- the origin -------------------------------------------------------------------------
    def answer(self, r: Request) -> Response:
        o = self.origins[r.path]
        if o.down:
            return Response(500, [(b"cache-control", b"max-age=60")], b"down")
        headers = [(b"cache-tag", o.tag.encode())]
        if o.option.cc is not None:
            headers.append((b"cache-control", o.option.cc.encode()))
        if o.etag:
            headers.append((b"etag", o.etag_value()))
            if r.header(b"if-none-match") == o.etag_value():
                return Response(304, headers)
        if o.vary:
            headers.append((b"vary", o.vary.encode()))
        lang = r.header(b"accept-language") or b"-"
        return Response(200, headers, b"%s|%d|%s" % (r.path, o.generation, lang))

    @rule(path=st.sampled_from(PATHS), option=st.sampled_from(OPTIONS), etag=st.booleans(),
          vary=st.sampled_from([None, None, "accept-language", "*"]),
          tag=st.sampled_from(["red", "blue"]))
    def origin_changes(self, path: bytes, option: Option, etag: bool, vary: str | None,
                       tag: str) -> None:
        o = self.origins[path]
        o.option, o.etag, o.vary, o.tag = option, etag, vary, tag
        o.generation += 1

    @rule(path=st.sampled_from(PATHS), down=st.booleans())
    def origin_fails(self, path: bytes, down: bool) -> None:
        self.origins[path].down = down

    # -- time and purges --------------------------------------------------------------------
    @rule(seconds=st.sampled_from([0, 1, 4, 5, 9, 10, 15, 20, 25, 40]))  # at the edges
    def time_passes(self, seconds: int) -> None:
        self.h.clock.now += seconds

    @rule(tag=st.sampled_from(["red", "blue"]))
    def purge_tag(self, tag: str) -> None:
        gone = [p for p, entries in self.model.items() if any(tag in e.tags for e in entries)]
        assert self.h.cache.purge(tag=tag) == len(gone)
        for p in gone:
            self.model[p] = []

    @rule(prefix=st.sampled_from(["/shop/", "/shop/sub/", "/shop/a", "/other/"]))
    def purge_prefix(self, prefix: str) -> None:
        gone = [p for p, e in self.model.items() if e and p.startswith(prefix.encode())]
        assert self.h.cache.purge(prefix=prefix) == len(gone)
        for p in gone:
            self.model[p] = []

    @rule(path=st.sampled_from(PATHS), host=st.sampled_from(["http://example.com", "",
                                                              "http://other.com"]))
    def purge_key(self, path: bytes, host: str) -> None:
        gone = bool(self.model[path]) and host != "http://other.com"
        assert self.h.cache.purge(key=host + path.decode()) == gone
        if gone:
            self.model[path] = []

    @rule()
    def purge_function(self) -> None:
        assert self.h.cache.purge(function="shop") == sum(1 for e in self.model.values() if e)
        self.model = {p: [] for p in PATHS}

    # -- requests ---------------------------------------------------------------------------
    @rule(path=st.sampled_from(PATHS), lang=st.sampled_from(LANGS),
          validator=st.sampled_from([None, "current", "old", "*"]))
    def get(self, path: bytes, lang: str | None, validator: str | None) -> None:
        o = self.origins[path]
        inm = {None: None, "current": o.etag_value().decode(), "old": '"g0"',
               "*": "*"}[validator]
        headers = {k: v for k, v in (("accept_language", lang), ("if_none_match", inm))
                   if v is not None}
        req = request(path, **headers)
        now = self.h.clock.now
        entry = self._select(path, lang)
        expect = self._expect(entry, now, o.down)
        calls = self.h.origin.calls
        response, _ = self.h.call(req)
        got = (header(response, b"x-edgefn-cache") or b"").decode()
        assert got == expect, (got, expect, entry)
        if expect in ("HIT", "STALE"):
            assert entry is not None
            assert self.h.origin.calls == calls + (expect == "STALE")  # revalidation
            assert header(response, b"age") == b"%d" % (now - entry.stored_at)
            if inm is not None and _weak_match(inm, entry.etag):
                assert response.status == 304 and response.body == b""
            else:
                assert (response.status, response.body) == (200, entry.body)
                assert response.body.endswith(b"|" + (lang or "-").encode()) or \
                    entry.lang == ANY  # never across Vary
        if o.down and expect != "HIT":
            assert response.status in ((200, 304) if expect == "STALE" else (500,))
            return  # nothing stored, nothing dropped
        if expect == "STALE" or (expect == "EXPIRED"):
            assert entry is not None
            self._revalidated(path, lang, entry, now)
        elif expect == "MISS" and o.storable():
            self._put(path, lang, Stored(b"%s|%d|%s" % (path, o.generation,
                                                          (lang or "-").encode()),
                                         now, o.option, o.etag_value() if o.etag else None,
                                         lang if o.vary else ANY, {o.tag}))

    def _select(self, path: bytes, lang: str | None) -> Stored | None:
        for e in self.model[path]:
            if e.lang == ANY or e.lang == lang:
                return e
        return None

    @staticmethod
    def _expect(entry: Stored | None, now: float, down: bool) -> str:
        if entry is None:
            return "MISS"
        age, opt = now - entry.stored_at, entry.option
        if not opt.no_cache and age < opt.lifetime:
            return "HIT"  # RFC 9111 4.2
        may_be_stale = not opt.no_cache and not opt.revalidate
        if may_be_stale and age - opt.lifetime < opt.swr:
            return "STALE"  # RFC 5861 3
        if down and may_be_stale and age - opt.lifetime < opt.sie:
            return "STALE"  # RFC 5861 4
        return "EXPIRED"  # RFC 9111 4.3

    def _revalidated(self, path: bytes, lang: str | None, entry: Stored, now: float) -> None:
        """The origin was asked with the entry's validators: a 304 restarts its
        freshness (with the 304's Cache-Control), a 200 replaces the URL's entries."""
        o = self.origins[path]
        if entry.etag is not None and o.etag and entry.etag == o.etag_value():
            option = o.option if o.option.cc is not None else entry.option
            if option.storable and (not option.no_cache or entry.etag):
                entry.stored_at, entry.option = now, option
                entry.tags = {o.tag}
            else:
                self.model[path] = []
            return
        self.model[path] = []
        if o.storable():
            self.model[path] = [Stored(b"%s|%d|%s" % (path, o.generation,
                                                      (lang or "-").encode()),
                                       now, o.option, o.etag_value() if o.etag else None,
                                       lang if o.vary else ANY, {o.tag})]

    def _put(self, path: bytes, lang: str | None, new: Stored) -> None:
        kept = [e for e in self.model[path] if not (e.lang == ANY or e.lang == lang)]
        self.model[path] = [new, *kept]

    @invariant()
    def held_urls_match(self) -> None:
        held = {k.split(b"\0")[2] for k, _ in self.h.cache.store.items()}
        assert held == {p for p, e in self.model.items() if e}


def _weak_match(inm: str, etag: bytes | None) -> bool:
    """RFC 9110 13.1.2: ``*`` matches any current representation, tagged or not."""
    if inm == "*":
        return True
    if etag is None:
        return False
    return inm.removeprefix("W/") == etag.decode().removeprefix("W/")


TestHttpCacheModel = HttpCacheModel.TestCase
TestHttpCacheModel.settings = settings(max_examples=400, stateful_step_count=40,
                                       deadline=None)


def test_the_model_replays_stale_if_error() -> None:
    """A sequence the random search reaches rarely: an entry past its lifetime,
    within stale-if-error, while the origin fails."""
    m = HttpCacheModel()
    try:
        sie = next(o for o in OPTIONS if o.sie and not o.swr)
        m.origin_changes(path=PATHS[0], option=sie, etag=False, vary=None, tag="red")
        m.get(path=PATHS[0], lang=None, validator=None)
        for seconds, expect in ((15, "STALE"), (20, "EXPIRED")):
            m.time_passes(seconds=seconds)
            m.origin_fails(path=PATHS[0], down=True)
            m.get(path=PATHS[0], lang=None, validator=None)
            assert m._expect(m._select(PATHS[0], None), m.h.clock.now, True) == expect
        m.held_urls_match()
    finally:
        m.teardown()
