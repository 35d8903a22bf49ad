"""looptrace's pytest plugin (registered as a ``pytest11`` entry point, so installing looptrace is enough).

Fixtures:

* ``looptrace_spans``: a ``looptrace.testing.CapturedSpans``; the spans of the test's runs, in memory.
* ``scripted_agent``: builds an ``Agent`` that replays scripted model responses and records into ``looptrace_spans``::

      def test_books_the_projector(scripted_agent):
          agent = scripted_agent([tool_use("reserve", {"item": "EQ-1"}), final_answer("Booked.")], tools=[reserve])
          result = agent.run("book a projector")
          assert_tool_called(result, "reserve", item="EQ-1")

Helpers to assert with live in ``looptrace.testing``: ``assert_tool_called``, ``assert_no_anomalies``, ``tool_calls``.

Option:

* ``--looptrace-report=PATH``: the runs of the session's tests (those the fixtures above record) also go to a trace
  file beside PATH (``<name>.traces.jsonl``), and at the end of the session `looptrace report` writes its page to
  PATH: a CI artifact of what the agents under test did, where they looped and what it cost. Parallel sessions
  (pytest-xdist) write one file from every worker and one page.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from looptrace.testing import CapturedSpans

if TYPE_CHECKING:
    from looptrace.runtime.agent import Agent

REPORT_OPTION = "--looptrace-report"
_REPORT_SAID = pytest.StashKey[str]()  # the line the session's summary says of its report


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("looptrace").addoption(
        REPORT_OPTION, metavar="PATH", default=None, dest="looptrace_report",
        help="write `looptrace report`'s HTML page of the runs the session's tests recorded through looptrace's "
             "fixtures to PATH (their spans go to <PATH name>.traces.jsonl beside it)")


def _report_paths(config: pytest.Config) -> tuple[Path, Path] | None:
    """(the page, the trace file of the session's runs) when the session writes a report."""
    value = config.getoption("looptrace_report", None)
    if not value:
        return None
    page = (config.invocation_params.dir / value).resolve()
    return page, page.with_name(f"{page.stem}.traces.jsonl")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker: the controller reports for the session


def pytest_configure(config: pytest.Config) -> None:
    paths = _report_paths(config)
    if paths is not None and not _is_worker(config):  # a session's report holds that session's runs only
        from looptrace.instrumentation.tracefile import trace_files

        paths[0].parent.mkdir(parents=True, exist_ok=True)
        for old in trace_files(paths[1]):
            Path(old).unlink(missing_ok=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    paths = _report_paths(config)
    if paths is None or _is_worker(config):
        return
    page, trace_file = paths
    if not trace_file.exists():
        config.stash[_REPORT_SAID] = "looptrace report: no run was recorded through looptrace's fixtures; no page"
        return
    from looptrace.cli.trace_commands import main

    said = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        code = main(["report", "--trace-file", str(trace_file), "--output", str(page)])
    lines = said.getvalue().strip().splitlines()
    config.stash[_REPORT_SAID] = lines[-1] if code == 0 and lines else f"looptrace report failed: {said.getvalue()}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    said = config.stash.get(_REPORT_SAID, None)
    if said:
        terminalreporter.write_line(said)


@pytest.fixture
def looptrace_spans(request: pytest.FixtureRequest) -> Iterator[CapturedSpans]:
    """The finished spans of this test's runs, in memory (a tracer provider of the test's own, never global); with
    ``--looptrace-report``, in the session's trace file too."""
    spans = CapturedSpans()
    paths = _report_paths(request.config)
    if paths is None:
        yield spans
        return
    from looptrace.instrumentation.tracefile import TraceFileProcessor

    processor = TraceFileProcessor(paths[1])
    spans.provider.add_span_processor(processor)
    try:
        yield spans
    finally:
        processor.shutdown()


@pytest.fixture
def scripted_agent(looptrace_spans: CapturedSpans) -> Callable[..., Agent]:
    """``scripted_agent(responses, tools=[...], **agent_options)``: an Agent whose model replays ``responses``
    (Messages API response dicts, e.g. from ``tool_use`` and ``final_answer``) and whose spans go to
    ``looptrace_spans``. Any other ``Agent`` option may be passed; ``model`` defaults to a Claude model id."""
    from looptrace.runtime.agent import Agent
    from looptrace.runtime.models import ScriptedModel

    def build(responses: Iterable[dict[str, Any]], *, model: str = "claude-sonnet-5-5", **options: Any) -> Agent:
        options.setdefault("tracer_provider", looptrace_spans.provider)
        return Agent(model, client=ScriptedModel(list(responses)), **options)

    return build
