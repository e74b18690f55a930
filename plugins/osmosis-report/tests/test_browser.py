"""The report in a real browser (headless Chromium through its driver): the DOM, the console, the network.

Chromium and chromedriver come from Debian (`apt-get install chromium chromium-driver`, which
`.ci/run` does); without them these tests are skipped, saying so. Screenshots are kept in
``test-artifacts/`` at the repository root (or ``$OSMOSIS_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from report_helpers import REPO

from osmosis_report.render import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="no Chromium and chromedriver (apt-get install chromium chromium-driver; .ci/run installs them)",
)
ARTIFACTS = Path(os.environ.get("OSMOSIS_TEST_ARTIFACTS") or REPO / "test-artifacts")


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1600"):
        options.add_argument(arg)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def open_page(driver, path: Path) -> None:
    driver.get_log("performance")  # forget what earlier pages did
    driver.get_log("browser")
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + 10
    while driver.execute_script("return document.body.dataset.ready") != "1":
        assert time.monotonic() < deadline, "the page's script never finished"
        time.sleep(0.05)


def requests_made(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def wait_for(driver, script: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def shot(driver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / name))


def test_one_run_in_the_browser(browser, run_a, tmp_path):
    page = build_report([run_a], tmp_path / "one.html").path
    open_page(browser, page)
    shot(browser, "report-one-run.png")
    rows = "return document.querySelectorAll('#row-table tbody tr').length"
    assert browser.execute_script(rows) == 21
    assert browser.execute_script("return document.querySelectorAll('button.chip').length") == 42
    assert browser.execute_script("return document.querySelectorAll('svg').length") >= 6

    # filters: only failures (rows 0 and 2 hold failed rollouts), never solved (0, 1, 2), a category
    browser.execute_script("document.getElementById('filter-failures').click()")
    shown = "return [...document.querySelectorAll('#row-table tbody tr')].map(r => Number(r.dataset.row))"
    assert browser.execute_script(shown) == [0, 2]
    browser.execute_script("document.getElementById('filter-failures').click()")
    browser.execute_script("document.getElementById('filter-never').click()")
    assert browser.execute_script(shown) == [0, 1, 2]
    browser.execute_script("document.getElementById('filter-never').click()")
    browser.execute_script(
        "const s = document.getElementById('filter-category'); s.value = 'validation_error';"
        "s.dispatchEvent(new Event('change'))"
    )
    assert browser.execute_script(shown) == [2]
    browser.execute_script(
        "const s = document.getElementById('filter-category'); s.value = ''; s.dispatchEvent(new Event('change'))"
    )

    # a trajectory: row 3's first sample shows its multiply tool call with its arguments, and the result
    browser.execute_script("document.querySelector('tr[data-row=\"3\"] button.chip').click()")
    assert wait_for(browser, "return document.querySelector('#viewer-body .tool-call')")
    text = browser.execute_script("return document.getElementById('viewer-body').innerText")
    assert "multiply" in text
    assert '"a": 76' in text
    assert "63992" in text
    assert "You are a careful calculator" in text
    shot(browser, "report-trajectory.png")

    # a failed rollout: its category, stage and where it was raised
    browser.execute_script("document.querySelector('tr[data-row=\"2\"] button.chip').click()")
    assert wait_for(browser, "return document.querySelector('#viewer-body .error-box')")
    error = browser.execute_script("return document.querySelector('#viewer-body .error-box').innerText")
    assert "validation_error" in error
    assert "raised at main.py:" in error

    # the hostile row: its text is on the page, as text; nothing of it ran
    browser.execute_script("document.querySelector('tr[data-row=\"20\"] button.chip').click()")
    assert wait_for(browser, "return document.getElementById('viewer-body').innerText.includes('<script>')")
    assert browser.execute_script("return document.title").startswith("osmosis report")
    assert browser.execute_script("return document.querySelectorAll('main img, #viewer img').length") == 0
    assert browser.execute_script("return document.querySelectorAll('script').length") == 2 + len(
        browser.execute_script("return document.querySelectorAll('script[type=\"application/gzip+base64\"]')")
    )

    assert console_errors(browser) == []
    requests = requests_made(browser)
    assert page.resolve().as_uri() in requests  # (the log works: it saw the page itself)
    assert [u for u in requests if u != page.resolve().as_uri()] == []


def test_a_request_or_a_script_error_would_be_seen(browser, tmp_path):
    # the checks above can fail: a page that fetches and throws is caught by both
    page = tmp_path / "bad.html"
    page.write_text(
        '<!doctype html><body><img src="http://127.0.0.1:9/x.png">'
        "<script>document.body.dataset.ready = '1'; null.boom</script></body>"
    )
    open_page(browser, page)
    assert any("127.0.0.1:9" in u for u in requests_made(browser))
    assert console_errors(browser)


def test_two_runs_in_the_browser_show_the_rows_that_flipped(browser, run_a, run_b, tmp_path):
    page = build_report([run_a, run_b], tmp_path / "two.html").path
    open_page(browser, page)
    assert browser.execute_script("return document.querySelector('[data-broke]').dataset.broke") == "1"
    assert browser.execute_script("return document.querySelector('[data-fixed]').dataset.fixed") == "2"
    shown = "return [...document.querySelectorAll('#row-table tbody tr')].map(r => Number(r.dataset.row))"
    select = (
        "const s = document.getElementById('filter-flip'); s.value = arguments[0]; s.dispatchEvent(new Event('change'))"
    )
    browser.execute_script(select, "down")
    assert browser.execute_script(shown) == [3]
    browser.execute_script(select, "up")
    assert browser.execute_script(shown) == [0, 1]
    browser.execute_script(select, "any")
    assert browser.execute_script(shown) == [0, 1, 3]
    flips = "return [...document.querySelectorAll('td[data-flip]')].map(td => td.dataset.flip)"
    assert browser.execute_script(flips) == ["up", "up", "down"]
    # a rollout of the second run opens from its own column
    browser.execute_script('document.querySelector(\'tr[data-row="3"] button.chip[data-run="1"]\').click()')
    assert wait_for(browser, "return document.getElementById('viewer-title').innerText.includes('2. b')")
    browser.execute_script("document.getElementById('rows').scrollIntoView()")
    shot(browser, "report-comparison.png")
    assert console_errors(browser) == []
    assert [u for u in requests_made(browser) if u != page.resolve().as_uri()] == []
