"""`looptrace detect` over other producers' traces.

The slow tests run a scripted agent (tests/foreign_agents.py) under each producer's REAL instrumentation package
against the fake Messages API, export the spans to an OTLP/JSON file, and run `looptrace detect` on it. The fast ones
pin down the reader's rules on spans made with the OpenTelemetry SDK.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from looptrace.cli.app import main
from looptrace.instrumentation.offline.trace_detect import DETECTION_KEYS
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.tracefile import OTLPJsonFileExporter

AGENTS = Path(__file__).parent / "foreign_agents.py"
PRODUCERS = ["semconv", "openllmetry", "openinference", "pydantic-ai"]
EXPECTED = {"repeat_failing": {"repeated_call"}, "ignored_error": {"ignored_error"}, "clean": set()}


def produce(tmp_path: Path, producer: str, scenario: str, *extra: str) -> Path:
    """Run the scripted agent under the producer's instrumentation; the OTLP/JSON file it wrote."""
    path = tmp_path / f"{producer}-{scenario}.jsonl"
    completed = subprocess.run([sys.executable, str(AGENTS), "--producer", producer, "--scenario", scenario,
                                "--file", str(path), *extra], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return path


def detect(capsys, path: Path) -> tuple[int, list[dict]]:
    code = main(["detect", "--json", "--all", str(path)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return code, lines


@pytest.mark.slow
@pytest.mark.parametrize("producer", PRODUCERS)
@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_detect_flags_loops_and_ignored_errors_in_real_producers_traces(tmp_path, capsys, producer, scenario):
    path = produce(tmp_path, producer, scenario)
    code, verdicts = detect(capsys, path)
    assert len(verdicts) == 1, verdicts  # one run, whatever the producer's span layout
    found = {a["type"] for a in verdicts[0]["anomalies"]}
    assert found == EXPECTED[scenario]
    assert code == (1 if EXPECTED[scenario] else 0)
    assert verdicts[0]["tool_calls"] == {"repeat_failing": 4, "ignored_error": 3, "clean": 1}[scenario]
    assert verdicts[0]["rules_not_run"] == {}  # each of these producers records what every rule needs


@pytest.mark.slow
def test_tool_calls_read_from_messages_alone_still_show_a_loop_but_say_error_rules_cannot_run(tmp_path, capsys):
    # OpenTelemetry's GenAI utilities with chat spans only (as OpenLLMetry >= 0.56 writes them): tool results are
    # `tool_call_response` parts, which carry no error flag.
    code, verdicts = detect(capsys, produce(tmp_path, "semconv-chat", "repeat_failing"))
    assert code == 1 and next(a["type"] for a in verdicts[0]["anomalies"]) == "repeated_call"
    assert verdicts[0]["tool_calls"] == 4
    code, verdicts = detect(capsys, produce(tmp_path, "semconv-chat", "ignored_error"))
    assert code == 0 and verdicts[0]["anomalies"] == []  # not guessed from the word "Error" in a result
    assert "no error flag" in verdicts[0]["rules_not_run"]["ignored_error"]
    assert main(["detect", "--all", str(tmp_path / "semconv-chat-ignored_error.jsonl")]) == 0
    assert "not checked: ignored_error: tool results were read from messages" in capsys.readouterr().out


@pytest.mark.slow
def test_the_text_report_names_the_foreign_run(tmp_path, capsys):
    path = produce(tmp_path, "openinference", "repeat_failing")
    assert main(["detect", str(path)]) == 1
    out = capsys.readouterr().out
    # one line per streak, with its latest count: four failing calls, one repeated_call x4 (issue 9)
    assert "support-agent" in out and "repeated_call get_order x4" in out and out.count("repeated_call") == 1


# --- the reader's rules, on spans made with the SDK -----------------------------------------------------------------

@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter(path)))
    yield provider.get_tracer("test"), path
    provider.shutdown()


def _verdicts(capsys, path) -> list[dict]:
    main(["detect", "--json", "--all", str(path)])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_tool_spans_without_recorded_arguments_do_not_count_as_a_loop(trace_file, capsys):
    tracer, path = trace_file
    with tracer.start_as_current_span("invoke_agent a", attributes={sc.GEN_AI_OPERATION_NAME: "invoke_agent"}):
        for _ in range(4):
            with tracer.start_as_current_span("chat", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
                pass
            with tracer.start_as_current_span("execute_tool lookup", attributes={
                    sc.GEN_AI_OPERATION_NAME: "execute_tool", sc.GEN_AI_TOOL_NAME: "lookup"}) as span:
                span.set_status(Status(StatusCode.ERROR))
    [verdict] = _verdicts(capsys, path)
    assert verdict["anomalies"] == []  # four calls with unknown arguments may be four different calls
    assert "arguments were not recorded" in verdict["rules_not_run"]["repeated_call"]


def test_lone_model_calls_of_one_session_form_one_run(trace_file, capsys):
    # OpenInference LLM spans with no agent span around them: each is its own trace, the session ties them together.
    tracer, path = trace_file
    for n in range(1, 5):  # three tool calls, then the answer: each call's result is in the next call's input
        attributes = {"openinference.span.kind": "LLM", "session.id": "s-1", "llm.finish_reason": "tool_use"}
        if n < 4:
            attributes.update({
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.tool_calls.0.tool_call.id": f"call-{n}",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "search",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"q": "x"}',
            })
        else:
            attributes.update({"llm.finish_reason": "end_turn", "llm.output_messages.0.message.content": "Nothing."})
        for earlier in range(1, n):
            attributes[f"llm.input_messages.{earlier}.message.role"] = "tool"
            attributes[f"llm.input_messages.{earlier}.message.tool_call_id"] = f"call-{earlier}"
            attributes[f"llm.input_messages.{earlier}.message.content"] = "no results"
        with tracer.start_as_current_span("messages.create", attributes=attributes):
            pass
    [verdict] = _verdicts(capsys, path)
    assert verdict["trace_id"] == "session:s-1"
    assert verdict["tool_calls"] == 3
    assert [a["type"] for a in verdict["anomalies"]] == ["repeated_call"]


def test_detection_decodes_every_producers_indexed_attributes():
    assert "gen_ai.prompt.3.content" in DETECTION_KEYS
    assert "llm.output_messages.0.message.tool_calls.0.tool_call.id" in DETECTION_KEYS
    assert sc.GEN_AI_TOOL_NAME in DETECTION_KEYS
    assert "http.url" not in DETECTION_KEYS
