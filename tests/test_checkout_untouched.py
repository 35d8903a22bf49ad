"""The test suite leaves the checkout's .looptrace/ alone: a user's own runs there are theirs, and a `traces push`
after `pytest` must not talk about test runs (issue 43, item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import checkout_guard
import pytest

from looptrace import Agent, ScriptedModel
from looptrace.testing import final_answer


@pytest.fixture
def no_global_provider(monkeypatch):
    """A fresh process's OpenTelemetry: no provider an earlier test installed, which a run would join."""
    from opentelemetry import trace

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)


def test_a_run_with_telemetry_nobody_configured_writes_in_the_tests_own_directory(tmp_path, no_global_provider):
    assert Path.cwd() == tmp_path and not tmp_path.is_relative_to(checkout_guard.CHECKOUT)
    assert not any(name in os.environ for name in checkout_guard.VARIABLES)
    before = checkout_guard.snapshot()
    result = Agent("claude-sonnet-5-5", client=ScriptedModel([final_answer("hello")])).run("hi")
    assert checkout_guard.changes(before, checkout_guard.snapshot()) == []
    assert result.trace_id in (tmp_path / ".looptrace" / "traces.jsonl").read_text()


@pytest.mark.slow
def test_a_cli_process_a_test_starts_writes_in_the_tests_own_directory(tmp_path):
    before = checkout_guard.snapshot()
    completed = subprocess.run([sys.executable, "-m", "looptrace", "demo", "--json"], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert checkout_guard.changes(before, checkout_guard.snapshot()) == []
    trace_id = json.loads(completed.stdout)["trace_id"]
    assert trace_id in (tmp_path / ".looptrace" / "traces.jsonl").read_text()


def test_the_guard_names_each_file_created_changed_or_removed(tmp_path):
    directory = tmp_path / ".looptrace"
    directory.mkdir()
    (directory / "traces.jsonl").write_text("one\n")
    (directory / "old.jsonl").write_text("x")
    before = checkout_guard.snapshot(directory)
    (directory / "traces.jsonl").write_text("one\ntwo\n")
    (directory / "undelivered.jsonl").write_text("{}")
    (directory / "old.jsonl").unlink()
    assert checkout_guard.changes(before, checkout_guard.snapshot(directory)) == [
        "undelivered.jsonl created", "traces.jsonl changed", "old.jsonl removed"]
    assert checkout_guard.snapshot(tmp_path / "absent") == {}


def test_files_set_up_in_one_directory_stay_there_when_the_process_changes_directory(tmp_path, monkeypatch,
                                                                                     no_global_provider):
    """How test runs reached the checkout: a trace file (or undelivered list) set up under one working directory and
    written after a change of directory started a second file there. Resolved when set up, as logging's FileHandler
    resolves its file."""
    from looptrace import configure

    for name in checkout_guard.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    telemetry = configure(exporters="file", set_global=False)  # the default, relative trace file
    monkeypatch.chdir(second)
    try:
        agent = Agent("claude-sonnet-5-5", client=ScriptedModel([final_answer("one")]), telemetry=telemetry)
        result = agent.run("one")
    finally:
        telemetry.shutdown()
    assert result.trace_id in (first / ".looptrace" / "traces.jsonl").read_text()
    assert not (second / ".looptrace").exists()
    # What a run with nothing configured writes goes under the directory the run is in, as the default says.
    later = Agent("claude-sonnet-5-5", client=ScriptedModel([final_answer("two")])).run("two")
    assert later.trace_id in (second / ".looptrace" / "traces.jsonl").read_text()
