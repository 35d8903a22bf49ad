"""The README's guard examples run as written, on the frameworks' offline model stand-ins (``model`` and ``tools``
are the reader's; here a scripted loop of identical failing calls), with the telemetry the environment gives: the
local trace file, which `looptrace detect` then reads and judges as the guard did live."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("langchain.agents")
pytest.importorskip("agents")
pytest.importorskip("claude_agent_sdk")

import guard_scenarios as gs
from agents import ToolOutputGuardrailTripwireTriggered, function_tool
from test_guard_langchain import langchain_tools, scripted_model
from test_guard_openai_agents import ScriptedModel

from looptrace.cli.entry import main

SECTION = Path(__file__).parent.parent.joinpath("README.md").read_text(encoding="utf-8").split(
    "## Loop guards in LangChain", 1)[1].split("\n## ", 1)[0]
LANGCHAIN, OPENAI_AGENTS, CLAUDE = re.findall(r"```python\n(.*?)```", SECTION, re.S)


@pytest.fixture
def trace_file(workdir, monkeypatch) -> Path:
    """A trace file of this test's own (an Agent given no provider has a pipeline of its own). The Agents SDK's own
    tracing, which would post to OpenAI, is off."""
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    # No global tracer provider left by an earlier test: the example writes through its Agent's own pipeline.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    path = workdir / "traces.jsonl"
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(path))
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    return path


def detected(capsys, trace_file: Path) -> list[tuple[str, int]]:
    capsys.readouterr()
    assert main(["detect", "--json", str(trace_file)]) in (0, 1)
    out = capsys.readouterr().out
    return [(a["type"], a["turn"]) for line in out.splitlines() if line.strip()
            for a in json.loads(line).get("anomalies", [])]


def statuses(trace_file: Path) -> list[str]:
    """The run statuses the trace file's invoke_agent spans carry."""
    found = []
    for line in trace_file.read_text(encoding="utf-8").splitlines():
        for resource in json.loads(line).get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    for attribute in span.get("attributes", []):
                        if attribute["key"] == "looptrace.run.status":
                            found.append(attribute["value"]["stringValue"])
    return found


def test_the_langchain_example_stops_the_loop_and_detect_agrees(trace_file, capsys):
    namespace = {"model": scripted_model(gs.FAILING_LOOP), "tools": langchain_tools(gs.FAILING_LOOP)}
    exec(LANGCHAIN, namespace)
    # The example's policy stops cycles only: this loop is nudged at turn 3 and stopped at 4, as by default.
    assert detected(capsys, trace_file) == [("repeated_call", 4)]
    assert statuses(trace_file) == ["stopped_by_detector"]


def test_the_openai_agents_example_trips_the_wire_and_detect_agrees(trace_file, capsys):
    namespace = {"model": ScriptedModel(gs.FAILING_LOOP),
                 "tools": [function_tool(f) for f in gs.FAILING_LOOP.tools().values()]}
    with pytest.raises(ToolOutputGuardrailTripwireTriggered):
        exec(OPENAI_AGENTS, namespace)
    assert detected(capsys, trace_file) == [("repeated_call", 4)]
    assert statuses(trace_file) == ["stopped_by_detector"]


def test_the_docs_page_shows_the_same_examples():
    docs = Path(__file__).parent.parent.joinpath("docs", "guards.md").read_text(encoding="utf-8")
    assert re.findall(r"```python\n(.*?)```", docs, re.S) == [LANGCHAIN, OPENAI_AGENTS, CLAUDE]


def test_the_claude_agent_sdk_example_compiles():
    # Running it needs Claude Code: test_guard_claude_agent.py runs the CLI against the Messages-API fake (slow).
    compile(CLAUDE, "README.md", "exec")
