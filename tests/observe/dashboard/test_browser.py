"""The dashboard in a real browser: Debian's headless Chromium, driven by
Playwright, loads the page from a real PoP's admin listener with the login URL
that `edgefn dashboard` prints, and watches the figures change while this test
sends traffic. Saves a screenshot to $EDGEFN_ARTIFACTS (or the test's tmp dir)."""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.cli.dashboard import login_url
from runtime.functions import deploys
from runtime.observe.dashboard.aggregator import Rolling
from tests.support import Running, function_dir, pop_thread, python_function, reactor, wait_for

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
FAILING = "def handle(request, env):\n    raise RuntimeError('boom')\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("dash")
    with pop_thread(root / "data", **{"geo": "eu-west"}) as pop:
        pop.deploy(function_dir(root, "hello", reactor("")))
        pop.deploy(python_function(root, "failing", FAILING))
        canary = function_dir(root / "next", "hello", reactor("", "(; v2 ;)"))
        v2 = pop.admin.request("POST", "/v1/stage",
                               deploys.to_tar(deploys.pack_dir(canary)))["version"]
        pop.admin.request("POST", "/v1/functions/hello/activate",
                          json.dumps({"version": v2, "canary": 5}).encode())
        yield pop


def admin_get(pop: Running, path: str, cookie: str = "") -> tuple[int, bytes]:
    host, port = pop.admin.info.admin.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers={"cookie": cookie} if cookie else {})
        resp = conn.getresponse()
        streaming = resp.getheader("content-type") == "text/event-stream"
        return resp.status, b"" if streaming else resp.read()  # a stream never ends
    finally:
        conn.close()


def chromium() -> str:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: .ci/services installs it "
                    "(apt-get install -y chromium, as root)")
    return CHROMIUM


def test_the_page_shows_live_figures_as_traffic_flows(served: Running,
                                                       tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url = login_url(str(served.data))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=ARGS)
        try:
            page = browser.new_page()
            assert page.goto(url).status == 200  # type: ignore[union-attr]
            expect(page.locator("#state")).to_contain_text("live", timeout=10_000)
            # the session is the dashboard's alone: a function on another port of this
            # host got it with every request (browsers ignore ports for cookies)
            assert [c["path"] for c in page.context.cookies()] == ["/dashboard"]
            before = int(page.locator("#requests").inner_text())
            sent = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                for _ in range(10):
                    assert served.get("/hello")[0] == 200
                sent += 10
                served.get("/failing")
                if page.locator("#functions td", has_text="failing").count() and \
                        page.locator("#rps").inner_text() not in ("0", ""):
                    break
                time.sleep(0.1)
            rps = int(page.locator("#rps").inner_text())
            assert 0 < rps <= sent + 20
            assert int(page.locator("#requests").inner_text()) > before
            hello = page.locator("#functions tr", has_text="hello")
            expect(hello).to_have_count(1)
            p99 = float(hello.locator("td").nth(5).inner_text())
            assert 0 < p99 < 10_000  # ms; the PoP's request timeout bounds it
            expect(page.locator("#functions tr", has_text="failing").locator("td").nth(2)) \
                .not_to_have_text("0")
            assert page.locator("#error-rate").inner_text() != "0.0%"
            assert page.locator("#events tbody tr").count() > 0
            expect(page.locator("#events td.err").first).to_have_text("500")
            expect(page.locator("#versions tr", has_text="failing")).to_have_count(1)
            canary = served.pop.registry.canaries["hello"].fn.version
            expect(page.locator("#versions tr", has_text="hello").locator("td").nth(3)) \
                .to_have_text(f"{canary} at 5%")  # (it showed the live version alone)
            expect(page.locator("#geo")).to_have_text("eu-west")
            out = Path(os.environ.get("EDGEFN_ARTIFACTS") or tmp_path) / "dashboard.png"
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
            print(f"dashboard screenshot: {out}")
            # the login token was used up by this browser: a second one gets 401
            other = browser.new_page()
            assert other.goto(url).status == 401  # type: ignore[union-attr]
        finally:
            browser.close()


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/app.js", "/dashboard/style.css",
                                  "/dashboard/stream", "/v1/dashboard/stream"])
def test_without_a_session_everything_is_401(served: Running, path: str) -> None:
    assert admin_get(served, path)[0] == 401
    assert admin_get(served, path, cookie="edgefn_dash=forged")[0] == 401


def test_bad_and_reused_tokens_are_401(served: Running) -> None:
    assert admin_get(served, "/dashboard?token=nope")[0] == 401
    path = served.admin.request("POST", "/v1/dashboard/login")["path"]
    assert admin_get(served, path)[0] == 200
    status, body = admin_get(served, path)
    assert status == 401 and b"already used" in body


def test_dashboard_off_answers_404(tmp_path: Path) -> None:
    from edgefn_core.errors import AdminError

    with pop_thread(tmp_path / "data", **{"dashboard.enabled": False}) as pop:
        assert pop.pop.dashboard is None
        with pytest.raises(AdminError) as e:
            pop.admin.request("POST", "/v1/dashboard/login")
        assert e.value.status == 404
        pop.pop.watch_dashboard()  # nothing to watch
        assert not any(isinstance(o, Rolling) for o in pop.pop.observers)
        with pytest.raises(AdminError) as e:
            pop.admin.request("GET", "/dashboard")
        assert e.value.status == 404


def test_edgefn_dashboard_prints_a_login_url_that_works_once(served: Running) -> None:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "runtime.cli", "dashboard", "--data",
                          str(served.data), "--json"], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, "EDGEFN_API_KEY": ""})
    url = json.loads(out.stdout)["url"]
    prefix = f"http://{served.admin.info.admin}/dashboard?token="
    assert url.startswith(prefix) and len(url) > len(prefix) + 20
    assert admin_get(served, url.removeprefix(f"http://{served.admin.info.admin}"))[0] == 200
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "dashboard", "--data",
                          str(served.data)], capture_output=True, text=True, timeout=60,
                         check=True, env={**os.environ, "EDGEFN_API_KEY": ""})
    (url,) = out.stdout.split()  # the URL alone: curl "$(edgefn dashboard)" works
    assert url.startswith(prefix) and "works once" in out.stderr
    assert admin_get(served, url.removeprefix(f"http://{served.admin.info.admin}"))[0] == 200


def test_the_aggregator_observes_from_the_first_login_with_the_rings_history(
        tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(function_dir(tmp_path, "hello", reactor("")))
        for _ in range(5):
            assert pop.get("/hello")[0] == 200
        rolling = pop.pop.dashboard
        assert rolling is not None and rolling not in pop.pop.observers  # nobody watches
        login_url(str(pop.data))
        login_url(str(pop.data))  # a second login adds no second observer
        assert list(pop.pop.observers).count(rolling) == 1
        assert rolling.total == 5  # replayed from the ring
        pop.get("/hello")
        # events are delivered right after the response is sent, in a batch
        wait_for(lambda: rolling.total == 6, 2.0, "the new request counted")


def test_a_restart_that_ends_the_session_says_so(tmp_path: Path) -> None:
    """After a PoP restart the stream's reconnect gets 401 (sessions live in the PoP's
    memory): the browser stops trying for good, while the page said "retrying…" and
    kept its old figures. And no request of the page fails (the browser asked for
    /favicon.ico: a 401 in the console at every load)."""
    import socket

    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=ARGS)
        try:
            page = browser.new_page()
            failed: list[str] = []
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.on("response", lambda r: r.status >= 400 and failed.append(r.url))
            with pop_thread(data, **{"admin.port": port}):
                assert page.goto(login_url(str(data))).status == 200  # type: ignore[union-attr]
                expect(page.locator("#state")).to_contain_text("live", timeout=10_000)
                assert failed == []
            with pop_thread(data, **{"admin.port": port}):
                expect(page.locator("#state")).to_contain_text("session ended",
                                                               timeout=20_000)
                assert page.evaluate("document.body.classList.contains('ended')")
        finally:
            browser.close()
