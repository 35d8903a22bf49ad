"""The structure a newcomer relies on: names in one place, the detector free of OpenTelemetry, one narrow interface
between the loop and telemetry."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from looptrace import Agent, ScriptedModel, tool
from looptrace.instrumentation import interface

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [*(ROOT / "instrumentation").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")]  # packages included


def test_every_emitted_name_is_defined_in_semconv():
    name = re.compile(r"""["']((?:looptrace|langfuse|gen_ai)\.[a-z_]+(?:\.[a-z_]+)*\.?)["']""")
    # readers.py reads other producers' names (legacy gen_ai.prompt.*, langfuse.session.id): not ours to emit.
    found = {path.name: name.findall(path.read_text(encoding="utf-8"))
             for path in PRODUCT if path.name not in ("semconv.py", "readers.py")}
    assert {file: names for file, names in found.items() if names} == {}


def test_the_detector_works_where_opentelemetry_is_not_installed():
    code = textwrap.dedent("""
        import sys

        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
        from looptrace.instrumentation.detector import LoopDetector, ToolCall
        from looptrace import LoopDetector as Same

        detector = LoopDetector()
        found = []
        for turn in range(1, 6):
            detector.observe(ToolCall(turn=turn, tool="search", arguments={"q": "x"}, call_id=f"c{turn}",
                                      is_error=False, result="same"))
            found += detector.end_turn(turn)
        print(Same is LoopDetector, sorted({a.type for a in found}))
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, loaded = done.stdout.splitlines()
    assert first == "True ['repeated_call']" and loaded == "[]"


def test_agent_py_talks_to_telemetry_only_through_the_interface():
    source = (ROOT / "runtime" / "agent.py").read_text(encoding="utf-8")
    imported = set(re.findall(r"from looptrace\.instrumentation\.(\w+) import", source))
    assert "spans" not in imported or "import Tracing" in source  # spans only as the implementation behind it
    assert re.findall(r"\b\w+\._(?!_)\w+", _without_self(source)) == []  # no private attribute of another object


def _without_self(source: str) -> str:
    return re.sub(r"\b(self|cls|run|call|agent)\._\w+", "", re.sub(r'""".*?"""|#.*', "", source, flags=re.S))


def test_telemetry_off_is_the_no_op_implementation_and_still_redacts_arguments(spans):
    seen = []

    @tool
    def login(user: str, password: str) -> str:
        """Logs in."""
        return "ok"

    agent = Agent("claude-sonnet-5-5", tools=[login], telemetry=False, tracer_provider=spans.provider,
                  on_event=seen.append, client=ScriptedModel([
                      {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "login",
                                                               "input": {"user": "ana", "password": "hunter2"}}]},
                      {"stop_reason": "end_turn", "content": [{"type": "text", "text": "in"}]}]))
    result = agent.run("log in")
    assert result.status.value == "done" and result.trace_id == "0" * 32
    assert spans.all == []
    tool_events = [e for e in seen if type(e).__name__ == "ToolFinished"]
    assert "hunter2" not in repr(tool_events) and "ana" in repr(tool_events)
    assert isinstance(agent._tracing, interface.NoTracing)


def test_delivery_does_not_import_the_spill_file_and_spill_imports_delivery_one_way():
    code = ("import sys\nimport looptrace.instrumentation.delivery\n"
            "print('looptrace.instrumentation.tracefile.spill' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_the_span_detection_modules_import_one_way():
    # trace_detect offers the live processor, so the processor and the rebuilder it shares with `looptrace detect`
    # must not import trace_detect back.
    imported = {name: set(re.findall(r"from \.(\w+) import", (ROOT / "instrumentation" / f"{name}.py").read_text()))
                for name in ("trace_detect", "trace_detect_live", "run_rebuilder")}
    assert {"run_rebuilder", "trace_detect_live"} <= imported["trace_detect"]
    assert "run_rebuilder" in imported["trace_detect_live"]
    assert "trace_detect" not in imported["trace_detect_live"] | imported["run_rebuilder"]
    assert "trace_detect_live" not in imported["run_rebuilder"]


def test_the_trace_file_format_and_the_direct_path_read_no_environment():
    # Their settings come from the entry points (configure(), the CLI) as values or a Settings, never from here.
    modules = [*(ROOT / "instrumentation" / "tracefile").glob("*.py"), ROOT / "instrumentation" / "direct_spans.py"]
    for path in modules:
        code = re.sub(r'""".*?"""|#.*', "", path.read_text(encoding="utf-8"), flags=re.S)
        assert re.findall(r"\benviron\b|\bgetenv\b|\bfrom_env\b", code) == [], path.name


def test_no_private_opentelemetry_name_is_imported():
    # The semantic-conventions package publishes the GenAI names (still incubating) only under `_incubating`.
    found = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opentelemetry"):
                imported = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [(alias.name, "") for alias in node.names if alias.name.startswith("opentelemetry")]
            else:
                continue
            for module, name in imported:
                if module.startswith("opentelemetry.semconv._incubating."):
                    continue
                if any(part.startswith("_") for part in [*module.split("."), name]):
                    found.append(f"{path.name}:{node.lineno}: {module} {name}".strip())
    assert found == []
