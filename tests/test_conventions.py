"""Small conventions: a fast start (`import looptrace` and `looptrace --help` load none of the heavy dependencies: the
mechanism; the CPU figures are in `python -m benchmarks --only 6`), --version, NO_COLOR, docstrings in any style."""

from __future__ import annotations

import json
import subprocess
import sys

from looptrace.cli import demo
from looptrace.cli.demo_command import DEMO_STORIES

HEAVY = ("opentelemetry.sdk", "opentelemetry.exporter", "requests", "anthropic", "pydantic", "grpc", "structlog")


def modules_loaded_by(code: str) -> list[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return sorted({m.split(".")[0] if not m.startswith("opentelemetry") else ".".join(m.split(".")[:2])
                   for m in modules if m.startswith(HEAVY)})


def test_import_looptrace_and_the_help_load_nothing_heavy():
    assert heavy(modules_loaded_by("import looptrace")) == []
    help_code = ("import contextlib, io\nfrom looptrace.cli.app import main\n"
                 "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                 "    main(['--help'])")
    assert heavy(modules_loaded_by(help_code)) == []


def test_an_agent_import_loads_the_api_only_when_it_runs():
    assert [m for m in heavy(modules_loaded_by("from looptrace import Agent")) if m.startswith("opentelemetry")] == []


def test_the_clis_story_names_are_the_demos():
    assert tuple(sorted(demo.STORIES)) == DEMO_STORIES


def test_version(capsys):
    import pytest

    from looptrace import __version__
    from looptrace.cli.app import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"looptrace {__version__}"


class _Terminal:
    def isatty(self) -> bool:
        return True


def test_no_color_turns_colour_off_at_a_terminal(monkeypatch):
    from looptrace.cli.logging_setup import use_color

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(_Terminal())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(_Terminal())


def test_numpy_google_and_sphinx_docstrings_keep_their_parameter_descriptions():
    from looptrace import tool

    @tool
    def numpy_style(city: str, days: int = 1) -> str:
        """Forecast for a city.

        Parameters
        ----------
        city : str
            The city's name, in English.
        days : int
            How many days ahead.
        """
        return city

    @tool
    def sphinx_style(city: str) -> str:
        """Forecast for a city.

        :param city: The city's name,
            in English.
        """
        return city

    numpy = numpy_style.definition()
    assert numpy["description"] == "Forecast for a city."
    assert numpy["input_schema"]["properties"]["city"]["description"] == "The city's name, in English."
    assert numpy["input_schema"]["properties"]["days"]["description"] == "How many days ahead."
    sphinx = sphinx_style.definition()["input_schema"]["properties"]["city"]
    assert sphinx["description"] == "The city's name, in English."


def _broken_observer_run():
    from looptrace import Agent, ScriptedModel

    def broken(event):
        raise RuntimeError("observer bug")

    Agent("claude-sonnet-5-5", telemetry=False, on_event=broken,
          client=ScriptedModel([{"stop_reason": "end_turn", "content": "ok"}])).run("hi")


def test_warnings_are_records_of_the_looptrace_logger_an_application_can_route_or_silence(caplog, capsys):
    import logging

    with caplog.at_level(logging.WARNING, logger="looptrace"):
        _broken_observer_run()
    records = [r for r in caplog.records if r.name == "looptrace"]
    assert records and records[0].looptrace["event"] == "observer_failed"
    assert "observer bug" in records[0].getMessage()
    assert capsys.readouterr().out == ""  # never on standard output, where a program's results go

    caplog.clear()
    logger = logging.getLogger("looptrace")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        _broken_observer_run()
    finally:
        logger.setLevel(previous)
    assert [r for r in caplog.records if r.name == "looptrace"] == []
