"""`looptrace detect` reads a trace file its own way, for speed (issue 14, goal 3): what it reads must be what the
general reader reads, whichever JSON parser is installed, and it must start without the agent runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from looptrace.cli import detect_command, trace_reading
from looptrace.cli.app import main
from looptrace.instrumentation.offline.trace_detect import DETECTION_KEYS
from looptrace.instrumentation.settings import DEFAULT_MAX_LINE_BYTES


@pytest.fixture
def demo_file(tmp_path, capsys) -> Path:
    path = tmp_path / "traces.jsonl"
    for story in ("equipment", "runaway", "ignored-error"):
        main(["demo", story, "--json", "--trace-file", str(path)])
    capsys.readouterr()
    return path


def detect(capsys, path: Path) -> tuple[int, str, str]:
    code = main(["detect", "--all", "--json", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def test_detect_decodes_each_span_as_the_general_reader_does(demo_file):
    with trace_reading.LineReporter(demo_file, DEFAULT_MAX_LINE_BYTES) as report:
        fast = list(detect_command.detection_spans(demo_file, report))
    with trace_reading.LineReporter(demo_file, DEFAULT_MAX_LINE_BYTES) as report:
        general = [s for s in trace_reading.spans_of(demo_file, report, DETECTION_KEYS)
                   if not s.name.startswith("turn")]  # the lines detection does not parse at all
    assert len(fast) == len(general) > 10
    for ours, theirs in zip(fast, general, strict=True):
        assert (ours.trace_id, ours.span_id, ours.parent_span_id, ours.name, ours.start_ns, ours.end_ns,
                ours.status_code, ours.attributes) == (
                theirs.trace_id, theirs.span_id, theirs.parent_span_id, theirs.name, theirs.start_ns, theirs.end_ns,
                theirs.status_code, theirs.attributes)


def test_detect_finds_the_same_with_json_alone(demo_file, capsys, monkeypatch):
    found = detect(capsys, demo_file)
    monkeypatch.setattr(detect_command, "fast_json_loads", lambda: json.loads)
    assert detect(capsys, demo_file) == found
    assert found[0] == 1 and '"repeated_call"' in found[1]


def test_a_line_the_fast_parser_refuses_is_read_as_json_reads_it(demo_file, capsys):
    # json reads a lone surrogate escape and a bare NaN; msgspec refuses both. Detection must not lose the line.
    lines = demo_file.read_text(encoding="utf-8").splitlines(keepends=True)
    changed = []
    for line in lines:
        if '"gen_ai.operation.name","value":{"stringValue":"execute_tool"}' in line:
            line = line.replace('"kind":', '"x.note":"\\ud800","x.ratio":NaN,"kind":', 1)
        changed.append(line)
    altered = demo_file.with_name("altered.jsonl")
    altered.write_text("".join(changed), encoding="utf-8")
    assert any("NaN" in line for line in changed)
    code, out, err = detect(capsys, altered)
    assert (code, out) == detect(capsys, demo_file)[:2]
    assert "skipped" not in err


@pytest.mark.slow
def test_detect_starts_without_the_agent_runtime_the_sdk_or_the_full_cli(demo_file):
    probe = ("import json, sys\nfrom looptrace.cli.entry import main\nmain(['detect', sys.argv[1]])\n"
             "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(demo_file)], capture_output=True, text=True, timeout=60)
    modules = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "looptrace.instrumentation.offline.trace_detect" in modules  # it did run detection
    # (The settings module is loaded: the command reads them once, for its default file and the longest line read.)
    for heavy in ("looptrace.cli.app", "looptrace.runtime", "looptrace.runtime.agent", "opentelemetry.sdk", "anthropic",
                  "structlog", "logging"):
        assert heavy not in modules, heavy
