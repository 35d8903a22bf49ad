"""The report's page in a real browser (headless Chromium, tests/report_browser.py): it loads with no console error
and no network request, its overview shows `detect --json`'s figures, clicking a run shows the run's timeline with
its loop at the right turns, and a file recorded without content shows none, in the page's text or its source.

Without Chromium on the machine these tests skip, saying what to install; in CI (CI=true) they fail instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from report_browser import Browser, missing
from report_pages import figures_of_detect

pytestmark = pytest.mark.slow

DEMO_CONTENT = ("Reserve a projector for 2026-10-08", "projector", "EQ-002", "no stock left", "full_day",
                "booked for the whole day", "You book office equipment")

# The figures of the overview, read from what the browser shows: each figure's data-value beside its text.
READ_OVERVIEW = """
const value = (el) => Number(el.getAttribute('data-value'));
const kpi = (name) => value(document.querySelector(`[data-kpi="${name}"]`));
const table = (id) => Object.fromEntries([...document.querySelectorAll(`#${id} tbody tr`)].map(
    (row) => [row.getAttribute('data-name'), [...row.querySelectorAll('td[data-value]')].map(value)]));
return {
  visible: document.getElementById('overview').offsetParent !== null,
  runs: kpi('runs'), looped: kpi('looped'), anomalies: kpi('anomalies'), loop_tokens: kpi('loop-tokens'),
  loop_usd: kpi('loop-usd'), unresolved: kpi('unresolved'),
  statuses: Object.fromEntries([...document.querySelectorAll('ul.legend li[data-status]')].map(
      (li) => [li.getAttribute('data-status'), value(li)])),
  agents: table('agents'), tools: table('tools'),
  top_loops: [...document.querySelectorAll('#top-loops tbody tr')].map((row) => [
      row.getAttribute('data-trace-id'), row.getAttribute('data-type'), Number(row.getAttribute('data-tokens')),
      row.getAttribute('data-usd') === '' ? null : Number(row.getAttribute('data-usd'))]),
  shown: [...document.querySelectorAll('.kpi b')].map((b) => b.textContent),
};
"""

# Where the open run's loop band and turn bars are drawn, on the screen.
READ_RUN = """
const run = [...document.querySelectorAll('section.run')].find((s) => s.offsetParent !== null);
if (!run) return null;
const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.right]; };
const band = run.querySelector('g.loop');
return {
  id: run.id, overviewVisible: document.getElementById('overview').offsetParent !== null,
  loop: band && {type: band.getAttribute('data-type'), first: Number(band.getAttribute('data-first-turn')),
                 last: Number(band.getAttribute('data-last-turn')), box: box(band.querySelector('.loop-band')),
                 label: band.querySelector('.loop-label').textContent},
  turns: Object.fromEntries([...run.querySelectorAll('rect[data-turn].turn, rect[data-turn].turn.odd')].map(
      (r) => [r.getAttribute('data-turn'), box(r)])),
  fired: [...run.querySelectorAll('ol.turns > li.fired')].map((li) => li.getAttribute('data-turn')),
};
"""


@pytest.fixture(scope="module")
def browser():
    reason = missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the report's browser tests must run in CI: {reason}")
        pytest.skip(reason)
    chromium = Browser()
    yield chromium
    chromium.close()


def looptrace(*argv: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "looptrace", *argv], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """The three demos' runs, with content and without, each file with its report."""
    folder = tmp_path_factory.mktemp("report-browser")
    made = {}
    for name, capture in (("on", "true"), ("off", "false")):
        trace_file = folder / f"{name}.jsonl"
        for demo in ("equipment", "runaway", "ignored-error", "equipment"):
            done = looptrace("demo", demo, cwd=folder,
                             env={"LOOPTRACE_TRACE_FILE": str(trace_file), "LOOPTRACE_CAPTURE_CONTENT": capture})
            assert done.returncode in (0, 30), done.stderr
        page = folder / f"{name}.html"
        done = looptrace("report", "--trace-file", trace_file.name, "--output", page.name, cwd=folder)
        assert done.returncode == 0, done.stderr
        verdicts = looptrace("detect", "--json", "--all", trace_file.name, cwd=folder)
        made[name] = (page, figures_of_detect(verdicts.stdout))
    assert not (folder / ".looptrace").exists()
    return made


@pytest.mark.parametrize("which", ["on", "off"])
def test_the_page_loads_with_no_console_error_and_no_network_request(browser, demos, which):
    page, _ = demos[which]
    visit = browser.open(page)
    assert visit.console_errors == []
    assert visit.requests == [visit.url]  # the page itself, from its file: nothing else, from anywhere
    assert visit.resources == []
    browser.click("#runs a.run-link")  # and a run's view, drawn from the same page, fetches nothing either
    assert browser.run("return performance.getEntriesByType('resource').length") == 0
    assert browser.driver.get_log("browser") == []


def test_the_overview_shows_what_detect_json_says(browser, demos):
    page, expected = demos["on"]
    browser.open(page)
    shown = browser.run(READ_OVERVIEW)
    assert shown["visible"]
    for figure in ("runs", "looped", "anomalies", "loop_tokens", "unresolved", "statuses"):
        assert shown[figure] == expected[figure], figure
    assert round(shown["loop_usd"], 6) == expected["loop_usd"]
    assert {name: [*row[:4], round(row[4], 6)] for name, row in shown["agents"].items()} == expected["agents"]
    looping_tools = {name: [*row[1:4], round(row[4], 6)] for name, row in shown["tools"].items() if row[1]}
    assert looping_tools == expected["tools"]
    assert [tuple(row) for row in shown["top_loops"]] == expected["top_loops"]
    assert shown["shown"][:2] == [f"{expected['runs']}", f"{expected['looped']}"]  # and the numbers read so


def test_clicking_a_run_shows_its_timeline_with_the_loop_at_its_turns(browser, demos):
    page, expected = demos["on"]
    browser.open(page)
    assert browser.run(READ_RUN) is None  # the overview first, no run open
    [(trace_id, kind, _, _)] = [loop for loop in expected["top_loops"] if loop[1] == "repeated_call"]
    browser.click(f'#runs tr[data-trace-id="{trace_id}"] a.run-link')
    run = browser.run(READ_RUN)
    assert run["id"] == f"run-{trace_id}" and not run["overviewVisible"]
    loop = run["loop"]
    assert (loop["type"], loop["first"], loop["last"]) == (kind, 1, 4) == ("repeated_call", 1, 4)
    assert sorted(run["turns"]) == ["1", "2", "3", "4"]
    # on the screen, the band starts where turn 1 starts and ends where turn 4 ends
    assert abs(loop["box"][0] - run["turns"]["1"][0]) < 1.5 and abs(loop["box"][1] - run["turns"]["4"][1]) < 1.5
    assert loop["label"].startswith("repeated_call search_equipment ×4, turns 1–4")
    assert run["fired"] == ["3", "4"]
    browser.click("section.run.current p.back a")  # and back
    assert browser.run(READ_RUN) is None and browser.run(READ_OVERVIEW)["visible"]


def test_a_file_recorded_without_content_shows_none_in_the_browser(browser, demos):
    page, expected = demos["off"]
    browser.open(page)
    shown_text = [browser.run("return document.documentElement.innerText")]
    for link in browser.run("return [...document.querySelectorAll('#runs a.run-link')].map(a => a.hash)"):
        browser.run(f"window.location.hash = '{link}'")
        browser.run("document.querySelectorAll('details').forEach((d) => d.open = true)")
        shown_text.append(browser.run("return document.body.innerText"))
    source = unescape(browser.run("return document.documentElement.outerHTML"))
    for text in DEMO_CONTENT:
        assert text.lower() not in source.lower()
        assert all(text.lower() not in shown.lower() for shown in shown_text)
    assert browser.run("return document.querySelectorAll('details.content, blockquote.answer').length") == 0
    assert browser.run(READ_OVERVIEW)["looped"] == expected["looped"] == 1  # the loop is found all the same
