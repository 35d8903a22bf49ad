"""`looptrace replay`: a stored run, rebuilt from the trace file an Agent wrote, runs again through the current loop.

Every recording here is made the way a user makes one: an Agent given nothing writes the trace file through the
Agent's own pipeline (LOOPTRACE_TRACE_FILE in tmp_path), its model a ScriptedModel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from looptrace.cli.app import main
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.replay import ContentNotRecorded, IncompleteRecording, RecordedModelError, rebuild_run, replay, runs_in
from looptrace.runtime import Agent, AnomalyDetected, ScriptedModel, tool
from looptrace.testing import final_answer, tool_use

VARIABLES = ("OTEL_", "LANGFUSE_", "LOOPTRACE_", "TRACEPARENT", "TRACESTATE")


@pytest.fixture(autouse=True)
def trace_file(monkeypatch, tmp_path) -> Path:
    """A fresh process's telemetry (no global provider, no variables from the machine), writing to tmp_path."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    for name in [n for n in os.environ if n.startswith(VARIABLES)]:
        monkeypatch.delenv(name)
    path = tmp_path / "traces.jsonl"
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(path))
    return path


@tool
def search(query: str) -> str:
    """Search the catalogue.

    Args:
        query: What to look for.
    """
    return "no results"


@tool
def reserve(item_id: str) -> str:
    """Reserve an item.

    Args:
        item_id: The item to reserve.
    """
    raise RuntimeError(f"{item_id} is locked")


def looping_script(repeats: int = 5) -> list[dict[str, Any]]:
    """A model that asks for the same search again and again, then gives up."""
    return [tool_use("search", {"query": "projector"}, call_id=f"toolu_{i}") for i in range(1, repeats + 1)] + [
        final_answer("I could not find a projector.")]


def record(script: list[dict[str, Any]], *, on_anomaly: str | None = None, tools=(search,)) -> tuple[Any, list]:
    """Run an Agent on the script, traced to the trace file; its result and the anomalies it reported, in order."""
    reported: list[AnomalyDetected] = []
    agent = Agent("claude-sonnet-4-5", tools=list(tools), system="You find equipment.", name="finder",
                  client=ScriptedModel(script), on_anomaly=on_anomaly,
                  on_event=lambda e: reported.append(e) if isinstance(e, AnomalyDetected) else None)
    return agent.run("Find a projector for Thursday"), reported


def recording(path: Path, trace_id: str):
    return rebuild_run(runs_in(read_spans(path))[trace_id])


def as_reported(anomalies) -> list[tuple]:
    return [(a.anomaly.turn, a.anomaly.type, a.anomaly.tool, a.anomaly.count, a.action) for a in anomalies]


def replayed_as(anomalies) -> list[tuple]:
    return [(a.turn, a.type, a.tool, a.count, a.action) for a in anomalies]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the same run again ---------------------------------------------------------------------------------------------


def test_a_looping_run_replays_with_the_same_anomalies_at_the_same_turns(trace_file):
    live, reported = record(looping_script())
    assert live.status.value == "stopped_by_detector" and live.turns == 4  # nudged at 3, stopped at 4

    replayed = replay(recording(trace_file, live.trace_id))

    assert replayed_as(replayed.anomalies) == as_reported(reported) == [
        (3, "repeated_call", "search", 3, "nudge"), (4, "repeated_call", "search", 4, "stop")]
    assert [a.message for a in replayed.anomalies] == [a.anomaly.message for a in reported]
    assert (replayed.result.status, replayed.result.turns) == (live.status, live.turns)
    assert not replayed.diff.changed and len(replayed.diff.same) == 2
    assert replayed.past_recording_turn is None and replayed.stop_turn == 3


def test_the_replayed_run_is_the_live_run_message_for_message(trace_file):
    script = [
        {"stop_reason": "tool_use", "content": [
            {"type": "text", "text": "Looking first."},
            {"type": "tool_use", "id": "toolu_s", "name": "search", "input": {"query": "projector"}},
            {"type": "tool_use", "id": "toolu_r", "name": "reserve", "input": {"item_id": "EQ-1"}}],
         "usage": {"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": 7,
                   "cache_creation_input_tokens": 3}},
        {"stop_reason": "tool_use", "content": [
            {"type": "tool_use", "id": "toolu_x", "name": "missing_tool", "input": {}},
            {"type": "tool_use", "id": "toolu_y", "name": "search", "input": "not an object"}],
         "usage": {"input_tokens": 80, "output_tokens": 12}},
        final_answer("EQ-1 is locked; nothing reserved."),
    ]
    live, _ = record(script, tools=(search, reserve))

    recorded = recording(trace_file, live.trace_id)
    again = replay(recorded)

    assert recorded.task == "Find a projector for Thursday" and recorded.system == "You find equipment."
    assert [d["name"] for d in recorded.tool_definitions] == ["search", "reserve"]
    assert [(c.tool, c.result, c.is_error) for c in recorded.calls][:2] == [
        ("search", "no results", False), ("reserve", "RuntimeError: EQ-1 is locked", True)]
    # Every message, the tool errors among them, as the live run had them; tokens and cost too.
    assert again.result.messages == live.messages
    assert again.result.usage == live.usage and again.result.cost_usd == live.cost_usd
    assert (again.result.status, again.result.final_text) == (live.status, live.final_text)


def test_with_on_anomaly_stop_the_replay_stops_where_the_live_run_would_have(trace_file, capsys):
    recorded_live, _ = record(looping_script())  # the default policy: nudged, then stopped
    stopping_live, stop_reported = record(looping_script(), on_anomaly="stop")
    assert stopping_live.status.value == "stopped_by_detector" and stopping_live.turns == 3

    stopped = replay(recording(trace_file, recorded_live.trace_id), on_anomaly="stop")

    assert (stopped.result.status, stopped.result.turns) == (stopping_live.status, stopping_live.turns)
    assert replayed_as(stopped.anomalies) == as_reported(stop_reported) == [(3, "repeated_call", "search", 3, "stop")]
    assert [(a.turn, a.action) for a in stopped.diff.gone] == [(4, "stop")]  # the live run went one turn further
    assert replay(recording(trace_file, recorded_live.trace_id)).stop_turn == stopping_live.turns

    code, out, _ = cli(capsys, "replay", "--file", str(trace_file), "--trace-id", recorded_live.trace_id[:12],
                       "--on-anomaly", "stop")
    assert code == 30  # stopped_by_detector, as `looptrace run` exits
    assert "replayed: stopped_by_detector after 3 turns" in out
    assert "--on-anomaly stop would have stopped it at turn 3" in out


def test_the_latest_run_is_replayed_by_default_and_json_says_it_all(trace_file, capsys):
    record(looping_script())
    latest, _ = record(looping_script(), on_anomaly="warn")

    code, out, _ = cli(capsys, "replay", "--file", str(trace_file), "--json")

    shown = json.loads(out)
    assert code == 30 and shown["trace_id"] == latest.trace_id
    assert shown["recorded"]["status"] == "done" and shown["replayed"]["status"] == "stopped_by_detector"
    assert [(a["turn"], a["action"]) for a in shown["recorded"]["anomalies"]] == [(3, "warn")]
    assert [(a["turn"], a["action"]) for a in shown["replayed"]["anomalies"]] == [(3, "nudge"), (4, "stop")]
    assert shown["stop_turn"] == 3 and shown["tools"] == "recorded"
    assert [a["turn"] for a in shown["diff"]["new"]] == [4]


def test_a_run_the_live_policy_only_warned_about_ends_done_again_under_warn(trace_file, capsys):
    live, _ = record(looping_script(), on_anomaly="warn")
    code, out, _ = cli(capsys, "replay", "--file", str(trace_file), "--on-anomaly", "warn")
    assert code == 0 and f"replay of {live.trace_id}" in out
    assert "turn   3  repeated_call search x3  warn   = as recorded" in out
    assert "anomalies: 1 recorded, 1 replayed: the same as recorded" in out


# --- the tools, now ---------------------------------------------------------------------------------------------------


def test_your_tools_answer_the_calls_and_a_fixed_tool_runs_past_the_recording(trace_file, tmp_path, capsys):
    live, _ = record(looping_script())
    tools = tmp_path / "tools.py"
    tools.write_text(textwrap.dedent('''
        import itertools

        from looptrace import tool

        pages = itertools.count(1)


        @tool
        def search(query: str) -> str:
            """Search the catalogue.

            Args:
                query: What to look for.
            """
            return f"page {next(pages)} of the results for {query}"
    '''))

    code, out, _ = cli(capsys, "replay", "--file", str(trace_file), "--tools", str(tools))

    # The fixed tool makes progress, nothing stops the run at turn 4, and turn 5 was never recorded.
    assert code == 1
    assert f"tools: yours ({tools})" in out
    assert "- recorded, not found now" in out and "anomalies: 2 recorded, 0 replayed" in out
    assert "the replay went past the recording at turn 5" in out
    assert replay(recording(trace_file, live.trace_id), tools=[search]).diff.changed is False


def test_a_replay_that_goes_past_the_recording_says_so_once_without_a_failure_warning(trace_file, capsys):
    record(looping_script())
    capsys.readouterr()  # the recorded run's own warnings
    code, out, err = cli(capsys, "replay", "--file", str(trace_file), "--on-anomaly", "warn")
    assert code == 1
    assert "the replay went past the recording at turn 5" in out  # the report explains the outcome...
    assert "model_call_failed" not in err and "PastTheRecording" not in err, err  # ...so no warning says it again


def test_an_empty_trace_id_is_refused_not_taken_for_the_latest_run(trace_file, capsys):
    record(looping_script())
    capsys.readouterr()  # the recorded run's own warnings
    code, out, err = cli(capsys, "replay", "--file", str(trace_file), "--trace-id", "")
    assert (code, out) == (2, "")
    assert err.startswith("looptrace: error: --trace-id is empty")


def test_a_tools_file_that_does_not_import_is_one_line_and_exit_2(trace_file, tmp_path, capsys):
    record(looping_script())
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no')\n")
    code, _, err = cli(capsys, "replay", "--file", str(trace_file), "--tools", str(broken))
    assert code == 2 and "cannot import tools file" in err


# --- runs that cannot be replayed ----------------------------------------------------------------------------------


def test_a_run_recorded_without_content_says_so_and_exits_2(trace_file, monkeypatch, capsys):
    monkeypatch.setenv("LOOPTRACE_CAPTURE_CONTENT", "false")
    live, _ = record(looping_script())

    with pytest.raises(ContentNotRecorded, match="recorded without content"):
        recording(trace_file, live.trace_id)
    code, out, err = cli(capsys, "replay", "--file", str(trace_file))
    assert code == 2 and out == ""
    assert f"cannot replay: run {live.trace_id} (agent 'finder') was recorded without content" in err


def test_a_response_cut_at_the_size_cap_names_its_span(trace_file, monkeypatch, capsys):
    monkeypatch.setenv("LOOPTRACE_MAX_ATTRIBUTE_CHARS", "80")
    long_text = "Searching the whole catalogue, shelf by shelf, for a projector. " * 3
    live, _ = record([tool_use("search", {"query": "projector"}, text=long_text), final_answer("None.")])
    chat = next(s for s in read_spans(trace_file) if s.name.startswith("chat"))

    with pytest.raises(IncompleteRecording) as failed:
        recording(trace_file, live.trace_id)
    assert (failed.value.span_id, failed.value.span_name) == (chat.span_id, chat.name)
    code, _, err = cli(capsys, "replay", "--file", str(trace_file))
    assert code == 2
    assert f"span {chat.span_id} (chat claude-sonnet-4-5): gen_ai.output.messages was cut at the attribute size cap" in err


def test_a_turn_whose_model_call_is_missing_from_the_file_names_the_turn(trace_file, capsys):
    live, _ = record(looping_script())
    lines = trace_file.read_text().splitlines(keepends=True)
    chats = [i for i, line in enumerate(lines) if '"name":"chat claude' in line]
    trace_file.write_text("".join(line for i, line in enumerate(lines) if i != chats[1]))
    turn = next(s for s in read_spans(trace_file) if s.attributes.get("looptrace.turn.index") == 2)

    with pytest.raises(IncompleteRecording, match="turn 2 has no chat span") as failed:
        recording(trace_file, live.trace_id)
    assert failed.value.span_id == turn.span_id


def test_content_on_events_only_still_replays(trace_file, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "EVENT_ONLY")
    live, reported = record(looping_script(), on_anomaly="warn")
    assert not any("gen_ai.tool.call.result" in s.attributes for s in read_spans(trace_file))

    replayed = replay(recording(trace_file, live.trace_id), on_anomaly="warn")

    assert replayed.result.messages == live.messages
    assert replayed_as(replayed.anomalies) == as_reported(reported)


def test_a_model_call_that_failed_fails_again_at_its_turn(trace_file):
    live, _ = record([tool_use("search", {"query": "projector"}), ConnectionError("the API is down")])
    assert live.status.value == "error"

    recorded = recording(trace_file, live.trace_id)
    again = replay(recorded)

    assert isinstance(recorded.responses[-1], RecordedModelError) and "the API is down" in recorded.responses[-1].error
    assert (again.result.status, again.result.turns) == (live.status, live.turns)
    assert again.past_recording_turn is None


def test_no_such_trace_is_exit_3_and_a_file_of_no_spans_exit_2(trace_file, tmp_path, capsys):
    record(looping_script())
    code, _, err = cli(capsys, "replay", "--file", str(trace_file), "--trace-id", "ffffffff")
    assert code == 3 and "no trace 'ffffffff'" in err
    not_traces = tmp_path / "notes.txt"
    not_traces.write_text("not a trace file\n")
    code, _, err = cli(capsys, "replay", "--file", str(not_traces), "--all")
    assert code == 2 and "is it a trace file?" in err


def test_a_detector_setting_it_refuses_is_a_usage_error(trace_file, capsys):
    record(looping_script())
    code, _, err = cli(capsys, "replay", "--file", str(trace_file), "--repeat-threshold", "0")
    assert code == 2 and "repeat_threshold must be at least 1" in err


# --- a what-if over the whole file ----------------------------------------------------------------------------------


def test_all_runs_before_and_after_a_threshold_change(trace_file, monkeypatch, capsys):
    stopped, _ = record(looping_script())
    warned, _ = record(looping_script(), on_anomaly="warn")
    clean, _ = record([tool_use("search", {"query": "projector"}), final_answer("None in stock.")])
    monkeypatch.setenv("LOOPTRACE_CAPTURE_CONTENT", "false")
    digests_only, _ = record(looping_script())

    code, out, _ = cli(capsys, "replay", "--file", str(trace_file), "--all", "--repeat-threshold", "4")

    assert code == 0
    rows = {line[:12]: line for line in out.splitlines()[1:-1]}
    assert "repeated_call search @3  repeated_call search @4" in rows[stopped.trace_id[:12]]
    # The live run stopped at turn 4; at 4 this detector would nudge there instead, and turn 5 was never recorded.
    assert rows[stopped.trace_id[:12]].endswith("stopped_by_detector -> past the recording at turn 5")
    assert rows[warned.trace_id[:12]].endswith("done -> stopped_by_detector")
    assert rows[clean.trace_id[:12]].split()[2:] == ["-", "-", "done", "->", "done"]
    assert "judged from its spans: recorded without content" in rows[digests_only.trace_id[:12]]
    assert out.splitlines()[-1] == ("4 runs (1 judged from its spans, not replayed), detector repeat_threshold=4: "
                                    "3 recorded, 3 found now; 0 unchanged, 3 moved, 0 gone, 0 new")

    code, out, _ = cli(capsys, "replay", "--file", str(trace_file), "--all", "--json")
    by_trace = {row["trace_id"]: row for row in map(json.loads, out.splitlines())}
    assert by_trace[digests_only.trace_id]["how"] == "spans"
    assert by_trace[stopped.trace_id]["changes"] == {"unchanged": 1, "moved": 0, "gone": 0, "new": 0}


# --- a regression test of the run -----------------------------------------------------------------------------------


def run_pytest(test_file: Path) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(VARIABLES)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                          cwd=test_file.parent, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_regression_test_fails_on_the_looping_run_and_passes_on_a_fixed_one(trace_file, tmp_path, capsys):
    looping, _ = record(looping_script())
    fixed, _ = record([tool_use("search", {"query": "projector"}), final_answer("None in stock.")])
    red, green = tmp_path / "test_looping_run.py", tmp_path / "test_fixed_run.py"

    assert cli(capsys, "replay", "--file", str(trace_file), "--trace-id", looping.trace_id, "--pytest", str(red))[0] == 30
    assert cli(capsys, "replay", "--file", str(trace_file), "--trace-id", fixed.trace_id, "--pytest", str(green))[0] == 0

    failed = run_pytest(red)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "the run still loops: repeated_call from turn 3" in failed.stdout
    passed = run_pytest(green)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "1 passed" in passed.stdout


@pytest.mark.slow
def test_the_regression_test_passes_once_the_tool_is_fixed(trace_file, tmp_path, capsys):
    looping, _ = record(looping_script())
    tools = tmp_path / "tools.py"
    tool_source = textwrap.dedent('''
        from looptrace import tool


        @tool
        def search(query: str) -> str:
            """Search the catalogue.

            Args:
                query: What to look for.
            """
            return {result}
    ''')
    tools.write_text(tool_source.format(result='"no results"'))  # the tool as it was: it never makes progress
    test_file = tmp_path / "test_projector_search.py"
    cli(capsys, "replay", "--file", str(trace_file), "--tools", str(tools), "--pytest", str(test_file))
    assert "TOOLS_FILE = Path(__file__).parent / 'tools.py'" in test_file.read_text()

    before = run_pytest(test_file)
    assert before.returncode == 1 and "the run still loops" in before.stdout, before.stdout + before.stderr

    # The fix: the tool tells the model what it did search, so repeating the call is progress the model can see.
    tools.write_text("import itertools\n" + tool_source.format(
        result='f"no results for {query!r} (search number {next(COUNTER)})"') + "\nCOUNTER = itertools.count(1)\n")
    after = run_pytest(test_file)
    assert after.returncode == 0, after.stdout + after.stderr


# --- the GenAI shape read back ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [
    {"type": "text", "text": "Looking."},
    {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"query": "projector"}},
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no results"},
    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "RuntimeError: locked", "is_error": True},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "projectors"}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [{"type": "web_search_result"}]},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    {"type": "document", "source": {"type": "url", "url": "https://example.com/manual.pdf"}},
    {"type": "redacted_thinking", "data": "opaque"},
])
def test_a_messages_api_block_survives_the_genai_shape(block):
    from looptrace.instrumentation.offline.anthropic_messages import anthropic_block
    from looptrace.instrumentation.recording.content import genai_part

    assert anthropic_block(genai_part(block)) == block


def test_what_the_genai_shape_never_kept_is_not_made_up():
    from looptrace.instrumentation.offline.anthropic_messages import anthropic_block
    from looptrace.instrumentation.recording.content import genai_part

    thinking = {"type": "thinking", "thinking": "Check stock first.", "signature": "sig-abc"}
    assert anthropic_block(genai_part(thinking)) == {**thinking, "signature": ""}
    secret = {"type": "tool_use", "id": "t", "name": "login", "input": {"user": "ana", "password": "hunter2"}}
    assert anthropic_block(genai_part(secret))["input"] == {"user": "ana", "password": "[REDACTED]"}
