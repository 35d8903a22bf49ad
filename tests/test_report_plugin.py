"""The pytest plugin's ``--looptrace-report=PATH``: the runs a test session made through looptrace's fixtures, as
`looptrace report`'s page, for a CI artifact; one page for a parallel session (pytest-xdist) too."""

from __future__ import annotations

import subprocess
import sys

import pytest
from report_pages import figures_of_page

pytestmark = pytest.mark.slow

TEST_MODULE = '''
from looptrace import tool
from looptrace.testing import final_answer, tool_use


@tool
def search(keyword: str) -> str:
    """Search the shelves."""
    return "nothing new"


def test_an_agent_that_goes_round_in_circles(scripted_agent):
    agent = scripted_agent([tool_use("search", {"keyword": "projector"}) for _ in range(6)]
                           + [final_answer("Nothing found.")], tools=[search], on_anomaly="warn")
    assert agent.run("Find a projector").anomalies


def test_an_agent_that_answers(scripted_agent):
    assert scripted_agent([final_answer("Hello.")]).run("Say hello").status.value == "done"


def test_no_agent_at_all():
    assert True
'''


def session(tmp_path, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_agents.py").write_text(TEST_MODULE, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *flags, "test_agents.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("parallel", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_session_writes_the_report_of_its_runs(tmp_path, parallel):
    done = session(tmp_path, "--looptrace-report=artifacts/report.html", *parallel)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "looptrace: 2 runs (1 looped, 2 drawn in full)" in done.stdout
    page = figures_of_page((tmp_path / "artifacts" / "report.html").read_text(encoding="utf-8"))
    assert (page["runs"], page["looped"], page["top_loops"][0][1]) == (2, 1, "repeated_call")
    assert (tmp_path / "artifacts" / "report.traces.jsonl").exists()  # the spans it was made from, beside it
    again = session(tmp_path, "--looptrace-report=artifacts/report.html", *parallel)  # a new session: its own runs
    assert figures_of_page((tmp_path / "artifacts" / "report.html").read_text(encoding="utf-8"))["runs"] == 2
    assert again.returncode == 0


def test_without_the_option_nothing_is_written(tmp_path):
    done = session(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "looptrace" not in done.stdout and not list(tmp_path.rglob("*.html"))
