"""Telemetry never raises into a run, whatever the values a model or a backend hands it: the run ends as it would
with telemetry off, a part of a span that cannot be recorded is counted and said, and the run's other spans are kept.
"""

from __future__ import annotations

import json
import os

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from looptrace import Agent, ScriptedModel, tool
from looptrace.instrumentation.tracefile.read import read_spans
from looptrace.testing import capture_logs


@tool
def echo(n: int) -> str:
    """Echo a number."""
    return "ok"


def _script(value) -> list[dict]:
    return [{"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "echo",
                                                     "input": {"n": value}}]},
            {"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}]


HUGE = 10 ** 5000  # more digits than Python writes out (sys.get_int_max_str_digits)


@pytest.fixture
def trace_file(tmp_path, monkeypatch):
    """An Agent's own pipeline, as in a new process with no telemetry variables, writing to a file of this test's own."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    for name in [n for n in os.environ if n.startswith(("OTEL_", "LANGFUSE_", "LOOPTRACE_", "TRACEPARENT"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(tmp_path / "traces.jsonl"))
    return tmp_path / "traces.jsonl"


def test_a_five_thousand_digit_integer_leaves_the_run_as_it_is_without_telemetry(trace_file):
    untraced = Agent("claude-sonnet-5-5", tools=[echo], client=ScriptedModel(_script(HUGE)), telemetry=False).run("go")
    traced = Agent("claude-sonnet-5-5", tools=[echo], client=ScriptedModel(_script(HUGE))).run("go")
    assert (traced.status, traced.turns, traced.error) == (untraced.status, untraced.turns, untraced.error)
    assert traced.status.value == "done"
    names = sorted(s.name.split(" ")[0] for s in read_spans(trace_file))
    assert names == ["chat", "chat", "execute_tool", "invoke_agent", "turn", "turn"]  # every span of the run


class _Exploding(SpanProcessor):
    """A span processor with a bug: it raises as a tool's span ends (the SDK hands the exception to the caller)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_end(self, span) -> None:
        if span.name == "execute_tool echo":
            raise RuntimeError("processor bug")
        self.names.append(span.name.split(" ")[0])


def test_a_span_that_cannot_be_recorded_is_said_once_and_the_rest_of_the_run_is_kept():
    exporter = _Exploding()
    provider = TracerProvider()
    provider.add_span_processor(exporter)
    with capture_logs() as logs:
        result = Agent("claude-sonnet-5-5", tools=[echo], client=ScriptedModel(_script(7)),
                       tracer_provider=provider).run("go")
    assert result.status.value == "done"
    assert sorted(exporter.names) == ["chat", "chat", "invoke_agent", "turn", "turn"]
    said = [entry for entry in logs if entry["event"] == "telemetry_failed"]
    assert [(e["where"], e["error"]) for e in said] == [("execute_tool span", "RuntimeError")]


@pytest.mark.parametrize("value", [HUGE, [[[[["deep"]]]]], float("nan"), "\ud800"],
                         ids=["huge-integer", "nested", "nan", "lone-surrogate"])
def test_hostile_tool_arguments_reach_the_file_as_json_every_decoder_reads(trace_file, value):
    result = Agent("claude-sonnet-5-5", tools=[echo], client=ScriptedModel(_script(value))).run("go")
    assert result.status.value == "done"
    lines = trace_file.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and all(json.loads(line) for line in lines)


def test_tool_arguments_nested_900_levels_run_with_the_scripted_model_as_with_the_real_client(trace_file):
    deep: list = ["deep"]
    for _ in range(900):
        deep = [deep]
    script = _script(deep)
    result = Agent("claude-sonnet-5-5", tools=[echo], client=ScriptedModel(script)).run("go")
    assert result.status.value == "done", result.error
    assert script[0]["content"][0]["input"]["n"] is deep  # the script itself is left as it was given
