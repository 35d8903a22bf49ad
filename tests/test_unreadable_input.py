"""Every command that reads a trace file gives the same answer for the same unreadable input: the same exit code and
the same words (`detect`, `traces list`, `traces show`, `replay --file`), and no traceback."""

from __future__ import annotations

import json

import pytest

from looptrace.cli import main

SPAN = {"traceId": "a" * 32, "spanId": "b" * 16, "name": "invoke_agent x", "startTimeUnixNano": "1",
        "endTimeUnixNano": "2"}
READERS = [["detect", "{}"], ["traces", "list", "--file", "{}"], ["traces", "show", "--file", "{}"],
           ["replay", "--file", "{}"]]


def line(span: dict) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}]}]}) + "\n"


def without(key: str) -> dict:
    return {k: v for k, v in SPAN.items() if k != key}


UNREADABLE = {
    "span lacking spanId": (line(without("spanId")).encode(), "a span's spanId is missing or not a string"),
    "span lacking traceId": (line(without("traceId")).encode(), "a span's traceId is missing or not a string"),
    "integer attribute key": (line({**SPAN, "attributes": [{"key": 1, "value": {"stringValue": "v"}}]}).encode(),
                              "an attribute key is not a string"),
    "torn line": (b'{"resourceSpans": [\n', "truncated/incomplete JSON"),
    "torn line without newline": (b'{"resourceSpans": [', "truncated/incomplete JSON"),
    "UTF-16 byte order mark": (b"\xff\xfe" + line(SPAN).encode(), "not UTF-8 text"),
    "UTF-16 file": (line(SPAN).encode("utf-16"), "not UTF-8 text"),
    "a log": (b"INFO starting\nWARN low disk\nINFO done\n", "not JSON"),
    "binary": (bytes(range(256)) * 8, "not UTF-8 text"),
    "JSON, not trace data": (b'{"hello": "world"}\n[1, 2]\n', "not OTLP/JSON trace data"),
}


def answers(capsys, path) -> list[tuple[int, str, str]]:
    seen = []
    for argv in READERS:
        code = main([a.format(path) for a in argv])
        out, err = capsys.readouterr()
        seen.append((code, out, err))
    return seen


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_every_reading_command_gives_the_same_code_and_words(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    content, words = UNREADABLE[case]
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    seen = answers(capsys, path)
    for (code, out, err), argv in zip(seen, READERS, strict=True):
        assert code == 2, (argv, code, err)
        assert out == "", (argv, out)
        assert "Traceback" not in err
        assert err.count("\n") == 1, (argv, err)  # one line, not one "skipped" line per bad line
        assert words in err, (argv, err)
    assert len({err for _, _, err in seen}) == 1, seen  # the very same words from each
    assert "Expecting value" not in seen[0][2] or case == "a log"


def test_a_bad_line_among_good_ones_is_named_in_the_same_words_by_each(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = {**SPAN, "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}}]}
    path = tmp_path / "mixed.jsonl"
    path.write_text(line(good) + line({**SPAN, "traceId": "c" * 32, "attributes": [{"key": 7, "value": {}}]}))
    for argv in READERS[:3]:
        main([a.format(path) for a in argv])
        err = capsys.readouterr().err
        assert f"{path}:2: skipped: not OTLP/JSON trace data (an attribute key is not a string)" in err, (argv, err)


def test_a_file_of_several_runs_none_of_which_could_be_read_is_exit_2_for_every_run_reader(tmp_path, capsys,
                                                                                          monkeypatch):
    """Several runs with a session, rotated over three files, read with a line limit only their small turn spans
    fit: detect and traces list once said "0 anomalies" / listed nothing, with exit 0, about runs they never read."""
    from looptrace import Agent, ScriptedModel, tool
    from looptrace.instrumentation.export.setup import configure

    @tool
    def search(query: str) -> str:
        """Search the catalogue."""
        return "no results " * 40

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPTRACE_MAX_LINE_BYTES", raising=False)
    path = tmp_path / "traces.jsonl"
    telemetry = configure(exporters="file", trace_file=path, set_global=False)
    for run in range(3):
        calls = [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": f"t{n}", "name": "search",
                                                          "input": {"query": "red shoes"}}]} for n in range(4)]
        Agent("claude-sonnet-4-5", tools=[search], client=ScriptedModel([*calls, {"content": "none"}]),
              telemetry=telemetry, on_anomaly="warn").run("find red shoes", session_id=f"session-{run}")
    telemetry.shutdown()
    lines = path.read_bytes().splitlines(keepends=True)
    limit = min(len(line) for line in lines if b'"name":"turn"' not in line) - 1  # every other span is over it
    assert any(len(line) <= limit for line in lines)  # and some turn spans are read
    third = len(lines) // 3  # as rotation leaves them: traces.jsonl.2, .1, then traces.jsonl
    for name, part in (("traces.jsonl.2", lines[:third]), ("traces.jsonl.1", lines[third:2 * third]),
                       ("traces.jsonl", lines[2 * third:])):
        (tmp_path / name).write_bytes(b"".join(part))
    assert main(["detect", str(path)]) == 1  # with the default limit: the loops are there
    capsys.readouterr()
    monkeypatch.setenv("LOOPTRACE_MAX_LINE_BYTES", str(limit))
    for argv in (["detect", str(path)], ["detect", str(path), "--json"], ["traces", "list", "--file", str(path)]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert (code, out) == (2, ""), (argv, code, out, err)
        assert "no run could be read" in err.splitlines()[-1] and "LOOPTRACE_MAX_LINE_BYTES" in err, (argv, err)
