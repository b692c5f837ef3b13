"""Retake docs/report.png: the report of a real run, sampled, in headless Chromium.

    python tools/report_screenshot.py [--out docs/report.png] [--keep DIR]

Runs a small training loop (below, ``WORKLOAD``) under ``mxprof run --sample
1000`` in a temporary directory: a loader thread decodes batches (Python work
and a sleep standing for file reads) and feeds them through a queue; the main
thread waits on the queue, then runs forward, backward and an optimizer step,
records a loss counter and its activations' memory by scope. The page mxprof
run wrote is opened in Debian's chromium (``apt-get install chromium
chromium-driver``; selenium from the test extra), once every figure is drawn,
and its top (hints, summary, ranges, the whole program's flame graph) saved
at 1280 px wide. ``--keep DIR`` keeps the trace and the page there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH, HEIGHT = 1280, 2000

WORKLOAD = """
import queue, random, threading, time
import mxprof

train, data = mxprof.Domain("train"), mxprof.Domain("data")
step = train.new_frame("step")
forward, backward, optimizer = (train.new_task(n) for n in ("forward", "backward", "optimizer"))
decode = data.new_task("decode")
loss = train.new_counter("loss", 0)


def decode_batch(rng):
    return [rng.gauss(0, 1) for _ in range(6000)]


def loader(batches, n):
    rng = random.Random(0)
    for _ in range(n):
        with decode:
            batch = decode_batch(rng)
            time.sleep(0.006)  # reading the files
        batches.put(batch)


def layer(xs, w):
    return [max(0.0, w * x) for x in xs]


def main(steps=120):
    batches = queue.Queue(maxsize=2)
    threading.Thread(target=loader, args=(batches, steps), name="loader", daemon=True).start()
    w = 0.5
    for i in range(steps):
        with step:
            batch = batches.get()
            with mxprof.scope("model:"), forward:
                acts = mxprof.memory.record_alloc(len(batch) * 4 * 8, "cpu:0", tag="act")
                h = batch
                for _ in range(3):
                    h = layer(h, w)
            with backward:
                grad = sum(h) / len(h)
                mxprof.memory.record_free(acts)
            with optimizer:
                w -= 0.01 * grad
            loss.set_value(int(1000 * abs(grad)))


main()
"""


def run(folder: str) -> str:
    """The workload under mxprof run in folder; the path of the page it wrote."""
    script = os.path.join(folder, "train.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(WORKLOAD)
    subprocess.run(
        [sys.executable, "-m", "mxprof", "run", "--sample", "1000", "--top", "0", "train.py"],
        cwd=folder,
        check=True,
        timeout=300,
    )
    page = os.path.join(folder, "profile.report.html")
    if not os.path.exists(page):
        raise SystemExit(f"mxprof run wrote no report in {folder}")
    return page


def screenshot(page: str, out: str, profile: str) -> None:
    """The top of page, every figure drawn, as a PNG at out."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("needs chromium and chromium-driver (apt-get install ...)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        f"--window-size={WIDTH},{HEIGHT}", "--hide-scrollbars", "--no-first-run",
        "--disable-background-networking", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get("file://" + os.path.abspath(page))
        deadline = time.monotonic() + 30
        drawn = "Array.from(document.querySelectorAll('.plotly-graph-div')).every(d => d.data)"
        while not driver.execute_script(f"return {drawn}"):
            if time.monotonic() > deadline:
                raise SystemExit("the page's figures were not drawn within 30 s")
            time.sleep(0.2)
        time.sleep(1)  # plotly's transitions
        # Down to the end of the whole program's flame graph (the selected range's
        # comes next): the window's height less its viewport's is the browser's own.
        bottom = driver.execute_script(
            "var e = document.getElementById('flame-title')"
            " || document.getElementById('sec-steps');"
            "return e.getBoundingClientRect().top + window.scrollY;"
        )
        chrome = HEIGHT - driver.execute_script("return window.innerHeight")
        driver.set_window_size(WIDTH, int(bottom) + chrome)
        driver.save_screenshot(out)
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "report.png"))
    parser.add_argument("--keep", help="keep the trace and the page in this directory")
    args = parser.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="mxprof-shot-")
    os.makedirs(folder, exist_ok=True)
    try:
        page = run(folder)
        screenshot(page, args.out, os.path.join(folder, "chromium-profile"))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"written {args.out} from {page}")


if __name__ == "__main__":
    main()
