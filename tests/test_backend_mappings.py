"""Each backend gets its attributes from its exporter: Langfuse's always, a collector's when it is asked for the
backend behind it (LOOPTRACE_OTLP_MAPPINGS), and an application's own processor when it wraps itself in the mapping.
And telemetry is built once, where an Agent is: its own pipeline on its first run, closed when it goes; runs join
a provider the application set after the Agent was built."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from fakes.otlp_receiver import OTLPReceiver, phoenix_view
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from looptrace import Agent, ScriptedModel, configure
from looptrace.cli.demo import DEMO_SYSTEM, DEMO_TASK, Inventory, equipment_script
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.export.mapped import MappedSpanProcessor, mappings_for
from looptrace.instrumentation.recording import semconv as sc
from looptrace.instrumentation.settings import ConfigurationError, Settings
from looptrace.instrumentation.tracefile.read import read_spans

PUBLIC, SECRET = "pk-lf-maps", "sk-lf-maps"
VENDOR_PREFIXES = ("langfuse.", "openinference.", "input.", "output.")


def story(**options) -> Agent:
    return Agent("claude-sonnet-5-5", tools=Inventory().tools(), system=DEMO_SYSTEM, alerts=Alerts(log_warnings=False),
                 client=ScriptedModel(equipment_script()), **options)


def collector_and_langfuse(tmp_path, otlp_mappings: str) -> tuple[dict, dict]:
    """One run sent to Langfuse and to a collector at once: the spans each received, by span id."""
    with OTLPReceiver(basic_auth=(PUBLIC, SECRET), path_prefix="/api/public/otel") as langfuse, \
            OTLPReceiver() as collector:
        settings = Settings.from_env({"LANGFUSE_PUBLIC_KEY": PUBLIC, "LANGFUSE_SECRET_KEY": SECRET,
                                      "LANGFUSE_BASE_URL": langfuse.base_url,
                                      "OTEL_EXPORTER_OTLP_ENDPOINT": collector.base_url,
                                      "OTEL_METRICS_EXPORTER": "none", "LOOPTRACE_OTLP_MAPPINGS": otlp_mappings})
        telemetry = configure(settings, exporters="langfuse,otlp", set_global=False,
                              undelivered_file=tmp_path / "undelivered.jsonl")
        try:
            story(telemetry=telemetry).run(DEMO_TASK, session_id="S-1", user_id="ana", tags=["demo"])
        finally:
            telemetry.shutdown()
        return ({s.span_id: s for s in langfuse.wait_for_spans(12)},
                {s.span_id: s for s in collector.wait_for_spans(12)})


def test_a_collector_forwarding_to_langfuse_gets_exactly_what_langfuse_gets(tmp_path):
    langfuse, collector = collector_and_langfuse(tmp_path, "langfuse")
    assert set(langfuse) == set(collector) and len(collector) == 12
    for span_id, span in langfuse.items():
        assert dict(collector[span_id].attributes) == dict(span.attributes), span.name


def test_a_collector_gets_the_conventions_alone_unless_it_asks(tmp_path):
    langfuse, collector = collector_and_langfuse(tmp_path, "")
    assert [key for s in collector.values() for key in s.attributes if key.startswith(VENDOR_PREFIXES)] == []
    assert all(any(key.startswith("langfuse.") for key in s.attributes) for s in langfuse.values())
    for span_id, span in collector.items():  # the rest is the same
        assert {k: v for k, v in langfuse[span_id].attributes.items() if not k.startswith(VENDOR_PREFIXES)
                and k not in (sc.USER_ID, sc.GEN_AI_SYSTEM_INSTRUCTIONS, sc.GEN_AI_TOOL_DEFINITIONS)
                } == {k: v for k, v in span.attributes.items() if k not in (sc.USER_ID, sc.GEN_AI_SYSTEM_INSTRUCTIONS,
                                                                           sc.GEN_AI_TOOL_DEFINITIONS)}


def test_a_collector_forwarding_to_phoenix_gets_openinferences_view_and_nothing_of_langfuses(tmp_path):
    _, collector = collector_and_langfuse(tmp_path, "openinference")
    assert not any(key.startswith("langfuse.") for s in collector.values() for key in s.attributes)
    kinds = sorted(phoenix_view(s).kind for s in collector.values())
    assert kinds == ["AGENT"] + ["CHAIN"] * 4 + ["LLM"] * 4 + ["TOOL"] * 3
    root = next(s for s in collector.values() if s.parent_span_id is None)
    assert phoenix_view(root).input[1] == DEMO_TASK


def test_an_unknown_mapping_is_a_configuration_error_naming_the_variable():
    with pytest.raises(ConfigurationError, match="LOOPTRACE_OTLP_MAPPINGS: unknown mapping 'phoenix'"):
        Settings.from_env({"LOOPTRACE_OTLP_MAPPINGS": "langfuse,phoenix"})
    assert Settings.from_env({"LOOPTRACE_OTLP_MAPPINGS": "none"}).otlp_mappings == ()


def test_an_applications_own_processor_gets_a_backends_attributes_by_wrapping_itself():
    provider = TracerProvider()
    plain, phoenix = InMemorySpanExporter(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(plain))
    provider.add_span_processor(MappedSpanProcessor(SimpleSpanProcessor(phoenix), mappings_for(["openinference"])))
    story(tracer_provider=provider).run(DEMO_TASK)
    assert not any(key.startswith(VENDOR_PREFIXES) for s in plain.get_finished_spans() for key in s.attributes)
    assert {s.attributes[sc.OPENINFERENCE_SPAN_KIND] for s in phoenix.get_finished_spans()} == {
        "AGENT", "CHAIN", "LLM", "TOOL"}


# --- telemetry built once, where the Agent is ----------------------------------------------------------------------


@pytest.fixture
def no_global_provider(monkeypatch, tmp_path) -> Path:
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    for name in [n for n in os.environ if n.startswith(("OTEL_", "LANGFUSE_", "LOOPTRACE_"))]:
        monkeypatch.delenv(name)
    path = tmp_path / "traces.jsonl"
    monkeypatch.setenv("LOOPTRACE_TRACE_FILE", str(path))
    return path


def open_descriptors_of(path: Path) -> int:
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            found += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_an_agents_own_pipeline_is_built_on_its_first_run_used_after_and_closed_when_the_agent_goes(no_global_provider):
    agent = story()
    assert not no_global_provider.exists()  # nothing opened before a run needs it
    agent.run(DEMO_TASK)
    provider = agent._tracing.providers[0]
    agent.run(DEMO_TASK)
    assert agent._tracing.providers[0] is provider and isinstance(provider, TracerProvider)
    assert open_descriptors_of(no_global_provider) == 1
    other = story()
    other.run(DEMO_TASK)
    assert other._tracing.providers[0] is not provider  # no table of pipelines shared by settings
    del agent, other
    gc.collect()
    for _ in range(200):  # closed on a thread of its own
        if open_descriptors_of(no_global_provider) == 0:
            break
        import time

        time.sleep(0.01)
    assert open_descriptors_of(no_global_provider) == 0
    assert len({r.trace_id for r in read_spans(no_global_provider)}) == 3


def test_runs_join_a_provider_the_application_set_after_the_agent_was_built(no_global_provider):
    agent = story()
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)  # the application sets up its SDK after building its agents
    result = agent.run(DEMO_TASK)
    assert {format(s.context.trace_id, "032x") for s in memory.get_finished_spans()} == {result.trace_id}
    assert not no_global_provider.exists()  # nothing of the Agent's own
