"""looptrace as a library: traced by default, joining a host application's OpenTelemetry without hijacking it.

Whether a global provider is set is process-wide (and can be set once), so these tests run their application in a
subprocess of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakes.messages_api import FakeMessagesAPI

from looptrace.instrumentation.tracefile.read import read_spans

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def run_python(code: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
               ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("LOOPTRACE_", "LANGFUSE_", "OTEL_", "TRACEPARENT"))}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**clean, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def readme_python_example() -> str:
    section = README.split("## The Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


HOST_APP = """
import json, logging, sys
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from looptrace import Agent, ScriptedModel, configure, tool

exporter = InMemorySpanExporter()
app_provider = TracerProvider(resource=Resource.create({"service.name": "host-app"}))
app_provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(app_provider)
tracer = trace.get_tracer("host-app")

@tool
def lookup(q: str) -> str:
    '''Looks something up.'''
    return "found " + q

def agent():
    return Agent("claude-sonnet-5-5", tools=[lookup], client=ScriptedModel([
        {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "x"}}]},
        {"stop_reason": "end_turn", "content": [{"type": "text", "text": "done"}]}]))

def request(name):
    with tracer.start_as_current_span(name) as span:
        result = agent().run("find x")
    return span, result

MODE = sys.argv[1] if len(sys.argv) > 1 else ""
"""


def host_spans_report() -> str:
    return """
def describe(request_span):
    mine = [s for s in exporter.get_finished_spans() if s.context.trace_id == request_span.context.trace_id]
    root = next(s for s in mine if s.name.startswith("invoke_agent"))
    return {"count": len(mine), "root_parent": root.parent.span_id if root.parent else None,
            "request": request_span.context.span_id, "services": sorted({s.resource.attributes["service.name"] for s in mine})}
"""


@pytest.mark.slow
def test_runs_join_the_host_applications_provider_and_add_nothing(tmp_path):
    code = HOST_APP + host_spans_report() + """
span, result = request("GET /book")
print(json.dumps({"first": describe(span), "global_kept": trace.get_tracer_provider() is app_provider,
                  "trace_id_matches": result.trace_id == format(span.get_span_context().trace_id, "032x")}))
"""
    done = run_python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first = report["first"]
    assert first["count"] == 1 + 6  # the request, then invoke_agent, two turns, two chats and one tool call
    assert first["root_parent"] == first["request"]  # the run is a child of the host's request span
    assert first["services"] == ["host-app"]  # the host's resource
    assert report["global_kept"] and report["trace_id_matches"]
    assert not (tmp_path / ".looptrace").exists()  # nothing added unasked: no file of looptrace's own
    assert done.stderr == ""


@pytest.mark.slow
def test_configure_with_the_hosts_provider_adds_looptraces_exporters_to_it(tmp_path):
    code = HOST_APP + host_spans_report() + """
telemetry = configure(tracer_provider=app_provider, exporters="file", trace_file="ours.jsonl")
span, result = request("GET /book")
telemetry.flush()
print(json.dumps({"run": describe(span), "trace_id": result.trace_id,
                  "global_kept": trace.get_tracer_provider() is app_provider,
                  "same_provider": telemetry.tracer_provider is app_provider}))
"""
    done = run_python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["run"]["count"] == 7 and report["run"]["root_parent"] == report["run"]["request"]
    assert report["global_kept"] and report["same_provider"]
    in_file = [s for s in read_spans(tmp_path / "ours.jsonl") if s.trace_id == report["trace_id"]]
    assert sorted(s.name for s in in_file if s.name.startswith("invoke_agent")) == ["invoke_agent agent"]
    assert len(in_file) == 7  # the host's request span too: looptrace's file sees the whole request


@pytest.mark.slow
def test_configure_never_replaces_a_global_provider_and_says_so_once(tmp_path):
    code = HOST_APP + """
logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s %(message)s")
first = configure(exporters="file", trace_file="ours.jsonl")
second = configure(exporters="file", trace_file="ours.jsonl")
print(json.dumps({"global_kept": trace.get_tracer_provider() is app_provider,
                  "own": first.tracer_provider is not app_provider}))
"""
    done = run_python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"global_kept": True, "own": True}
    assert done.stderr.count("global_tracer_provider_kept") == 1, done.stderr
    assert "configure(tracer_provider=" in done.stderr
    assert "Overriding of current TracerProvider" not in done.stderr


@pytest.mark.slow
def test_the_readme_python_example_run_verbatim_leaves_a_trace_traces_show_renders(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_python_example(), encoding="utf-8")
    answers = [
        {"stop_reason": "tool_use", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "reserve_equipment",
             "input": {"item_id": "EQ-001", "date": "2026-10-08"}}]},
        {"stop_reason": "end_turn", "content": "Reserved EQ-001 for 2026-10-08."},
    ]
    with FakeMessagesAPI(answers) as fake:
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "test-key"}
        done = run_python(f"exec(open({str(script)!r}).read())", tmp_path, env)
    assert done.returncode == 0, done.stderr
    status, turns, tokens, cost, trace_id, error = done.stdout.split()
    assert (status, error) == ("done", "None") and set(trace_id) != {"0"}, done.stdout
    shown = subprocess.run([sys.executable, "-m", "looptrace", "traces", "show"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"trace {trace_id}" in shown.stdout
    assert "execute_tool reserve_equipment" in shown.stdout


@pytest.mark.slow
def test_the_readme_python_example_without_an_api_key_says_why_on_stderr(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_python_example(), encoding="utf-8")
    with FakeMessagesAPI([]) as fake:
        env = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "", "ANTHROPIC_AUTH_TOKEN": ""}
        done = run_python(f"exec(open({str(script)!r}).read())", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("error 0 0 0.0 "), done.stdout
    assert "authentication" in done.stdout.lower()  # result.error, printed by the example
    [said] = [line for line in done.stderr.splitlines() if "model_call_failed" in line]
    assert "ANTHROPIC_API_KEY" in said and "status='error'" in said


@pytest.mark.slow
def test_telemetry_switched_off_by_the_environment_writes_nothing(tmp_path):
    code = """
from looptrace import Agent, ScriptedModel
result = Agent("claude-sonnet-5-5", client=ScriptedModel([{"stop_reason": "end_turn", "content": "ok"}])).run("hi")
print(result.status.value, result.trace_id)
"""
    done = run_python(code, tmp_path, {"OTEL_SDK_DISABLED": "true"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["done", "0" * 32]
    assert not (tmp_path / ".looptrace").exists()


@pytest.mark.slow
def test_a_regular_install_ships_one_package_and_ignores_a_users_runtime_and_instrumentation(tmp_path):
    source = tmp_path / "checkout"  # a copy: pip builds in the source tree, and this one must stay clean
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", ".looptrace", ".venv",
                                                                "__pycache__", ".pytest_cache", ".hypothesis"))
    target = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                            str(target), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    top_level = sorted(p.name for p in target.iterdir() if p.name != "bin")
    assert [n for n in top_level if not n.endswith(".dist-info")] == ["looptrace"]
    assert (target / "looptrace" / "py.typed").exists()
    assert (target / "looptrace" / "runtime" / "agent.py").exists()

    app = tmp_path / "app"
    (app / "instrumentation").mkdir(parents=True)
    (app / "runtime.py").write_text("raise ImportError('the user runtime.py was imported')\n")
    (app / "instrumentation" / "__init__.py").write_text("raise ImportError('the user instrumentation was imported')\n")
    (app / "main.py").write_text(textwrap.dedent("""
        import looptrace
        from looptrace import Agent, ScriptedModel
        result = Agent("claude-sonnet-5-5", client=ScriptedModel([{"stop_reason": "end_turn", "content": "ok"}]),
                       telemetry=False).run("hi")
        print(looptrace.__file__, result.status.value)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPTRACE_", "OTEL_"))}
    env["PYTHONPATH"] = str(target)  # ahead of the development checkout's editable finder
    done = subprocess.run([sys.executable, "main.py"], cwd=app, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    where, status = done.stdout.split()
    assert Path(where).is_relative_to(target) and status == "done"


@pytest.mark.slow
def test_the_readmes_testing_example_passes_under_the_installed_plugin(tmp_path):
    section = README.split("## Testing your agent", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "test_my_agent.py").write_text(example, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_agent.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_testing_helpers_say_what_went_wrong(scripted_agent):
    from looptrace import tool
    from looptrace.testing import assert_no_anomalies, assert_tool_called, final_answer, tool_use

    @tool
    def search(q: str) -> str:
        """Searches."""
        return "same"

    agent = scripted_agent([tool_use("search", {"q": "x"})] * 4 + [final_answer("done")], tools=[search],
                           on_anomaly="warn")
    result = agent.run("look")
    assert_tool_called(result, "search", q="x")
    with pytest.raises(AssertionError, match=r"expected a call to search\(q='y'\); the run made \[search"):
        assert_tool_called(result, "search", q="y")
    with pytest.raises(AssertionError, match="expected no loop anomalies, found"):
        assert_no_anomalies(result)
