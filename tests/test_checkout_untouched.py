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


def test_a_run_with_telemetry_nobody_configured_writes_outside_the_checkout(monkeypatch):
    monkeypatch.chdir(checkout_guard.CHECKOUT)  # where `pytest -q` runs from
    before = checkout_guard.snapshot()
    result = Agent("claude-sonnet-5-5", client=ScriptedModel([final_answer("hello")])).run("hi")
    assert checkout_guard.changes(before, checkout_guard.snapshot()) == []
    written = Path(os.environ["LOOPTRACE_TRACE_FILE"])
    assert not written.is_relative_to(checkout_guard.CHECKOUT)
    assert result.trace_id in written.read_text()


@pytest.mark.slow
def test_a_cli_process_the_tests_start_writes_outside_the_checkout():
    before = checkout_guard.snapshot()
    completed = subprocess.run([sys.executable, "-m", "looptrace", "demo", "--json"], cwd=checkout_guard.CHECKOUT,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert checkout_guard.changes(before, checkout_guard.snapshot()) == []
    trace_id = json.loads(completed.stdout)["trace_id"]
    assert trace_id in Path(os.environ["LOOPTRACE_TRACE_FILE"]).read_text()


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
