"""The report as a person sees it: opened in a real headless Chromium, offline.

Debian's ``chromium`` and ``chromium-driver`` packages and selenium (the test
extra) drive it; without them the test skips naming what is missing (.ci/run
installs them).
"""

import json
import os
import shutil
import time

import pytest

import mxprof
from mxprof import _testing, memory

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the browser test needs selenium (the test extra)"
)

import mxprof.report  # noqa: E402 - after the skip for selenium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
        "chromium-driver); not found on PATH",
    ),
]
DOCS_SCREENSHOT = os.environ.get("MXPROF_REPORT_SCREENSHOT")  # where to copy one, if set


def record(path, clock):
    """A small training loop with known times: steps, data loading, a counter, memory."""
    _testing.start(path, profile_memory=True)
    train = mxprof.Domain("train")
    step, data, forward = train.new_frame("step"), train.new_task("data"), train.new_task("forward")
    loss = train.new_counter("loss", 100)
    for i in range(12):
        with step:
            with data:
                clock(2_000_000 if i != 7 else 30_000_000)  # step 7 waits for data
            with mxprof.scope("encoder:"), forward:
                buf = memory.record_alloc((1 + i % 3) << 20, "gpu:0", tag="act")
                clock(5_000_000 + 100_000 * i)
                memory.record_free(buf)
            loss.set_value(100 - 7 * i)
        clock(50_000)
    stats = json.loads(mxprof.dumps(format="json"))
    _testing.finish(path)
    return stats


@pytest.fixture
def browser(tmp_path):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--window-size=1280,2400", "--disable-background-networking", "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def wait_for(driver, script, timeout=30):
    """Poll a JavaScript expression until it is truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(f"return {script}")
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {script}")


def table(driver):
    """The ranges table: per row, name and the numbers (ns) of its cells."""
    return driver.execute_script(
        """
        var out = [];
        document.querySelectorAll('#ranges tbody tr').forEach(function (tr) {
          var c = tr.cells;
          out.push({name: c[0].textContent, cat: c[1].textContent,
                    count: +c[2].dataset.v, total: +c[3].dataset.v, self: +c[4].dataset.v,
                    p50: +c[6].dataset.v, p90: +c[7].dataset.v, p99: +c[8].dataset.v});
        });
        return out;
        """
    )


def test_the_report_in_a_real_browser(tmp_path, clock, browser):
    trace = tmp_path / "train.json"
    stats = record(trace, clock)
    # A second process (another rank, say), so the side-by-side plot is there too.
    other = _testing.load_trace(trace)
    for e in other["traceEvents"]:
        e["pid"] = 999_999
    (tmp_path / "rank1.json").write_text(json.dumps(other))
    page = tmp_path / "report.html"
    mxprof.report.report(["train.json", "rank1.json"], page)  # the test runs in tmp_path
    url = page.as_uri()

    browser.get(url)
    wait_for(browser, "document.readyState === 'complete' && window.Plotly !== undefined")
    plots = wait_for(
        browser,
        """(function () {
          var divs = document.querySelectorAll('.plotly-graph-div');
          var out = [];
          for (var i = 0; i < divs.length; i++) {
            var d = divs[i];
            if (!d.data || !d.querySelector('svg.main-svg')) return null;
            var points = 0;
            d.data.forEach(function (t) { points += (t.x || []).length; });
            out.push([d.id, d.data.length, points]);
          }
          return out.length ? out : null;
        })()""",
    )
    ids = {p[0] for p in plots}
    assert {"histogram", "steps", "counter-0", "memory-devices", "memory-scopes"} <= ids
    assert "processes" in ids
    for div_id, traces, points in plots:
        if div_id == "steps":
            points -= 0  # the outlier marker trace may be empty; the bars are not
        assert traces >= 1 and points > 0, (div_id, traces, points)

    # The numbers: both processes recorded the same run, so each row is twice dumps()'s.
    rows = {r["name"]: r for r in table(browser)}
    assert set(rows) >= {"step", "data", "forward"}
    for name, cat in (("step", "train,frame"), ("data", "train"), ("forward", "train")):
        live, shown = stats["Time"][cat][name], rows[name]
        assert shown["cat"] == cat
        assert shown["count"] == 2 * live["Count"] == 24
        assert shown["total"] == pytest.approx(2 * live["Total"] * 1e6, abs=24)
        assert shown["self"] == pytest.approx(2 * live["Self"] * 1e6, abs=24)
        for p in ("p50", "p90", "p99"):  # the live core's histogram: within 0.79 %
            assert shown[p] == pytest.approx(live[p.upper()] * 1e6, rel=0.0079)
    assert rows["data"]["p99"] == 30_000_000  # the slow step's data loading, exact

    # Sorting: by Count ascending-first-click is descending for numbers; by Name, text order.
    headers = browser.find_elements("css selector", "#ranges thead th")
    before = [r["name"] for r in table(browser)]
    headers[0].click()
    by_name = [r["name"] for r in table(browser)]
    assert by_name == sorted(by_name) and by_name != before
    headers[2].click()
    counts = [r["count"] for r in table(browser)]
    assert counts == sorted(counts, reverse=True)
    headers[2].click()
    assert [r["count"] for r in table(browser)] == sorted(counts)
    # Clicking a row draws its histogram.
    browser.find_element("xpath", "//table[@id='ranges']//td[text()='data']").click()
    title = browser.find_element("id", "hist-title").text
    assert title.startswith("Durations of data (24 ranges)")
    total = browser.execute_script(
        "var d = document.getElementById('histogram').data[0].y;"
        "return d.slice(0, d.length - 1).reduce(function (a, b) { return a + b; }, 0);"
    )
    assert total == 24

    shot = tmp_path / "report.png"
    browser.set_window_size(1280, 1800)
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if DOCS_SCREENSHOT:
        shutil.copyfile(shot, DOCS_SCREENSHOT)

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    requests = []  # (url, the document that made it) of every request the browser made
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            params = message["params"]
            requests.append((params["request"]["url"], params.get("documentURL")))
    assert (url, url) in requests
    # The page fetched nothing but itself (data: URLs are in the file), and no
    # request at all left the machine (the browser's own new-tab page loads
    # chrome:// resources, which are not the network).
    assert [u for u, doc in requests if doc == url and u != url and not u.startswith("data:")] == []
    assert [
        u for u, _ in requests if u.split(":")[0] in ("http", "https", "ws", "wss", "ftp")
    ] == []


def spin_a(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def spin_b(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_flame_graphs_follow_the_selected_range(tmp_path, browser):
    trace = tmp_path / "sampled.json"
    _testing.start(trace, sample_rate=1000)
    d = mxprof.Domain("d")
    with d.new_task("alpha"):
        spin_a(0.15)
    with d.new_task("beta"):
        spin_b(0.15)
    _testing.finish(trace)
    in_range = {}
    for (key, _), n in mxprof.load(trace).samples.counts().items():
        in_range[key] = in_range.get(key, 0) + n
    assert in_range.get(("d", "alpha")) and in_range.get(("d", "beta"))
    page = tmp_path / "report.html"
    mxprof.report.report(trace, page)

    browser.get(page.as_uri())
    wait_for(browser, "document.readyState === 'complete' && window.Plotly !== undefined")
    drawn = """(function (id, root) {
      var d = document.getElementById(id);
      if (!d || !d.data || !d.data.length || !d.querySelector('g.iciclelayer path')) return null;
      if (d.data[0].labels[0] !== root) return null;
      return {type: d.data[0].type, labels: d.data[0].labels, root: d.data[0].values[0]};
    })"""
    program = wait_for(browser, f"{drawn}('flame-program', 'program')")
    assert program["type"] == "icicle"
    assert {"spin_a", "spin_b"} <= set(program["labels"])
    assert program["root"] == sum(in_range.values())
    # The first row (largest total) is selected at load; clicking beta shows beta's samples.
    for name, mine, other in (("beta", "spin_b", "spin_a"), ("alpha", "spin_a", "spin_b")):
        browser.find_element("xpath", f"//table[@id='ranges']//td[text()='{name}']").click()
        shown = wait_for(browser, f"{drawn}('flame-range', '{name}')")
        assert shown["labels"][0] == name and shown["root"] == in_range[("d", name)]
        assert mine in shown["labels"] and other not in shown["labels"]
        title = browser.find_element("id", "flame-title").text
        assert title == f"Samples in {name} ({in_range[('d', name)]})"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


# Names a trace from someone else may carry: plotly draws a pseudo-HTML
# subset in labels, legends and titles, and a bidirectional override
# reverses what follows it.
HOSTILE = {
    "link": '<a href="https://example.com/">click</a>',
    "styled": '<span style="font-size:90px;color:red">big</span>',
    "reversed": "abc\u202edef",
    "bold": "<b>bold</b><br>next",
}


def test_names_from_the_trace_are_shown_as_text(tmp_path, clock, browser):
    """No link, no styled text, no reversed display: every name reads as it is
    written, the invisible override shown escaped (\\u202e)."""
    trace = tmp_path / "hostile.json"
    _testing.start(trace)
    domain = mxprof.Domain("d")
    step = domain.new_frame("step")
    tasks = [domain.new_task(name) for name in HOSTILE.values()]
    counter = domain.new_counter(HOSTILE["styled"], 0)
    for i in range(6):
        with step:
            for task in tasks:
                with task:
                    clock(1_000_000 + 10_000 * i)
            counter.set_value(i)
    _testing.finish(trace)
    page = tmp_path / "hostile.html"
    mxprof.report.report([str(trace)], page)
    html = page.read_text(encoding="utf-8")
    assert "\u202e" not in html  # not even inside the page's data

    browser.get(page.as_uri())
    wait_for(browser, "document.readyState === 'complete' && window.Plotly !== undefined")
    wait_for(
        browser,
        "document.querySelectorAll('.plotly-graph-div svg.main-svg').length > 0 && "
        "document.querySelector('#steps svg .legendtext') !== null",
    )
    drawn = browser.execute_script(
        """
        var svg = document.querySelectorAll('.plotly-graph-div svg');
        var links = 0, styled = 0, texts = [];
        svg.forEach(function (s) {
          links += s.querySelectorAll('a').length;
          s.querySelectorAll('text, tspan').forEach(function (t) {
            var style = (t.getAttribute('style') || '').replace(/\\s/g, '');
            if (style.indexOf('font-size:90px') >= 0) styled += 1;
            if (t.querySelector('tspan') === null) texts.push(t.textContent);
          });
        });
        var bold = 'svg text[style*="bold"], svg tspan[style*="bold"]';
        return {links: links, styled: styled, texts: texts, body: document.body.innerText,
                bold: document.querySelectorAll(bold).length};
        """
    )
    assert drawn["links"] == 0 and drawn["styled"] == 0 and drawn["bold"] == 0, drawn
    legend = " ".join(drawn["texts"])
    # The steps chart's legend holds each top-level range name, as written.
    assert HOSTILE["link"] in legend and HOSTILE["styled"] in legend
    assert "abc\\u202edef" in legend and "\u202e" not in legend
    assert "<b>bold</b><br>next" in legend
    # The ranges table too: the names as text, the override shown escaped.
    names = [row["name"] for row in table(browser)]
    assert HOSTILE["link"] in names and "abc\\u202edef" in names
    assert "\u202e" not in drawn["body"]
