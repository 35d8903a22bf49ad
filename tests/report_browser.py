"""A real browser for the report's page: Debian's headless Chromium driven by Selenium through Debian's chromedriver,
with a fresh profile and nothing of its own on the network (no background fetches, component updates, sync).

``Browser.open(page)`` loads a page from its file and returns what happened: every request the page's load made
(Chromium's DevTools network log), the resources the page itself counts (``performance`` entries), and the console's
messages. The report's tests use it; run as a script it makes the README's screenshots of the report:

    python tests/report_browser.py docs/images
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars",
         "--force-device-scale-factor=1")
INSTALL = "apt-get install -y chromium chromium-driver"


def missing() -> str | None:
    """Why no browser can be started here, or None when one can."""
    absent = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if absent:
        return f"no {' or '.join(absent)} on this machine ({INSTALL})"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@dataclass
class Visit:
    """What loading a page did."""

    url: str
    requests: list[str]  # every URL the browser requested for the page, the page's own included
    resources: list[str]  # performance.getEntriesByType("resource"): what the page fetched once loaded
    console: list[dict[str, Any]]  # the console's messages (level, message)

    @property
    def console_errors(self) -> list[dict[str, Any]]:
        return [entry for entry in self.console if entry.get("level") in ("SEVERE", "ERROR")]


class Browser:
    """One headless Chromium with a profile of its own (removed by ``close``)."""

    def __init__(self, width: int = 1200, height: int = 1400) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self._profile = tempfile.mkdtemp(prefix="looptrace-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)

    def open(self, page: Path) -> Visit:
        """Load ``page`` from its file, after a blank page (so that the logs hold this page's load alone)."""
        driver = self.driver
        driver.get("about:blank")
        driver.get_log("performance")  # read, and so emptied
        driver.get_log("browser")
        url = page.resolve().as_uri()
        driver.get(url)
        deadline = time.monotonic() + 30
        while driver.execute_script("return document.readyState") != "complete" and time.monotonic() < deadline:
            time.sleep(0.05)
        requests = []
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                requests.append(message["params"]["request"]["url"])
        resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        return Visit(url, requests, list(resources), driver.get_log("browser"))

    def run(self, script: str, *arguments: Any) -> Any:
        return self.driver.execute_script(script, *arguments)

    def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.CSS_SELECTOR, css).click()

    def screenshot(self, path: Path) -> None:
        self.driver.save_screenshot(str(path))

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)


# --- the README's screenshots ---------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def make_screenshots(folder: Path) -> list[Path]:
    """A week of runs made by the real Agent (benchmarks/week_of_runs.py), its report, and two screenshots of it:
    the overview, and the costliest looping run's view."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.week_of_runs import record, write_week

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="looptrace-screenshots-") as scratch:
        trace_file = Path(scratch) / "traces.jsonl"
        write_week(str(trace_file), record(scratch), runs=140)
        page = Path(scratch) / "report.html"
        subprocess.run([sys.executable, "-m", "looptrace", "report", "--trace-file", trace_file.name], check=True,
                       cwd=scratch)
        browser = Browser(width=1100, height=1080)
        try:
            visit = browser.open(page)
            assert not visit.console_errors and visit.requests == [visit.url], visit
            overview = folder / "report-overview.png"
            browser.screenshot(overview)
            browser.click("#top-loops a.run-link")
            time.sleep(0.2)
            browser.run("window.scrollTo(0, 0)")
            looping = folder / "report-looping-run.png"
            browser.screenshot(looping)
        finally:
            browser.close()
    return [overview, looping]


if __name__ == "__main__":
    for made in make_screenshots(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "images")):
        print(f"{made}: {made.stat().st_size:,} bytes")
