"""The report in a real browser (headless Chromium through its driver): the DOM, the console, the network.

Chromium and chromedriver come from Debian (`apt-get install chromium chromium-driver`, which
`.ci/run` does); without them these tests are skipped, saying so. Screenshots are kept in
``test-artifacts/`` at the repository root (or ``$OSMOSIS_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from report_helpers import REPO, line, write_run

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


def open_page(driver, path: Path, fragment: str = "") -> None:
    driver.get_log("performance")  # forget what earlier pages did
    driver.get_log("browser")
    if fragment:
        driver.get("about:blank")  # (else a new fragment of the same page would not load it again)
    driver.get(path.resolve().as_uri() + fragment)
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
    assert browser.execute_script("return document.querySelectorAll('a.chip').length") == 42
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
    browser.execute_script("document.querySelector('tr[data-row=\"3\"] a.chip').click()")
    assert wait_for(browser, "return document.querySelector('#viewer-body .tool-call')")
    text = browser.execute_script("return document.getElementById('viewer-body').innerText")
    assert "multiply" in text
    assert '"a": 76' in text
    assert "63992" in text
    assert "You are a careful calculator" in text
    shot(browser, "report-trajectory.png")

    # a failed rollout: its category, stage and where it was raised
    browser.execute_script("document.querySelector('tr[data-row=\"2\"] a.chip').click()")
    assert wait_for(browser, "return document.querySelector('#viewer-body .error-box')")
    error = browser.execute_script("return document.querySelector('#viewer-body .error-box').innerText")
    assert "validation_error" in error
    assert "raised at main.py:" in error

    # the hostile row: its text is on the page, as text; nothing of it ran
    browser.execute_script("document.querySelector('tr[data-row=\"20\"] a.chip').click()")
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
    browser.execute_script('document.querySelector(\'tr[data-row="3"] a.chip[data-run="1"]\').click()')
    assert wait_for(browser, "return document.getElementById('viewer-title').innerText.includes('2. b')")
    browser.execute_script("document.getElementById('rows').scrollIntoView()")
    shot(browser, "report-comparison.png")
    assert console_errors(browser) == []
    assert [u for u in requests_made(browser) if u != page.resolve().as_uri()] == []


CHARTS = """
return [...document.querySelectorAll('figure.chart svg')].map((svg) => {
  const ticks = [...svg.querySelectorAll('text.tick[text-anchor="end"]')]
    .map((t) => [Number(t.textContent.replace('k', 'e3')), Number(t.getAttribute('y')) - 3.5]);
  const top = ticks.reduce((a, b) => (b[0] > a[0] ? b : a));
  const bars = [...svg.querySelectorAll('rect')].map((r) => {
    const title = r.querySelector('title').textContent;
    const at = (name) => Number(r.getAttribute(name));
    return [title, Number((/: (\\d+) /.exec(title) || [0, -1])[1]), at('y'), at('x'), at('height')];
  });
  const labels = [...svg.querySelectorAll('.rule-label')]
    .map((t) => { const b = t.getBBox(); return [b.x, b.y, b.width, b.height]; });
  const yTitle = (svg.querySelector('.y-title') || {}).textContent;
  return { chart: svg.closest('figure').dataset.chart, top, bars, labels, yTitle };
});
"""


def test_every_chart_reaches_its_data_titles_its_axes_and_keeps_its_labels_apart(browser, run_a, run_b, tmp_path):
    page = build_report([run_a, run_b], tmp_path / "charts.html").path
    open_page(browser, page)
    browser.execute_script("document.querySelectorAll('details').forEach((d) => d.open = true)")
    charts = browser.execute_script(CHARTS)
    assert len(charts) >= 12
    for chart in charts:
        (top_value, top_y), name = chart["top"], chart["chart"]
        assert chart["yTitle"], f"{name}: no y-axis title"
        for title, count, y, _, _ in chart["bars"]:
            assert count >= 1, f"{name}: {title!r} does not say what it counts"
            assert "rollout" in title, f"{name}: {title!r} does not say what it counts"
            assert count <= top_value, f"{name}: {title!r} goes past the axis's last tick, {top_value}"
            assert y >= top_y - 0.5, f"{name}: {title!r} is drawn above the axis's last tick"
        boxes = chart["labels"]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                apart = a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]
                assert apart, f"{name}: rule labels overlap: {a} and {b}"
    # the runs' reward histograms side by side: in each bin, one bar per run, each from the axis
    reward = next(c for c in charts if c["chart"] == "cmp-reward")
    bins: dict[str, list] = {}
    for title, _, y, x, h in reward["bars"]:
        bins.setdefault(title.split(":")[0], []).append((x, y + h))
    assert len(bins) >= 2
    for bars in bins.values():
        assert len({x for x, _ in bars}) == len(bars) == 2
        assert len({round(base, 1) for _, base in bars}) == 1
    assert console_errors(browser) == []


def test_the_viewer_shows_the_label_the_metrics_by_stage_a_link_long_text_and_hidden_characters(browser, tmp_path):
    first, second = line(0, 0, rollout_id="r-0"), line(1, 0, rollout_id="r-1")
    first["metrics"] = {"turns": 3, "exact.score": 1.0, "exact.reason": "match"}
    first["grader_metrics"] = ["exact.reason", "exact.score"]
    first["sample"]["messages"].append(
        {"role": "tool", "tool_call_id": "c1", "content": "saved as invoice_\u202egnp.exe"}
    )
    second["sample"]["messages"][1]["content"] = "x" * 5000 + "THE END"
    run = write_run(tmp_path / "v", [first, second], rows=2, labels=["42", "\u202e24"])
    page = build_report([run], tmp_path / "v.html").path
    open_page(browser, page)
    chips = "return [...document.querySelectorAll('#row-table a.chip')].map((a) => a.getAttribute('href'))"
    assert browser.execute_script(chips) == ["#rollout=0:r-0", "#rollout=0:r-1"]  # a link to each trajectory
    label = "return document.querySelector('tr[data-row=\"1\"] td.label').innerText"
    assert browser.execute_script(label) == "U+202E24"  # an RTL override in a label shows, and turns nothing round

    browser.execute_script("document.querySelector('tr[data-row=\"0\"] a.chip').click()")
    assert wait_for(browser, "return document.querySelector('#viewer-body .msg.tool')")
    body = browser.execute_script("return document.getElementById('viewer-body').innerText")
    sections = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#viewer-body .v-sec')]"
        ".map((s) => [s.querySelector('h3').textContent, s.innerText]))"
    )
    assert "label\t42" in sections["row"].replace("\n", "\t")
    assert "turns" in sections["workflow metrics"]
    assert "exact" not in sections["workflow metrics"]
    assert "exact.score" in sections["grader metrics"]
    assert "exact.reason" in sections["grader metrics"]
    assert "turns" not in sections["grader metrics"]
    # the override is drawn as a named marker, and never reaches the page as a character
    assert "invoice_U+202Egnp.exe" in body
    shown = "return document.querySelector('main').textContent + document.getElementById('viewer').textContent"
    assert "\u202e" not in browser.execute_script(shown)
    marker = "return document.querySelector('#viewer-body .hidden-char').title"
    assert browser.execute_script(marker) == "U+202E RIGHT-TO-LEFT OVERRIDE"
    assert browser.execute_script("return location.hash") == "#rollout=0:r-0"
    link = "return document.getElementById('viewer-link').getAttribute('href')"
    assert browser.execute_script(link) == "#rollout=0:r-0"

    # the link opens its trajectory: a long message shows folded, and unfolds
    open_page(browser, page, "#rollout=0:r-1")
    assert wait_for(browser, "return document.querySelector('#viewer-body button.unfold')")
    assert browser.execute_script("return document.getElementById('viewer-title').innerText").startswith("row 1")
    text = "return document.querySelector('#viewer-body .msg.assistant .text').textContent"
    assert len(browser.execute_script(text)) < 2100
    browser.execute_script("document.querySelector('#viewer-body button.unfold').click()")
    assert browser.execute_script(text) == "x" * 5000 + "THE END"
    button = "return document.querySelector('#viewer-body button.unfold').textContent"
    assert browser.execute_script(button) == "show less"
    shot(browser, "report-viewer-unfolded.png")
    assert console_errors(browser) == []
    assert [u for u in requests_made(browser) if not u.startswith(page.resolve().as_uri())] == []


def test_a_training_run_shows_reward_by_step_and_its_rows_filter_by_step(browser, tmp_path):
    # 30 steps of a trainer's batches (rows 0 and 1, 2 samples each, named again every step), the reward
    # rising; at step-12 one rollout failed and another had a call served by step-13's weights
    lines = []
    for k in range(30):
        for row in (0, 1):
            for sample in (0, 1):
                rid = f"step-{k}-g{row}-s{sample}"
                right = (row * 2 + sample) < k * 5 // 30
                failed = rid == "step-12-g1-s1"
                lines.append(line(row, sample, reward=float(right), version=f"step-{k}", rollout_id=rid,
                                  status="failure" if failed else "success"))  # fmt: skip
    run = write_run(tmp_path / "training", lines, meta={"kind": "serve"})
    calls = [
        {"policy_version": v, "prompt_token_ids": [1, 2], "completion_token_ids": [3]} for v in ("step-12", "step-13")
    ]
    (run / "traces.jsonl").write_text(
        json.dumps({"rollout_id": "step-12-g0-s1", "complete": True, "calls": calls}) + "\n"
    )
    page = build_report([run], tmp_path / "training.html").path
    open_page(browser, page)
    dots = "return document.querySelectorAll('figure[data-chart=\"r0-steps\"] circle.dot').length"
    assert browser.execute_script(dots) == 60  # mean reward and pass rate at each of the 30 steps
    ticks = browser.execute_script(
        'return [...document.querySelectorAll(\'figure[data-chart="r0-steps"] text.tick[text-anchor="middle"]\')]'
        ".map((t) => { const b = t.getBBox(); return [t.textContent, b.x, b.width]; })"
    )
    assert ticks[0][0] == "step-0"
    for (_, x, width), (_, next_x, _) in itertools.pairwise(ticks):
        assert x + width <= next_x, f"step labels overlap: {ticks}"  # thinned to what fits
    steps = "return [...document.querySelectorAll('table.steps tbody tr')].map((tr) => tr.dataset.step)"
    assert browser.execute_script(steps) == [f"step-{k}" for k in range(30)]
    browser.execute_script("document.querySelector('#run-0 .kpis').scrollIntoView(); window.scrollBy(0, -60)")
    shot(browser, "report-training-steps.png")

    # the row table: a step column, the trainer's row, and a filter by step
    assert browser.execute_script("return document.getElementById('filter-step').hidden") is False
    assert browser.execute_script("return document.querySelectorAll('#filter-step option').length") == 31
    browser.execute_script(
        "const s = document.getElementById('filter-step'); s.value = 'step-12'; s.dispatchEvent(new Event('change'))"
    )
    cells = (
        "return [...document.querySelectorAll('#row-table tbody tr')]"
        ".map((tr) => [tr.cells[0].innerText, tr.cells[1].innerText])"
    )
    assert browser.execute_script(cells) == [["0", "step-12"], ["1", "step-12"]]
    browser.execute_script("document.querySelectorAll('#row-table tbody tr')[0].querySelectorAll('a.chip')[1].click()")
    assert wait_for(browser, "return document.getElementById('viewer-body').innerText.includes('off-policy')")
    title = browser.execute_script("return document.getElementById('viewer-title').innerText")
    assert title.startswith("step-12 \u00b7 row 0, sample 1")
    body = browser.execute_script("return document.getElementById('viewer-body').innerText")
    assert "served by step-12, step-13" in body
    # j steps through the filtered rows only: the next rollouts are step-12's row 1
    browser.execute_script("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'j'}))")
    assert wait_for(
        browser, "return document.getElementById('viewer-title').innerText.startsWith('step-12 \u00b7 row 1')"
    )
    assert console_errors(browser) == []
    assert [u for u in requests_made(browser) if u != page.resolve().as_uri()] == []
