"""The classifier's table: what a User-Agent and its headers make a client."""

from __future__ import annotations

import pytest

from runtime.security.bots import agents
from runtime.security.bots.classify import Classifier
from tests.security.bots_helpers import BROWSER_HEADERS, CHROME

M = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; "
# (user agent, expected class, expected signals); browsers are sent with BROWSER_HEADERS
AGENTS = [
    (M + "ChatGPT-User/1.0; +https://openai.com/bot)", "declared_agent", "ua:ChatGPT-User"),
    (M + "OAI-SearchBot/1.0; +https://openai.com/searchbot)", "declared_agent", "ua:OAI-SearchBot"),
    (M + "GPTBot/1.1; +https://openai.com/gptbot)", "declared_agent", "ua:GPTBot"),
    (M + "Claude-User/1.0; +Claude-User@anthropic.com)", "declared_agent", "ua:Claude-User"),
    (M + "Claude-SearchBot/1.0; +https://www.anthropic.com)", "declared_agent",
     "ua:Claude-SearchBot"),
    (M + "ClaudeBot/1.0; +claudebot@anthropic.com)", "declared_agent", "ua:ClaudeBot"),
    (M + "Perplexity-User/1.0; +https://perplexity.ai/perplexity-user)", "declared_agent",
     "ua:Perplexity-User"),
    (M + "PerplexityBot/1.0; +https://perplexity.ai/perplexitybot)", "declared_agent",
     "ua:PerplexityBot"),
    (M + "MistralAI-User/1.0; +https://docs.mistral.ai/robots)", "declared_agent",
     "ua:MistralAI-User"),
    ("DuckAssistBot/1.2; (+http://duckduckgo.com/duckassistbot.html)", "declared_agent",
     "ua:DuckAssistBot"),
    ("DuckDuckBot/1.1; (+http://duckduckgo.com/duckduckbot.html)", "declared_agent",
     "ua:DuckDuckBot"),
    ("Mozilla/5.0 (compatible; Google-Extended)", "declared_agent", "ua:Google-Extended"),
    ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
     "declared_agent", "ua:Googlebot"),
    (M + "bingbot/2.0; +http://www.bing.com/bingbot.htm) Chrome/116.0.1938.76 Safari/537.36",
     "declared_agent", "ua:Bingbot"),
    ("Mozilla/5.0 (compatible; Applebot-Extended/0.1)", "declared_agent",
     "ua:Applebot-Extended"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_5) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "Version/13.1.1 Safari/605.1.15 (Applebot/0.1; +http://www.apple.com/go/applebot)",
     "declared_agent", "ua:Applebot"),
    ("Mozilla/5.0 (Linux; Android 5.0) AppleWebKit/537.36 (KHTML, like Gecko) Mobile "
     "Safari/537.36 (compatible; Bytespider; spider-feedback@bytedance.com)", "declared_agent",
     "ua:Bytespider"),
    ("CCBot/2.0 (https://commoncrawl.org/faq/)", "declared_agent", "ua:CCBot"),
    (M + "Amazonbot/0.1; +https://developer.amazon.com/support/amazonbot) Chrome/119.0.6045.214 "
     "Safari/537.36", "declared_agent", "ua:Amazonbot"),
    ("meta-externalagent/1.1 (+https://developers.facebook.com/docs/sharing/webmasters/crawler)",
     "declared_agent", "ua:meta-externalagent"),
    ("meta-externalfetcher/1.1 (+https://developers.facebook.com/docs/sharing/webmasters/"
     "crawler)", "declared_agent", "ua:meta-externalfetcher"),
    ("Mozilla/5.0 (Windows NT 6.1; WOW64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/31.0.1650.57 Safari/537.36 (compatible; Diffbot/0.1; +http://www.diffbot.com)",
     "declared_agent", "ua:Diffbot"),
    ("cohere-ai/1.0 (+https://cohere.com)", "declared_agent", "ua:cohere-ai"),
    ("Mozilla/5.0 (compatible; YouBot (+http://www.you.com))", "declared_agent", "ua:YouBot"),
    ("curl/8.5.0", "automation", "ua:curl"),
    ("Wget/1.21.4", "automation", "ua:Wget"),
    ("python-requests/2.32.3", "automation", "ua:python-requests"),
    ("python-httpx/0.27.0", "automation", "ua:httpx"),
    ("Python-urllib/3.13", "automation", "ua:Python-urllib"),
    ("Python/3.12 aiohttp/3.9.5", "automation", "ua:aiohttp"),
    ("Go-http-client/1.1", "automation", "ua:Go-http-client"),
    ("okhttp/4.12.0", "automation", "ua:okhttp"),
    ("node-fetch/1.0 (+https://github.com/bitinn/node-fetch)", "automation", "ua:node-fetch"),
    ("axios/1.7.2", "automation", "ua:axios"),
    ("Scrapy/2.11.2 (+https://scrapy.org)", "automation", "ua:Scrapy"),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "HeadlessChrome/124.0.0.0 Safari/537.36", "automation", "ua:HeadlessChrome"),
    ("Mozilla/5.0 (Unknown; Linux x86_64) AppleWebKit/538.1 (KHTML, like Gecko) "
     "PhantomJS/2.1.1 Safari/538.1", "automation", "ua:PhantomJS"),
]
BROWSERS = [
    CHROME,
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.6367.82 Mobile Safari/537.36",
    CHROME + " Edg/124.0.2478.80",
    CHROME + " OPR/110.0.0.0",
    "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) "
    "SamsungBrowser/25.0 Chrome/121.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.4 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) CriOS/124.0.6367.88 Mobile/15E148 Safari/604.1",
]
OTHERS = [
    ("Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)",
     "declared_agent", "ua_spider"),
    ("Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)", "declared_agent",
     "ua_spider"),
    ("Java/17.0.2", "automation", "ua_unknown"),
    ("libwww-perl/6.72", "automation", "ua_unknown"),
    ("my-script", "automation", "ua_unknown"),
]


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier(agents.load())


def headers(ua: str, **extra: str) -> dict[bytes, bytes]:
    fields = {"user-agent": ua, **BROWSER_HEADERS, **extra}
    return {k.encode(): v.encode() for k, v in fields.items() if v}


@pytest.mark.parametrize(("ua", "cls", "signal"), AGENTS + OTHERS)
def test_non_browsers_are_classed_by_their_user_agent(classifier: Classifier, ua: str, cls: str,
                                                      signal: str) -> None:
    # browser headers do not make a declared bot a browser
    assert classifier.classify(headers(ua)) == (cls, (signal,))
    assert classifier.classify({b"user-agent": ua.encode()}) == (cls, (signal,))


def test_the_table_names_every_packaged_agent() -> None:
    listed = {a.name for a in agents.load().agents}
    assert listed == {signal.removeprefix("ua:") for _, _, signal in AGENTS}
    assert len(AGENTS) + len(BROWSERS) + len(OTHERS) >= 30


@pytest.mark.parametrize("ua", BROWSERS)
def test_browsers_with_browser_headers_are_browsers(classifier: Classifier, ua: str) -> None:
    assert classifier.classify(headers(ua)) == ("browser", ())


@pytest.mark.parametrize(("extra", "signal"), [
    ({"accept-language": ""}, "browser_headers_missing"),
    ({"accept": ""}, "browser_headers_missing"),
    ({"sec-fetch-mode": ""}, "no_sec_fetch"),
    ({"sec-ch-ua": '"Chromium";v="120", "Google Chrome";v="120", "Not-A.Brand";v="99"'},
     "hints_mismatch"),
    ({"sec-ch-ua": '"Not-A.Brand";v="99"'}, "hints_mismatch"),
])
def test_a_chrome_user_agent_whose_headers_disagree_is_automation(
        classifier: Classifier, extra: dict[str, str], signal: str) -> None:
    assert classifier.classify(headers(CHROME, **extra)) == ("automation", (signal,))


def test_client_hints_that_agree_keep_a_browser() -> None:
    hints = '"Chromium";v="124", "Google Chrome";v="124", "Not-A.Brand";v="99"'
    assert Classifier(agents.load()).classify(headers(CHROME, **{"sec-ch-ua": hints})) == (
        "browser", ())


def test_hints_from_a_browser_that_sends_none_disagree(classifier: Classifier) -> None:
    firefox = "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"
    hints = '"Chromium";v="124", "Google Chrome";v="124"'
    assert classifier.classify(headers(firefox, **{"sec-ch-ua": hints}))[1] == ("hints_mismatch",)
    # Firefox 90+ sends Sec-Fetch-*; Safari before 16.4 did not, so it is not asked of Safari
    assert classifier.classify(headers(firefox, **{"sec-fetch-mode": ""}))[1] == ("no_sec_fetch",)
    safari = BROWSERS[6]
    assert classifier.classify(headers(safari, **{"sec-fetch-mode": ""})) == ("browser", ())


def test_no_user_agent_is_automation(classifier: Classifier) -> None:
    assert classifier.classify({}) == ("automation", ("empty_ua",))
    assert classifier.classify({b"user-agent": b""}) == ("automation", ("empty_ua",))


def test_absurd_version_numbers_are_not_a_crash(classifier: Classifier) -> None:
    ua = CHROME.replace("124.0.0.0", "9" * 5000)
    hints = '"Chromium";v="' + "9" * 5000 + '"'
    assert classifier.classify(headers(ua, **{"sec-ch-ua": hints}))[0] == "automation"


def test_the_user_agent_cache_is_a_bounded_lru() -> None:
    classifier = Classifier(agents.load(), cache_size=3)
    for ua in (b"a/1", b"b/1", b"c/1"):
        classifier.view(ua)
    classifier.view(b"a/1")  # now the most recent
    classifier.view(b"d/1")  # evicts b, the least recent
    assert list(classifier._cache) == [b"c/1", b"a/1", b"d/1"]


def test_a_bad_agents_file_names_the_file_and_field(tmp_path) -> None:
    from edgefn_core.errors import InvalidConfig

    bad = tmp_path / "agents.toml"
    bad.write_text('[[agent]]\nname = "X"\noperator = "Y"\npattern = "(unclosed"\nkind = "tool"\n')
    with pytest.raises(InvalidConfig, match=r"agents.toml: field `agent\[0\].pattern`"):
        agents.load(str(bad))
    bad.write_text('[[agent]]\nname = "X"\noperator = "Y"\npattern = "x"\nkind = "robot"\n')
    with pytest.raises(InvalidConfig, match="kind"):
        agents.load(str(bad))
    with pytest.raises(InvalidConfig, match="cannot read"):
        agents.load(str(tmp_path / "missing.toml"))


def test_the_user_agent_parser_is_built_when_the_classifier_is_not_on_a_request() -> None:
    """ua_parser builds its regex set on first use (~120 ms): the first browser's request
    paid it on the PoP's loop, stalling every other request meanwhile."""
    import subprocess
    import sys

    code = ("import ua_parser\n"
            "from runtime.security.bots.agents import load\n"
            "from runtime.security.bots.classify import Classifier\n"
            "assert 'parser' not in vars(ua_parser)\n"
            "Classifier(load())\n"
            "assert 'parser' in vars(ua_parser)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
