"""A request's bot class from what it says about itself: its User-Agent (parsed
with ua-parser, matched against the known agents) and whether its other headers
agree with it.

    no User-Agent                              automation   empty_ua
    a known AI agent or crawler (agents.toml)  declared_agent  ua:<name>
    a known tool (curl, HeadlessChrome, ...)   automation   ua:<name>
    another self-declared crawler              declared_agent  ua_spider
    a browser ...                              browser
      ... without Accept or Accept-Language    automation   browser_headers_missing
      ... Chrome >= 80 / Firefox >= 90 without
          Sec-Fetch-Mode                       automation   no_sec_fetch
      ... with client hints (Sec-CH-UA) that
          disagree with its version or brand   automation   hints_mismatch
    anything else                              automation   ua_unknown

The User-Agent part is parsed once per distinct string and kept in a bounded LRU
(`Classifier.view`); a request then costs a few dict lookups.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import NamedTuple

import ua_parser
from ua_parser import Domain

from runtime.security.bots.agents import AgentList
from runtime.security.settings import BotClass

BROWSERS = frozenset({
    "Chrome", "Chrome Mobile", "Chrome Mobile iOS", "Chrome Mobile WebView", "Chromium",
    "Edge", "Edge Mobile", "Opera", "Opera Mobile", "Samsung Internet", "Brave", "Vivaldi",
    "Yandex Browser", "Firefox", "Firefox Mobile", "Firefox iOS", "Safari", "Mobile Safari",
    "Mobile Safari UI/WKWebView", "DuckDuckGo Mobile"})
_CHROME = re.compile(r"Chrome/(\d{1,6})")
_FIREFOX = re.compile(r"Firefox/(\d{1,6})")
_CRAWLER = re.compile(r"bot|crawl|spider|https?://", re.IGNORECASE)
_HINT = re.compile(rb'"(?:Chromium|Google Chrome|Microsoft Edge)";\s*v="(\d{1,6})"')
_NO_UA: tuple[BotClass, tuple[str, ...]] = ("automation", ("empty_ua",))


class UaView(NamedTuple):
    """What a User-Agent string alone says."""

    cls: BotClass
    signals: tuple[str, ...]
    browser: bool
    chrome: int  # the Chrome major version it claims, 0 if none
    sec_fetch: bool  # a browser that sends Sec-Fetch-* headers


class Classifier:
    def __init__(self, agents: AgentList, cache_size: int = 4096) -> None:
        self.agents = agents
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, UaView] = OrderedDict()
        # ua_parser builds its regex set on first use (~120 ms): here, at start, not
        # on the loop under the first browser's request (which stalled every tenant)
        _ = ua_parser.parser

    def classify(self, headers: dict[bytes, bytes]) -> tuple[BotClass, tuple[str, ...]]:
        """The class of a request with `headers` (lower-case names) and its signals."""
        ua = headers.get(b"user-agent")
        if not ua:
            return _NO_UA
        view = self.view(ua)
        if not view.browser:
            return view.cls, view.signals
        if b"accept" not in headers or b"accept-language" not in headers:
            return "automation", ("browser_headers_missing",)
        if view.sec_fetch and b"sec-fetch-mode" not in headers:
            return "automation", ("no_sec_fetch",)
        hints = headers.get(b"sec-ch-ua")
        if hints is not None and _hinted(hints) != view.chrome:
            return "automation", ("hints_mismatch",)
        return "browser", ()

    def view(self, ua: bytes) -> UaView:
        """What `ua` alone says, from the LRU cache or parsed now."""
        cache = self._cache
        view = cache.get(ua)
        if view is not None:
            cache.move_to_end(ua)
            return view
        view = self._parse(ua.decode("latin-1"))
        cache[ua] = view
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return view

    def _parse(self, ua: str) -> UaView:
        agent = self.agents.match(ua)
        if agent is not None:
            cls: BotClass = "automation" if agent.kind == "tool" else "declared_agent"
            return UaView(cls, (f"ua:{agent.name}",), False, 0, False)
        parsed = ua_parser.parser(ua, Domain.USER_AGENT | Domain.DEVICE)  # not the OS
        family = parsed.user_agent.family if parsed.user_agent else "Other"
        if parsed.device is not None and parsed.device.family == "Spider":
            if _CRAWLER.search(ua):
                return UaView("declared_agent", ("ua_spider",), False, 0, False)
            return UaView("automation", ("ua_unknown",), False, 0, False)
        if family in BROWSERS and ua.startswith("Mozilla/5.0"):
            chrome = _major(_CHROME, ua)
            return UaView("browser", (), True, chrome, chrome >= 80 or _major(_FIREFOX, ua) >= 90)
        return UaView("automation", ("ua_unknown",), False, 0, False)


def _major(pattern: re.Pattern[str], ua: str) -> int:
    m = pattern.search(ua)
    return int(m.group(1)) if m else 0


def _hinted(hints: bytes) -> int:
    """The Chromium major version client hints claim (0: none)."""
    m = _HINT.search(hints)
    return int(m.group(1)) if m else 0
